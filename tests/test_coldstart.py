"""Cold start: what a fresh process imports for ``import sparsefill`` and the first call of
every op family.  No timing assertions: the figures come from ``tools/coldstart.py``; these tests check the
causes -- no heavy optional module (sympy, numba, scipy, torch._dynamo, pandas, pydata sparse) is imported
where a cheaper path exists, and numba's kernels are loaded only once the work pays for them, from a cache.

torch itself imports ``torch.distributed.tensor`` (and with it sympy: 1-2.5 s) on the first ``__torch_dispatch__``
of any tensor subclass (its C++ DTensor fast path resolves the DTensor class, importing the module, before it
looks at the arguments: a bare wrapper subclass pays it too, ``tools/coldstart.py``'s peer case): the tests of
dispatched ops preload it, as torch would, and check everything else.
"""

import os
import subprocess
import sys

import pytest

from sparsefill import segment

HEAVY = ("sympy", "numba", "llvmlite", "scipy", "torch._dynamo", "pandas", "sparse")


def _run(code: str, **env) -> str:
    """Run ``code`` in a fresh interpreter (no SPARSEFILL_SEGMENT_BACKEND); its stdout, after a clean exit."""
    e = {k: v for k, v in os.environ.items() if k != "SPARSEFILL_SEGMENT_BACKEND"}
    e.update(env)
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _loaded(mods) -> str:
    return f"print(sorted(m for m in {tuple(mods)!r} if m in sys.modules))\n"


_FIRST_CALLS = (
    "A = sparsefill.sparse_coo_tensor([[0, 1, 1, 3], [2, 0, 3, 1]], [1., 2., 3., 4.], (4, 5), fill_value=0.5)\n"
    "A * 2 + A; A.sum(1); A.cumsum(0); A @ torch.randn(5, 3); masked.sum(A, 1, mask=torch.rand(4, 5) > 0.5)\n"
    "segment.reduce(torch.randn(10, 3), 'sum', lengths=torch.tensor([4, 6]))\n"
)


def test_import_and_first_call_of_every_family_load_only_sparsefill_beyond_torch():
    """``import sparsefill`` plus the first call of each family (constructor, element-wise, reduction, scan,
    product, masked, segment) in a fresh process loads no module beyond what ``import torch`` and torch's
    first dispatch load (``torch.distributed.tensor``, preloaded) but sparsefill's own and the standard
    library's: no torch submodule, no optional dependency, so no heavy import and no compilation (numba,
    dynamo, Python meta kernels) on the way.  A second round of the same calls loads no module at all:
    nothing is paid again that the first calls paid once.
    (The times themselves: ``tools/coldstart.py``, about a tenth of ``import torch``.)"""
    new = "print(sorted(m for m in set(sys.modules) - seen if m.split('.')[0] not in ok))\n"
    code = (
        "import sys\nimport torch\nimport torch.distributed.tensor\n"
        "ok = {'sparsefill', *sys.stdlib_module_names}\nseen = set(sys.modules)\n"
        "import sparsefill\nfrom sparsefill import masked, segment\n"
        + new
        + "seen = set(sys.modules)\n"
        + _FIRST_CALLS
        + new
        + "seen = set(sys.modules); ok = set()\n"
        + _FIRST_CALLS
        + new
    )
    assert _run(code).splitlines() == ["[]", "[]", "[]"]


def test_import_and_undispatched_first_calls_load_nothing_heavy():
    """Constructors, conversions, segment ops and KeyedJaggedBatch on small inputs: none of the heavy modules
    (the first constructor imported sympy through torch.broadcast_shapes; the first segment op numba)."""
    code = (
        "import sys, torch\n"
        "import sparsefill\n"
        "from sparsefill import segment\n"
        + _loaded((*HEAVY, "torch.distributed.tensor"))
        + "A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1., 2.], (2, 3), fill_value=0.5)\n"
        "H = sparsefill.sparse_coo_tensor([[0, 1]], torch.ones(2, 3), (2, 3), fill_value=torch.zeros(3))\n"
        "C = sparsefill.sparse_csr_tensor([0, 1, 2], [1, 0], [3., 4.], (2, 2), fill_value=-1.)\n"
        "D = sparsefill.to_sparse(torch.tensor([[0., 1.], [2., 0.]]))\n"
        "F = sparsefill.full((3, 4), 2.)\n"
        "x = torch.randn(100, 8); L = torch.tensor([30, 0, 50, 20]); ids = torch.randint(0, 4, (100,))\n"
        "for r in ('sum', 'mean', 'max', 'min', 'logsumexp'):\n"
        "    segment.reduce(x, r, lengths=L)\n"
        "    segment.reduce(x, r, segment_ids=ids, num_segments=4, sorted=False)\n"
        "segment.sparse_lengths_sum(x, torch.randint(0, 100, (60,)), torch.tensor([20, 40]))\n"
        "kj = segment.KeyedJaggedBatch.from_lists([{1: [10, 11], 3: [101]}, {1: [11], 2: [50]}])\n"
        "kj.to_dict(); kj.pooled(torch.randn(200, 4), 'max'); kj.select_keys([3, 1])\n"
        + _loaded((*HEAVY, "torch.distributed.tensor"))
    )
    assert _run(code).splitlines() == ["[]", "[]"]


