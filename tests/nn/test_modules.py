"""nn.Module conversions, shared memory and processes with SparseTensor parameters and buffers.

Every ``nn.Module`` path is run on a module with SparseTensor parameter and buffer and on its dense
twin (the same tensors densified); after it, with and without
``torch.__future__.set_swap_module_params_on_conversion(True)``::

    m.p.to_dense() == twin.p        m.p.dtype == twin.p.dtype (values and fill)        grads alike
    a write to m.p reaches the tensor m.p was made from exactly when it does for the twin
    state_dict / load_state_dict (strict, assign=True) work after
"""

import copy
import pickle
import warnings

import pytest
import torch
import torch.multiprocessing as mp

import sparsefill
from sparsefill import SparseTensor
import io
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close


def _coo():
    return sparsefill.sparse_coo_tensor(
        [[0, 1, 1], [2, 0, 1]], [1.0, 2.0, -3.0], (2, 3), fill_value=0.5
    )


def _csr():
    return _coo().to_sparse_csr()


def _hybrid():
    return sparsefill.sparse_coo_tensor(
        [[0, 2]], [[1.0, 2.0], [3.0, 4.0]], (3, 2), fill_value=torch.tensor([5.0, 6.0])
    )


def _indefinite():
    return sparsefill.sparse_coo_tensor(
        [[0, 2], [1, 1]], [1.0, 2.0], (3, 2), fill_value=sparsefill.indefinite
    )


MAKERS = {"coo": _coo, "csr": _csr, "hybrid": _hybrid, "indefinite": _indefinite}


def _dense(A):
    return A.to_dense(fill_value=0.0) if A.is_fill_indefinite() else A.to_dense()


PATHS = {
    "cpu": lambda m: m.cpu(),
    "to_cpu": lambda m: m.to("cpu"),
    "float": lambda m: m.float(),
    "to_float32": lambda m: m.to(torch.float32),
    "double": lambda m: m.double(),
    "to_float64": lambda m: m.to(torch.float64),
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "type": lambda m: m.type(torch.float64),
    "share_memory": lambda m: m.share_memory(),
    "to_empty": lambda m: m.to_empty(device="cpu"),
    "requires_grad_": lambda m: m.requires_grad_(False),
    "zero_grad": lambda m: m.zero_grad(),
    "zero_grad_keep": lambda m: m.zero_grad(set_to_none=False),
    "zero_grad_keep_foreach": lambda m: torch.optim.SGD(
        m.parameters(), lr=0.1, foreach=True
    ).zero_grad(False),
}


@pytest.fixture(params=[False, True], ids=["set_data", "swap"])
def swap(request):
    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(request.param)
    yield request.param
    torch.__future__.set_swap_module_params_on_conversion(old)


def _modules(kind):
    """``(m, twin, A, Ad)``: m has Parameter(A) and a buffer, twin the dense equivalents; both have grads."""
    A, B = MAKERS[kind](), MAKERS[kind]() * 2.0
    Ad, Bd = _dense(A), _dense(B)
    m, twin = torch.nn.Module(), torch.nn.Module()
    m.p, twin.p = torch.nn.Parameter(A), torch.nn.Parameter(Ad)
    m.register_buffer("b", B)
    twin.register_buffer("b", Bd)
    N = sparsefill.to_sparse(
        torch.tensor([[0, 3, 0], [7, 0, 0]]), layout=A.sparse_layout
    )  # .float() skips it
    m.register_buffer("n", N)
    twin.register_buffer("n", N.to_dense())
    if kind != "indefinite":
        G = A.detach() * 0.0 + 0.25  # a SparseTensor gradient (A's pattern, fill 0.25)
        (m.p * 3.0).backward(G)
        (twin.p * 3.0).backward(G.to_dense())
        assert isinstance(m.p.grad, SparseTensor)
    return m, twin, A, Ad


def _check_tensor(S, D, values=True):
    assert isinstance(S, SparseTensor) and S.shape == D.shape
    assert S.dtype == D.dtype == S._vals.dtype == S._fill.dtype
    assert S.requires_grad == D.requires_grad
    repr(S)
    if values:
        torch.testing.assert_close(_dense(S.detach()), D.detach(), equal_nan=True)