def test_first_op_of_every_family_loads_nothing_heavy():
    """The first call of each op family on SparseTensors (element-wise, reductions, scans, softmax, matmul,
    indexing, masked) loads no heavy module beyond what torch's first dispatch loads (sympy included); the
    sparse optimizer step adds only torch.optim's own torch._dynamo (torch.optim.Adagrad loads it too).
    (The first scan and log_softmax imported torch._dynamo through their meta kernels.)"""
    code = (
        "import sys, torch\n"
        "import torch.distributed.tensor  # what torch imports on the first __torch_dispatch__ of any subclass\n"
        "import sparsefill\n"
        "from sparsefill import segment\n"
        "A = sparsefill.sparse_coo_tensor([[0, 1, 1, 3], [2, 0, 3, 1]], [1., 2., 3., 4.], (4, 5), fill_value=0.5)\n"
        "C = sparsefill.sparse_csr_tensor([0, 1, 2], [1, 0], [3., 4.], (2, 2), fill_value=-1.)\n"
        "m = torch.rand(4, 5) > 0.5\n"
        "torch.exp(A) + A; A * 2; A.sum(); A.sum(1); A.amax(0); torch.cumsum(A, 1); torch.cumsum(A, 0)\n"
        "torch.softmax(A, 1); torch.log_softmax(A, 0); A @ torch.randn(5, 3); C @ torch.randn(2, 3)\n"
        "A[torch.tensor([0, 3])]; A[1:3]; A.t(); A.reshape(5, 4); A.to_dense(); C.sum(1)\n"
        "sparsefill.masked.sum(A, 1, mask=m); sparsefill.masked.softmax(A, 1, mask=m); sparsefill.masked.amax(A, 0)\n"
        + _loaded(m for m in HEAVY if m != "sympy")
        + "w = torch.nn.Parameter(torch.randn(100, 8)); opt = segment.SparseAdagrad([w], lr=0.1)\n"
        "w.grad = torch.sparse_coo_tensor(torch.tensor([[1, 5, 5]]), torch.randn(3, 8), (100, 8))\n"
        "opt.step()\n" + _loaded(m for m in HEAVY if m not in ("sympy", "torch._dynamo"))
    )
    assert _run(code).splitlines() == ["[]", "[]"]


# (family, setup, first call): the families whose shape inference ran torch's Python meta kernels (reductions by
# torch._refs, mv/addmm/addmv/addr/dot by torch._decomp, cat/stack/roll/tril), whose first call imports torch._dynamo
_META_FAMILIES = [
    ("mean", "", "A.mean(1); A.mean()"),
    ("std/var", "", "A.std(1); A.var(0, keepdim=True); torch.std_mean(A, 1)"),
    (
        "norm",
        "",
        "A.norm(); torch.linalg.vector_norm(A, 0, 1); torch.linalg.vector_norm(A, 3., (0, 1), True)",
    ),
    ("logsumexp", "", "torch.logsumexp(A, 1)"),
    ("all/any/count_nonzero", "", "A.all(1); A.any(); torch.count_nonzero(A, 0)"),
    ("CSR @ vector", "v = torch.randn(5)", "C @ v; torch.mv(C, v)"),
    ("vector @ matrix", "v = torch.randn(4)", "v @ A; torch.matmul(A, torch.randn(5))"),
    (
        "addmm",
        "b = torch.randn(4, 3); x = torch.randn(5, 3)",
        "torch.addmm(b, A, x); torch.addmm(b, C, x)",
    ),
    (
        "addmv/addr/dot",
        "v = torch.randn(5)",
        "torch.addmv(torch.randn(4), A, v); torch.addr(A, torch.randn(4), v); torch.dot(A[0], v)",
    ),
    ("cat", "", "torch.cat([A, A]); torch.cat([A, A], 1); torch.cat([C, C])"),
    ("stack", "", "torch.stack([A, A]); torch.stack([A, A.to_dense()], 2)"),
    ("roll", "", "torch.roll(A, 1, 0); torch.roll(A, (1, 2), (0, 1)); torch.roll(A, 3)"),
    ("tril/triu", "", "torch.tril(A); torch.triu(A, 1)"),
]


@pytest.fixture(scope="module")
def meta_family_imports_dynamo():
    """``{family: whether its first call imported torch._dynamo}``, each family's call in a fresh process.

    One interpreter imports torch and sparsefill, then forks a child per family (the child starts from the
    state right after the imports, as a fresh process after the same imports would): the import is paid
    once, not once per family."""
    code = (
        "import os, sys, torch\n"
        "import torch.distributed.tensor  # what torch imports on the first __torch_dispatch__ of any subclass\n"
        "import sparsefill\n"
        "import warnings; warnings.simplefilter('ignore')\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        f"FAMILIES = {[(f, s, c) for f, s, c in _META_FAMILIES]!r}\n"
        "for family, setup, call in FAMILIES:\n"
        "    sys.stdout.flush()  # (a child that fails exits by the interpreter: no line twice)\n"
        "    r, w = os.pipe()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.close(r)\n"
        "        A = sparsefill.sparse_coo_tensor([[0, 1, 1, 3], [2, 0, 3, 1]], [1., 2., 3., 4.], (4, 5), fill_value=0.5)\n"
        "        C = sparsefill.sparse_csr_tensor([0, 1, 2, 2, 3], [1, 0, 4], [3., 4., 5.], (4, 5), fill_value=-1.)\n"
        "        exec(setup + '\\n' + call)\n"
        "        os.write(w, str('torch._dynamo' in sys.modules).encode())\n"
        "        os._exit(0)\n"
        "    os.close(w)\n"
        "    out = os.read(r, 16).decode()\n"
        "    os.close(r)\n"
        "    _, status = os.waitpid(pid, 0)\n"
        "    print(family, '|', out if os.waitstatus_to_exitcode(status) == 0 else 'child failed')\n"
    )
    return dict(line.split(" | ") for line in _run(code).splitlines())


@pytest.mark.parametrize("family,setup,call", _META_FAMILIES, ids=[f[0] for f in _META_FAMILIES])
def test_first_call_of_a_meta_family_does_not_import_dynamo(
    family, setup, call, meta_family_imports_dynamo
):
    """Each family's first call in a fresh process runs no Python meta kernel: ``torch._dynamo`` (0.4-0.5 s) is
    not imported (shape inference from one-element tensors and shape arithmetic, ``ops/fallback.py``)."""
    assert meta_family_imports_dynamo[family] == "False"


@pytest.mark.skipif(
    not segment.compiled_available(), reason="needs numba (the compiled backend)"
)  # reported by -rs
def test_auto_backend_imports_numba_once_the_work_pays():
    """'auto': torch ops until COMPILED_AFTER_WORK elements of work have come (counted over calls), then
    numba, once, for every later call; the same values either way."""
    code = (
        "import sys, torch\n"
        "from sparsefill import segment\n"
        "from sparsefill._kernels import segment as _kernels\n"
        "_kernels.COMPILED_AFTER_WORK = 5000\n"
        "x = torch.randn(100, 8, dtype=torch.float64); ids = torch.randint(0, 7, (100,))\n"
        "out = [segment.reduce(x, 'max', segment_ids=ids, sorted=False) for _ in range(6)]  # 6 x 800 < 5000\n"
        "print('numba' in sys.modules, _kernels.compiled_for('cpu'))\n"
        "out.append(segment.reduce(x, 'max', segment_ids=ids, sorted=False))  # 5600: numba from this call\n"
        "print('numba' in sys.modules, _kernels.compiled_for('cpu'))\n"
        "out.append(segment.reduce(x[:2], 'max', lengths=torch.tensor([2])))\n"
        "with segment.use_backend('torch'):\n"
        "    ref = segment.reduce(x, 'max', segment_ids=ids, sorted=False)\n"
        "print(all(torch.equal(o, ref) for o in out[:-1]), torch.equal(out[-1][0], x[:2].amax(0)))\n"
    )
    assert _run(code).splitlines() == ["False False", "True True", "True True"]


@pytest.mark.skipif(
    not segment.compiled_available(), reason="needs numba (the compiled backend)"
)  # reported by -rs
def test_kernels_are_cached_in_the_user_cache_dir_when_the_package_is_read_only(tmp_path):
    """numba caches next to the module where it can write, else in $XDG_CACHE_HOME/numba (or
    $NUMBA_CACHE_DIR): a second process loads the kernels from there (cache hits, no compilation).
    (A read-only package is simulated by disabling numba's in-tree cache locator: the tests run as root.)"""
    code = (
        "import numba.core.caching as c\n"
        "c.InTreeCacheLocator.from_function = classmethod(lambda cls, f, p: None)  # the package is read-only\n"
        "import torch\n"
        "from sparsefill import segment\n"
        "from sparsefill._kernels import segment_numba as nb\n"
        "segment.set_backend('numba')\n"
        "segment.reduce(torch.randn(10, 3), 'max', lengths=torch.tensor([4, 6]))\n"
        "for k in (nb.offsets_of, nb.kernel('sorted', 'max', False, 0)):\n"
        "    s = k.stats\n"
        "    print(s.cache_path.startswith(sys_path), sum(s.cache_hits.values()), sum(s.cache_misses.values()))\n"
    )
    code = f"sys_path = {str(tmp_path / 'numba')!r}\n" + code
    env = dict(
        XDG_CACHE_HOME=str(tmp_path), NUMBA_CACHE_DIR=""
    )  # (empty: numba's own override unset)
    assert _run(code, **env).splitlines() == [
        "True 0 1",
        "True 0 1",
    ]  # compiled once, written there
    assert _run(code, **env).splitlines() == ["True 1 0", "True 1 0"]  # loaded