@pytest.mark.parametrize("kind", list(MAKERS))
@pytest.mark.parametrize("path", list(PATHS))
def test_module_paths_match_the_dense_module(path, kind, swap):
    m, twin, A, Ad = _modules(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        out = PATHS[path](m)
    assert PATHS[path](twin) is (None if out is None else twin)
    assert out is None or out is m
    init = path != "to_empty"  # (uninitialised memory)
    assert isinstance(m.p, torch.nn.Parameter) and isinstance(twin.p, torch.nn.Parameter)
    _check_tensor(m.p, twin.p, init)
    _check_tensor(m.b, twin.b, init)
    _check_tensor(m.n, twin.n, init)
    if path == "share_memory":
        assert m.p.is_shared() and m.b.is_shared() and m.n.is_shared() and twin.p.is_shared()
    if twin.p.grad is None:
        assert m.p.grad is None
    else:
        _check_tensor(m.p.grad, twin.p.grad, init)
    with torch.no_grad():  # the link between m.p and A is the one between twin.p and Ad
        m.p.mul_(2.0)
        twin.p.mul_(2.0)
    torch.testing.assert_close(_dense(A.detach()), Ad.detach())
    if init:
        _check_tensor(m.p, twin.p)
    if (
        path == "share_memory"
    ):  # an in-place op on the pattern writes into the shared memory, as dense
        assert m.p.is_shared() and A.is_shared() and twin.p.is_shared()


@pytest.mark.parametrize("kind", ["coo", "csr", "hybrid"])
@pytest.mark.parametrize("path", ["cpu", "float", "double", "half"])
def test_state_dict_round_trips_after_a_conversion(path, kind, swap):
    m, twin, _, _ = _modules(kind)
    PATHS[path](m)
    PATHS[path](twin)
    src, src_twin = _modules(kind)[:2]
    with torch.no_grad():
        src.p.add_(1.0)
        src_twin.p.add_(1.0)
    for assign in (False, True):
        m.load_state_dict(src.state_dict(), assign=assign)
        twin.load_state_dict(src_twin.state_dict(), assign=assign)
        _check_tensor(m.p, twin.p)
        _check_tensor(m.b, twin.b)
        assert isinstance(m.p, torch.nn.Parameter)
    sd = m.state_dict()
    assert set(sd) == {"p", "b", "n"} and all(isinstance(v, SparseTensor) for v in sd.values())
    m.load_state_dict(twin.state_dict())  # a dense checkpoint: copied in
    _check_tensor(m.p, twin.p)


def test_the_buffer_swapped_with_its_own_detach_keeps_its_contents(swap):
    """load_state_dict under the swap flag swaps a buffer with ``buffer.copy_(other).detach()``: a view of
    itself after the swap (RecursionError before)."""
    m = torch.nn.Module()
    m.register_buffer("b", _csr())
    new = _csr() * 3.0
    m.load_state_dict({"b": new})
    torch.testing.assert_close(m.b.to_dense(), new.to_dense())
    B = m.b
    torch.utils.swap_tensors(B, B.detach())
    torch.testing.assert_close(B.to_dense(), new.to_dense())
    B.add_(1.0)
    torch.testing.assert_close(B.to_dense(), new.to_dense() + 1.0)


def test_torch_save_of_a_parameter_keeps_parameter_ness(tmp_path):
    m = torch.nn.Module()
    m.p = torch.nn.Parameter(_hybrid())
    torch.save({"p": m.p, "sd": m.state_dict()}, tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=True)
    assert isinstance(back["p"], torch.nn.Parameter) and back["p"].requires_grad
    assert not isinstance(back["sd"]["p"], torch.nn.Parameter)
    torch.testing.assert_close(back["p"].detach().to_dense(), _hybrid().to_dense())
    m.load_state_dict(back["sd"])


@pytest.mark.parametrize("kind", ["coo", "csr", "hybrid"])
def test_setting_data_is_as_for_a_dense_parameter(kind):
    """``p.data = b``: p becomes b (shape, dtype, storage), keeps requires_grad; was silently ignored."""
    m, twin, _, _ = _modules(kind)
    B = MAKERS[kind]().double() * 3.0
    Bd = _dense(B)
    m.p.data = B
    twin.p.data = Bd
    _check_tensor(m.p, twin.p)
    with torch.no_grad():
        m.p.add_(1.0)
        twin.p.add_(1.0)
    torch.testing.assert_close(B.to_dense(), Bd)  # the storage is shared, as for the dense twin
    dense = torch.arange(float(m.p.numel()), dtype=torch.float64).view(m.p.shape)
    m.p.data = dense  # a dense tensor of p's shape: converted exactly, keeping p's fill and layout
    assert m.p.sparse_layout is B.sparse_layout and m.p.dense_dim() == B.dense_dim()
    torch.testing.assert_close(m.p.detach().to_dense(), dense)
    torch.testing.assert_close(m.p.fill_value(), B.fill_value())
    with pytest.raises(ValueError, match=r"dense B of shape \(7,\) for a SparseTensor of shape"):
        m.p.data = torch.ones(7)


def test_vector_to_parameters_round_trip():
    m = torch.nn.Module()
    m.p = torch.nn.Parameter(_csr())
    v = torch.nn.utils.parameters_to_vector(m.parameters())
    torch.nn.utils.vector_to_parameters(v * 2.0, m.parameters())
    assert isinstance(m.p, SparseTensor) and isinstance(
        m.p, torch.nn.Parameter
    )  # (the vector's layout: COO)
    torch.testing.assert_close(m.p.detach().to_dense(), _csr().to_dense() * 2.0)


def test_optimizer_steps_after_cpu_and_float():
    A = _coo()
    m = torch.nn.Module()
    m.p = torch.nn.Parameter(A)
    m.cpu().float().to("cpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    before = A.to_dense()
    (m.p * 2.0).backward(A.detach() * 0.0 + 1.0)
    opt.step()
    torch.testing.assert_close(m.p.detach().to_dense(), before - 1.0)
    torch.testing.assert_close(
        A.to_dense(), before - 1.0
    )  # as for a dense tensor: the parameter is A's storage


# ---------------------------------------------------------------------------------- shared and pinned memory
@pytest.mark.parametrize("kind", list(MAKERS))
def test_share_memory_moves_the_inner_tensors(kind):
    A = MAKERS[kind]()
    dense = _dense(A)
    assert not A.is_shared()
    assert A.share_memory_() is A
    names = A.__tensor_flatten__()[0]
    assert len(names) >= 3 and all(getattr(A, n).is_shared() for n in names)
    assert A.is_shared()
    torch.testing.assert_close(_dense(A), dense)
    vals = A._vals
    A.mul_(3)  # the pattern stays: written in place, still shared
    assert A._vals is vals and A.is_shared()
    torch.testing.assert_close(_dense(A), dense * 3, equal_nan=True)
    if not A.is_fill_indefinite():
        A.copy_(
            torch.full_like(dense, 2.0)
        )  # a new pattern (all stored): new storage, not shared, as is_shared says
        assert not A.is_shared()
        torch.testing.assert_close(A.to_dense(), torch.full_like(dense, 2.0))
    m = torch.nn.Linear(2, 2)
    m.p = torch.nn.Parameter(MAKERS[kind]())
    m.register_buffer("b", MAKERS[kind]())
    assert m.share_memory() is m and m.p.is_shared() and m.b.is_shared() and m.weight.is_shared()


def test_pin_memory_behaves_as_on_a_dense_tensor():
    A, d = _coo(), _coo().to_dense()
    assert A.is_pinned() is False and d.is_pinned() is False
    if not torch.accelerator.is_available():
        with pytest.raises(RuntimeError) as dense_err:
            d.pin_memory()
        with pytest.raises(RuntimeError, match=str(dense_err.value)):
            A.pin_memory()
        return
    P = A.requires_grad_().pin_memory()  # pragma: no cover (needs an accelerator)
    assert isinstance(P, SparseTensor) and P.is_pinned() and P.grad_fn is not None
    torch.testing.assert_close(P.detach().to_dense(), d)


def test_pickle_keeps_parameter_ness_and_the_inner_tensors():
    m = torch.nn.Module()
    m.p = torch.nn.Parameter(_csr())
    m2 = pickle.loads(pickle.dumps(m))
    assert (
        isinstance(m2.p, torch.nn.Parameter)
        and isinstance(m2.p, SparseTensor)
        and m2.p.requires_grad
    )
    assert m2.p.sparse_layout is torch.sparse_csr
    torch.testing.assert_close(m2.p.detach().to_dense(), _csr().to_dense())
    assert isinstance(copy.deepcopy(m).p, torch.nn.Parameter)


# ---------------------------------------------------------------------------------- processes
def _train(m, steps):
    opt = torch.optim.SGD(m.parameters(), lr=0.125)
    for _ in range(steps):
        opt.zero_grad()
        (m.p * 1.0).backward(
            m.p.detach() * 0.0 + 1.0
        )  # gradient 1 everywhere (a SparseTensor, fill 1)
        opt.step()


def test_hogwild_training_of_a_shared_module_with_fork():
    """Two processes step one shared module (torch's Hogwild example): the parent sees every step."""
    m = torch.nn.Module()
    m.p = torch.nn.Parameter(_csr())
    m.share_memory()
    before = m.p.detach().to_dense()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_train, args=(m, 4), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    torch.testing.assert_close(m.p.detach().to_dense(), before - 2 * 4 * 0.125)
    assert m.p.is_shared()


def _child(q, r, done):
    A, M = q.get()
    r.put((type(A).__name__, A.is_shared(), A.sparse_layout, type(M.p).__name__, M.p.is_shared()))
    A._vals.mul_(10.0)  # in the shared memory: the parent sees it (nothing was copied)
    r.put(sparsefill.sparse_coo_tensor([[1]], [7.0], (3,), fill_value=2.0))
    done.wait(60)  # (the receiver needs the sender alive to open its shared memory)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_sparse_tensors_cross_processes_in_shared_memory(method):
    ctx = mp.get_context(method)
    q, r, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    A = _csr()
    M = torch.nn.Module()
    M.p = torch.nn.Parameter(_hybrid())
    M.share_memory()
    proc = ctx.Process(target=_child, args=(q, r, done), daemon=True)
    proc.start()
    try:
        q.put((A, M))
        assert r.get(timeout=60) == ("SparseTensor", True, torch.sparse_csr, "SparseTensor", True)
        B = r.get(timeout=60)
        assert isinstance(B, SparseTensor) and B.is_shared()
        torch.testing.assert_close(B.to_dense(), torch.tensor([2.0, 7.0, 2.0]))
    finally:
        done.set()
        proc.join(60)
    assert proc.exitcode == 0
    assert A.is_shared()  # (put moved A's storage to shared memory, as for a dense tensor)
    expect = _csr().to_dense()
    expect[_csr().to_dense() != 0.5] *= 10.0
    torch.testing.assert_close(A.to_dense(), expect)


def test_deepcopy_of_a_parameter_is_a_parameter():
    p = torch.nn.Parameter(sparsefill.to_sparse(torch.ones(3)))
    q = copy.deepcopy(p)
    assert isinstance(q, torch.nn.Parameter) and isinstance(q, SparseTensor) and q.requires_grad
    m = torch.nn.Module()
    m.w = p
    assert isinstance(copy.deepcopy(m).w, torch.nn.Parameter)


# ============================================================================== 3. modules
class _M(nn.Module):
    """A SparseTensor parameter (fill 0.5), an indefinite buffer, a CSR buffer, a dense layer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.W = nn.Parameter(
            sparsefill.sparse_coo_tensor(
                [[0, 1, 3], [1, 2, 0]], torch.randn(3), (4, 3), fill_value=0.5
            )
        )
        self.register_buffer(
            "A",
            sparsefill.sparse_coo_tensor(
                [[0, 2], [1, 3]], torch.randn(2), (4, 4), fill_value=sparsefill.indefinite
            ),
        )
        self.register_buffer(
            "C",
            sparsefill.sparse_coo_tensor([[0, 2], [1, 3]], torch.randn(2), (4, 4)).to_sparse_csr(),
        )
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(F.relu(x @ self.C.t()) @ self.W)

    def dense(self, x, W):  # the same function with W a dense tensor
        return self.lin(F.relu(x @ self.C.to_dense().t()) @ W)


_XM = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))


def test_module_dtype_conversions_and_deepcopy():
    m = _M()
    ref = m(_XM)
    for conv, dt in (
        (lambda q: q.to(torch.float64), torch.float64),
        (lambda q: q.double(), torch.float64),
        (lambda q: q.half(), torch.float16),
        (lambda q: q.bfloat16(), torch.bfloat16),
    ):
        q = conv(copy.deepcopy(m))
        assert (
            isinstance(q.W, nn.Parameter)
            and isinstance(q.W, sparsefill.SparseTensor)
            and q.W.requires_grad
        )
        assert q.W.dtype == q.A.dtype == q.C.dtype == dt and q.W._fill.dtype == dt
        assert q.A._indefinite and q.C.sparse_layout is torch.sparse_csr
        assert_close(
            q(_XM.to(dt)).float(), ref, atol=2e-2 if dt != torch.float64 else 1e-6, rtol=2e-2
        )
    q = copy.deepcopy(m)
    assert q.W is not m.W and q.W._vals.data_ptr() != m.W._vals.data_ptr()
    with torch.no_grad():
        q.W.mul_(2)
    assert_close(m(_XM), ref)


def test_module_state_dict_round_trips():
    m = _M()
    ref = m(_XM)
    sd = m.state_dict()
    assert all(isinstance(sd[k], sparsefill.SparseTensor) for k in ("W", "A", "C"))
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    q = _M()
    with torch.no_grad():
        q.W.mul_(3)
    q.load_state_dict(torch.load(buf, weights_only=True))
    assert_close(q(_XM), ref)
    assert q.A._indefinite and q.C.sparse_layout is torch.sparse_csr
    part = dict(sd)
    del part["A"]
    part["extra"] = torch.ones(1)
    r = copy.deepcopy(m).load_state_dict(part, strict=False)
    assert r.missing_keys == ["A"] and r.unexpected_keys == ["extra"]
    with pytest.raises(RuntimeError, match="size mismatch for W"):
        copy.deepcopy(m).load_state_dict(
            {**sd, "W": sparsefill.sparse_coo_tensor([[0], [1]], [1.0], (5, 3))}
        )
    q = copy.deepcopy(m)
    q.load_state_dict(sd, assign=True)
    assert isinstance(q.W, nn.Parameter) and q.W.requires_grad
    assert_close(q(_XM), ref)


def test_module_grad_clipping_accumulation_zero_grad_and_eval():
    """clip_grad_norm_ (foreach=False) over a SparseTensor grad equals dense; 2 micro-batches accumulate to the full
    batch's gradient; zero_grad(set_to_none=False) leaves a zero SparseTensor that accumulates; no_grad and
    inference_mode evaluation; forward hooks and a parameter's grad hooks."""
    m = _M()
    Wd = nn.Parameter(m.W.detach().to_dense())
    md = copy.deepcopy(m)
    m(_XM).pow(2).sum().backward()
    md.dense(_XM, Wd).pow(2).sum().backward()
    assert isinstance(m.W.grad, sparsefill.SparseTensor)
    n = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1, foreach=False)
    nd = torch.nn.utils.clip_grad_norm_([Wd] + list(md.lin.parameters()), 0.1, foreach=False)
    assert_close(n, nd)
    assert_close(m.W.grad.to_dense(), Wd.grad)
    # accumulation over 2 micro-batches
    a, b = copy.deepcopy(m), copy.deepcopy(m)
    for q in (a, b):
        q.zero_grad()
    a(_XM[:2]).sum().backward()
    a(_XM[2:]).sum().backward()
    b(_XM).sum().backward()
    assert_close(a.W.grad.to_dense(), b.W.grad.to_dense())
    # zero_grad(set_to_none=False)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    opt.zero_grad(set_to_none=False)
    assert isinstance(a.W.grad, sparsefill.SparseTensor) and not a.W.grad.to_dense().any()
    a(_XM).sum().backward()
    assert_close(a.W.grad.to_dense(), b.W.grad.to_dense())
    # evaluation
    ref = m(_XM)
    with torch.no_grad():
        r1 = m(_XM)
    with torch.inference_mode():
        r2 = m(_XM)
    assert not r1.requires_grad and r2.is_inference()
    assert_close(r1, ref)
    assert_close(r2, ref)
    seen = []
    h = m.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    m.W.register_post_accumulate_grad_hook(lambda p: seen.append("post"))
    m.W.register_hook(lambda g: seen.append(type(g).__name__) or g)
    m(_XM).sum().backward()
    h.remove()
    assert seen == [torch.Size([5, 2]), "SparseTensor", "post"]
