"""The segment kernels: a compiled CPU path (numba, optional) and the torch path (any device).

For a :class:`~._plan.Plan` (segments of input positions; ``x_p`` = row ``rows[p]`` of ``x``)::

    segment_sum(x, plan, w)[s]      = sum_{p in s} w_p x_p         (mode="mean": divided by n_s)
    segment_extreme(x, plan)[s]
        = max_{p in s} x_p  (or min), arg[s] = the first input position of it

and, on the compiled kernels only (the sparse-dense products of a pattern ``(rows, cols)``)::

    gather_scatter_sum(x, rows, ids, w, S)[s] = sum_{i: ids[i] == s} w_i x[rows[i]]
    sampled_dot(u, v, rows, cols)[i]          = u[rows[i]] . v[cols[i]]

Sums over sorted segments run on ``embedding_bag`` (its CPU kernel is fbgemm's; on GPU CUDA's) with
``include_last_offset`` (one column read in order: the compiled kernel instead, 1.6x faster there).
Max/min, and every reduction over *unsorted* ids, run on the compiled kernels of ``_numba_kernels``
for float32/float64 CPU tensors when numba imports (``pip install sparsefill[segment]``): unsorted
ids are reduced in place by scatter kernels, with no sort. The torch path (``embedding_bag``, and
the reducer protocol's scatter kernels of ``sparsefill._kernels.reducer`` over the segment order)
serves every other device and dtype.  Both paths return the same values; the compiled kernels check
every row index they read.

Backends (``set_backend``, or the environment variable ``SPARSEFILL_SEGMENT_BACKEND``):

* ``"auto"`` (default): the torch path until the calls of this process have brought
  ``COMPILED_AFTER_WORK`` elements of work (rows x columns, 2**22: one large call or many small
  ones); then numba is imported, once, and every later CPU call runs the compiled kernels.  The
  first numba use costs 0.7-0.9 s in a fresh process (its import, the import of scipy it makes, and
  its compiler's set-up; the kernels themselves load from numba's on-disk cache in milliseconds),
  more than the torch path saves on small inputs, which therefore never pay it (e.g. a DataLoader
  worker);
* ``"numba"``: the compiled kernels for every CPU call (ImportError without numba);
* ``"torch"``: the torch path only.

numba caches the compiled kernels next to this module (``__pycache__``) where the package is
writable, else in the user's cache directory (``$NUMBA_CACHE_DIR``, or ``numba`` under
``$XDG_CACHE_HOME`` / ``~/.cache``): each kernel is compiled once per installation and user.

Threads: a compiled call uses ``torch.get_num_threads()`` threads (fewer below ``GRAIN`` elements
of work a thread).  Sorted segments are split into ranges of about equal positions; unsorted ids
into position ranges, each reduced into its own partial table, then merged (when the tables are
small next to the data), or else into ranges of segment ids.  The kernels are serial and release
the GIL; they run on a small pool of Python threads.  (numba's own parallel layer would start a
second OpenMP runtime next to torch's, whose idle workers spin on the same cores.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import torch

from sparsefill._kernels import engine as _engine, index as _index, reducer as _reduce
from sparsefill._kernels.grouping import storage_cached
from sparsefill._kernels.trace import traced

__all__ = [
    "set_backend",
    "backend",
    "use_backend",
    "compiled_available",
    "compiled_for",
    "segment_sum",
    "segment_extreme",
    "sort_by_segment",
    "count_ids",
    "offsets_of",
    "segment_ids_of",
    "gather_scatter_sum",
    "sampled_dot",
]

_BACKENDS = ("auto", "numba", "torch")
_STATE = {"backend": os.environ.get("SPARSEFILL_SEGMENT_BACKEND", "auto"), "nb": None, "work": 0}
# elements of work ("auto") after which numba is imported: see the module docstring
COMPILED_AFTER_WORK = 1 << 22


def set_backend(name: str) -> None:
    """``"auto"`` (the default: the compiled CPU kernels once enough work has come to pay for
    numba's import), ``"numba"`` (the compiled kernels for every CPU call; imports numba now) or
    ``"torch"``."""
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, _BACKENDS))}, got {name!r}")
    if name == "numba":
        _require_nb()
    _STATE["backend"] = name


def backend() -> str:
    return _STATE["backend"]


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Context manager: run the enclosed calls with ``set_backend(name)``."""
    old = _STATE["backend"]
    set_backend(name)
    try:
        yield
    finally:
        _STATE["backend"] = old


def _nb():
    """The compiled kernels module, or False when numba is not installed."""
    if _STATE["nb"] is None:
        from sparsefill._kernels import segment_numba as mod

        if mod.numba is None:
            mod = False
        _STATE["nb"] = mod
    return _STATE["nb"]


def _require_nb():
    nb = _nb()
    if not nb:
        raise ImportError(
            "the segment backend 'numba' needs numba installed (pip install sparsefill[segment])"
        )
    return nb


def compiled_available() -> bool:
    """Whether numba is installed (imports it: 0.3 s once)."""
    return bool(_nb())


def compiled_for(device, work: int = 0) -> bool:
    """Whether a call of ``work`` elements (rows x columns) on ``device`` runs the compiled kernels
    (``"auto"``: counts ``work`` towards ``COMPILED_AFTER_WORK`` until numba is loaded)."""
    name = _STATE["backend"]
    if name == "torch" or torch.device(device).type != "cpu":
        return False
    if name == "numba":
        return bool(_require_nb())
    if name != "auto":
        raise ValueError(
            f"SPARSEFILL_SEGMENT_BACKEND must be one of {', '.join(_BACKENDS)}, got {name!r}"
        )
    if _STATE["nb"] is None:
        _STATE["work"] += work
        if _STATE["work"] < COMPILED_AFTER_WORK:
            return False
    return bool(_nb())


def _np(t):
    """``t``'s memory as a NumPy array (no copy), through torch.func's wrappers (under
    ``grad``/``vmap`` even a captured tensor's ``detach()`` is wrapped at the transform's level, and
    a wrapper has no storage)."""
    if not _IS_WRAPPED(t) and not torch._C._are_functorch_transforms_active():
        return t.detach().numpy()
    while _IS_WRAPPED(t):
        t = _UNWRAP(t)
    with torch._C._DisableFuncTorch():  # (numpy() inside a transform wraps its detach() again)
        return t.detach().numpy()


_IS_WRAPPED, _UNWRAP = (
    torch._C._functorch.is_functorch_wrapped_tensor,
    torch._C._functorch.get_unwrapped,
)


# ---------------------------------------------------------------------------- threads
_POOL = {"ex": None, "n": 0, "pid": None}
GRAIN = 1 << 18  # elements of work per thread below which a call stays on one thread


def _threads(work: int) -> int:
    """Threads for ``work`` elements: ``torch.get_num_threads()``, fewer for small calls."""
    return max(1, min(torch.get_num_threads(), work // GRAIN))


def _pool(n: int):
    """A pool of at least ``n`` worker threads (a new one in a forked child: the parent's threads
    are gone)."""
    if _POOL["n"] < n or _POOL["pid"] != os.getpid():
        import concurrent.futures

        if _POOL["ex"] is not None and _POOL["pid"] == os.getpid():
            _POOL["ex"].shutdown(wait=True)
        _POOL.update(
            ex=concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="sparsefill-segment"),
            n=n,
            pid=os.getpid(),
        )
    return _POOL["ex"]


def _run_jobs(fn, jobs) -> tuple[int, int]:
    """``fn(*job, bad)`` for every job (argument tuple), in parallel: the first on this thread, the
    others on the pool.  Returns ``(bad row position, bad id position)``: the smallest each kernel
    reported in ``bad[0]`` and ``bad[1]`` (-1 if none)."""
    bads = np.full((len(jobs), 2), -1, dtype=np.int64)
    futures = [_pool(len(jobs) - 1).submit(fn, *job, bads[t]) for t, job in enumerate(jobs) if t]
    fn(*jobs[0], bads[0])
    for f in futures:
        f.result()
    return tuple(int(b[b >= 0].min()) if (b >= 0).any() else -1 for b in bads.T)


def _split(cum: torch.Tensor, T: int) -> list[int]:
    """``T + 1`` range bounds over ``[0, S]`` with about equal work, ``cum`` the cumulative work
    (``S + 1``)."""
    S = cum.numel() - 1
    if T == 1:
        return [0, S]
    total = int(cum[-1])
    targets = torch.tensor([total * t // T for t in range(1, T)], dtype=cum.dtype)
    return [0, *torch.searchsorted(cum, targets).tolist(), S]


_DUMMY = {}


def _dummy():
    """A placeholder for the arg array of the kernels that record none."""
    if "arg" not in _DUMMY:
        _DUMMY["arg"] = np.zeros((1, 1), dtype=np.int64)
    return _DUMMY["arg"]


def _reduce_compiled(form, op, x, plan, rows, w, *, want_arg=False, scale=None):
    """``(out, arg)``: the compiled kernels of ``op`` over the whole plan (see ``_numba_kernels``),
    on up to ``torch.get_num_threads()`` threads.  Sorted segments are split into ranges of about
    equal positions.  Unsorted ids are split into position ranges reduced into partial tables, then
    merged (when ``S`` is small next to the positions), or else into ranges of segments (each thread
    then scans every id)."""
    nb = _nb()
    S, D = plan.num_segments, x.shape[1]
    xn = _np(x.contiguous())
    out = torch.empty(S, D, dtype=x.dtype)
    arg = torch.empty(S, D, dtype=torch.int64) if want_arg else None
    none_i, none_f = np.empty(0, dtype=np.int64), np.empty(0, dtype=xn.dtype)
    rows_n = _np(rows) if rows is not None else none_i
    w_n = _np(w) if w is not None else none_f
    scale_n = _np(scale) if scale is not None else none_i
    out_n, arg_n = _np(out), (_np(arg) if arg is not None else _dummy())
    if form == "sorted":
        offs = plan.offsets
        bounds = _split(offs, _threads(int(offs[-1]) * D))
        fn = nb.kernel("sorted", op, want_arg, nb.fixed_width(op, want_arg, D, xn.itemsize))
        jobs = [
            (xn, _np(offs), rows_n, w_n, scale_n, out_n, arg_n, bounds[t], bounds[t + 1])
            for t in range(len(bounds) - 1)
        ]
        bad, bad_id = _run_jobs(fn, jobs)
    else:
        ids = _np(plan.ids)
        n = ids.shape[0]
        T = _threads(n * D)
        fn = nb.kernel("scatter", op, want_arg)
        if T > 1 and S * (T - 1) * 4 <= n:  # partial tables cost at most a quarter of the data
            parts = np.empty((T - 1, S, D), dtype=xn.dtype)
            part_args = np.empty((T - 1, S, D), dtype=np.int64) if want_arg else _dummy()[None]
            pos = [n * t // T for t in range(T + 1)]
            jobs = [
                (
                    xn,
                    ids,
                    rows_n,
                    w_n,
                    none_i,
                    out_n if t == 0 else parts[t - 1],
                    arg_n if (t == 0 or not want_arg) else part_args[t - 1],
                    0,
                    S,
                    pos[t],
                    pos[t + 1],
                )
                for t in range(T)
            ]
            bad, bad_id = _run_jobs(fn, jobs)
            if bad < 0 and bad_id < 0:
                bounds = [S * t // T for t in range(T + 1)]
                merge = nb.kernel("merge", op, want_arg)
                _run_jobs(
                    lambda *a: merge(*a[:-1]),
                    [
                        (out_n, arg_n, parts, part_args, scale_n, bounds[t], bounds[t + 1])
                        for t in range(T)
                    ],
                )
        else:
            cum = None
            if T > 1:
                cum = torch.from_numpy(np.concatenate([[0], np.cumsum(_np(plan.counts))]))
            bounds = _split(cum, T) if T > 1 else [0, S]
            jobs = [
                (xn, ids, rows_n, w_n, scale_n, out_n, arg_n, bounds[t], bounds[t + 1], 0, n)
                for t in range(len(bounds) - 1)
            ]
            bad, bad_id = _run_jobs(fn, jobs)
    # unsorted ids are checked here, by the kernel (make_plan does not count them first)
    if bad_id >= 0:
        count_ids(plan.ids, S, True)
    if bad >= 0:
        _raise_bad_rows(rows, x.shape[0], bad)
    return out, arg


_ARANGE = {"t": torch.empty(0, dtype=torch.int64)}


_ARANGE_CACHE_MAX = 1 << 24  # at most 128 MB of cached int64 positions


def _arange(n, device):
    """``arange(n)`` (int64), cached for the CPU up to ``_ARANGE_CACHE_MAX`` (read-only use)."""
    if torch.device(device).type != "cpu" or n > _ARANGE_CACHE_MAX:
        return torch.arange(n, device=device)
    if _ARANGE["t"].numel() < n:
        _ARANGE["t"] = torch.arange(min(max(n, 2 * _ARANGE["t"].numel()), _ARANGE_CACHE_MAX))
    return _ARANGE["t"][:n]


def _raise_bad_rows(rows, m, pos=None):
    from sparsefill._kernels.segment_check import check_indices

    check_indices(rows, m, "indices")
    # not reached
    raise IndexError(f"a row index is out of range for {m} rows of data (position {pos})")


def offsets_of(lengths: torch.Tensor, compiled: bool | None = None) -> torch.Tensor:
    """The offsets (int64, ``S + 1``) of non-negative lengths; a negative length raises a ValueError
    naming it. ``compiled`` (default: ``compiled_for(lengths.device)``): one compiled pass (the
    check and the running sum: 2x faster than the torch ops when the lengths are not in cache)."""
    offs = torch.empty(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    if compiled_for(lengths.device) if compiled is None else compiled:
        neg, over = (int(v) for v in _nb().offsets_of(_np(lengths), _np(offs)))
    else:
        neg = (
            int((lengths < 0).nonzero()[0, 0]) if lengths.numel() and int(lengths.min()) < 0 else -1
        )
        offs[0] = 0
        torch.cumsum(lengths, 0, out=offs[1:])
        # (non-negative lengths: a decrease is an overflow; no diff, it wraps too)
        dec = offs[1:] < offs[:-1]
        over = int(dec.nonzero()[0, 0]) if neg < 0 and bool(dec.any()) else -1
    if neg >= 0:
        raise ValueError(f"lengths must be non-negative, got lengths[{neg}] = {int(lengths[neg])}")
    if over >= 0:
        raise ValueError(
            f"lengths overflow int64: their running sum passes 2**63 - 1 at lengths[{over}]"
        )
    return offs


def segment_ids_of(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """The segment of every position ``k < n`` (int64), from offsets."""
    return _index.runs_to_ids(offsets.diff(), n)


def _count_compiled(ids: torch.Tensor, S: int):
    """``(counts, first bad position or -1)`` by the compiled counter; large calls count position
    ranges on separate threads into one row of counts each (when ``S`` is small next to the ids)."""
    n = ids.numel()
    T = _threads(n) if S * 4 <= n else 1
    if T == 1:
        counts = np.zeros(S, dtype=np.int64)
        return torch.from_numpy(counts), int(_nb().count_ids(_np(ids), counts, 0, n))
    rows_np = np.zeros((T, S), dtype=np.int64)
    bounds = [n * t // T for t in range(T + 1)]
    ids_np = _np(ids)
    fn = _nb().count_ids
    futures = [
        _pool(T - 1).submit(fn, ids_np, rows_np[t], bounds[t], bounds[t + 1]) for t in range(1, T)
    ]
    bads = [int(fn(ids_np, rows_np[0], bounds[0], bounds[1]))] + [int(f.result()) for f in futures]
    bads = [b for b in bads if b >= 0]
    return torch.from_numpy(rows_np.sum(0)), (min(bads) if bads else -1)


def count_ids(ids: torch.Tensor, S: int, compiled: bool | None = None) -> torch.Tensor:
    """``bincount(ids, minlength=S)``; an id outside ``[0, S)`` raises an IndexError naming it
    (``compiled`` as in :func:`offsets_of`)."""
    if (compiled_for(ids.device) if compiled is None else compiled) and ids.numel():
        counts, bad = _count_compiled(ids.contiguous(), S)
    else:
        bad = -1
        if ids.numel():
            lo, hi = (int(v) for v in torch.aminmax(ids))
            if lo < 0 or hi >= S:
                bad = int(((ids < 0) | (ids >= S)).nonzero()[0, 0])
        counts = (
            None
            if bad >= 0
            else (
                torch.bincount(ids, minlength=S)
                if ids.numel()
                else torch.zeros(S, dtype=torch.int64, device=ids.device)
            )
        )
    if bad >= 0:
        v = int(ids[bad])
        if v < 0:
            raise IndexError(f"segment_ids must be non-negative, got segment_ids[{bad}] = {v}")
        raise IndexError(f"segment_ids[{bad}] = {v} is out of range for num_segments = {S}")
    return counts


def sort_by_segment(ids: torch.Tensor, num_segments: int, compiled: bool | None = None):
    """``(order, offsets)``: a stable permutation grouping the positions by id (ids in range), and
    the offsets of the groups (``compiled`` as in :func:`offsets_of`)."""
    compiled = compiled_for(ids.device) if compiled is None else compiled
    counts = count_ids(ids, num_segments, compiled)
    offsets = torch.zeros(num_segments + 1, dtype=torch.int64, device=ids.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    if compiled and ids.numel():
        order = torch.empty(ids.numel(), dtype=torch.int64)
        _nb().counting_sort(_np(ids.contiguous()), _np(order), _np(offsets))
    else:
        order = torch.sort(ids, stable=True).indices
    return order, offsets


def _contig(t):
    return None if t is None else t.contiguous()


def segment_sum(
    x: torch.Tensor,
    plan,
    w: torch.Tensor | None = None,
    *,
    mode: str = "sum",
    w_in_segment_order: bool = False,
    engine: str | None = None,
) -> torch.Tensor:
    """``out[s] = sum_{p in s} w_p x_p`` (``mode="mean"``: divided by the count; empty segments 0).

    ``x`` is 2-D.  ``w`` is per input position, or per segment-order position with
    ``w_in_segment_order`` (positional weights).  ``engine``: the one ``_kernels.engine.run`` chose
    and runs here (None: chosen here by ``_kernels.engine.choose`` for the plan).
    """
    S = plan.num_segments
    if S == 0:
        return x.new_zeros(0, x.shape[1])
    wide = _reduce.accumulator_dtype(x.dtype)
    # (float32 and the half types accumulate wider: torch's accuracy)
    if wide != x.dtype and not traced(x):
        out = segment_sum(
            x.to(wide),
            plan,
            None if w is None else w.to(wide),
            mode=mode,
            w_in_segment_order=w_in_segment_order,
            engine=engine,
        )
        return out.to(x.dtype)
    if x.dtype == torch.float64 and x.device.type == "cpu" and not traced(x):
        # (a tree of short runs, _reduce.accurate_sum: no wider dtype to accumulate in)
        engine = "blocked"
    if engine is None:
        unsorted, one = (
            plan.unsorted and not plan._sorted and not w_in_segment_order,
            x.shape[1] == 1,
        )
        # (gather read only where it decides: plan.rows of unsorted ids is a sort)
        engine = _engine.choose(
            "sum",
            x.dtype,
            unsorted=unsorted,
            compiled=plan.compiled,
            bag=True,
            one_column=one,
            gather=one and not unsorted and plan.rows is not None,
        )
    if engine == "numba_scatter":
        op = "wsum" if w is not None else ("mean" if mode == "mean" else "sum")
        out, _ = _reduce_compiled(
            "scatter",
            op,
            x,
            plan,
            _contig(plan.direct_rows()),
            _contig(plan.direct(w)),
            scale=plan.counts if op == "mean" else None,
        )
        return out / plan.counts.clamp_min(1)[:, None] if (mode == "mean" and op != "mean") else out
    w_seg = w if (w is None or w_in_segment_order) else plan.to_segment_order(w)
    if engine == "numba_sorted":
        # one column read in order: the compiled kernel, 1.6x faster than embedding_bag (not so for
        # a gather)
        op = "wsum" if w_seg is not None else ("mean" if mode == "mean" else "sum")
        out, _ = _reduce_compiled(
            "sorted", op, x, plan, None, _contig(w_seg), scale=plan.counts if op == "mean" else None
        )
        return (
            out.div_(plan.counts.clamp_min(1)[:, None])
            if (mode == "mean" and op != "mean")
            else out
        )
    if engine == "embedding_bag":
        rows = plan.rows
        idx = rows if rows is not None else _arange(x.shape[0], x.device)
        # (a mean is the sum divided in place: embedding_bag's own mean mode measured 1.5-4x slower)
        out = torch.nn.functional.embedding_bag(
            idx, x, plan.offsets, mode="sum", per_sample_weights=w_seg, include_last_offset=True
        )
        return out.div_(plan.counts.clamp_min(1)[:, None]) if mode == "mean" else out
    vals = x if plan.rows is None else x.index_select(0, plan.rows)
    if w_seg is not None:
        vals = vals * w_seg[:, None]
    out = _reduce.segment_combine(
        vals.to(torch.int64) if not vals.is_floating_point() else vals, plan.seg, S, "sum"
    )
    return out / plan.counts.clamp_min(1)[:, None] if mode == "mean" else out


def segment_extreme(
    x: torch.Tensor,
    plan,
    *,
    largest: bool,
    want_arg: bool = True,
    empty=None,
    engine: str | None = None,
):
    """``(best, arg)``: per segment and column the max (``largest``) or min of ``x_p`` and the first
    input position holding it (NaN wins, as in torch); empty segments: ``arg = -1`` and ``best =
    empty`` (unspecified when ``empty`` is None).  The compiled sorted kernel writes ``empty``
    itself, with no pass over the counts; the other paths fill the rows of zero count.  ``engine``:
    as in :func:`segment_sum`."""
    S = plan.num_segments
    D = x.shape[1]
    if S == 0:
        return x.new_zeros(0, D), (
            torch.zeros(0, D, dtype=torch.int64, device=x.device) if want_arg else None
        )
    op = "max" if largest else "min"
    if engine is None:
        engine = _engine.choose(
            "amax" if largest else "amin",
            x.dtype,
            unsorted=plan.unsorted and not plan._sorted,
            compiled=plan.compiled,
        )
    if engine == "numba_scatter":
        out, arg = _reduce_compiled(
            "scatter", op, x, plan, _contig(plan.direct_rows()), None, want_arg=want_arg
        )
        return _fill_empty(out, plan, empty), (plan.direct_positions(arg) if want_arg else None)
    rows = plan.rows
    if engine == "numba_sorted":
        w = None if empty is None else torch.empty(1, dtype=x.dtype).fill_(empty)
        out, arg = _reduce_compiled("sorted", op, x, plan, _contig(rows), w, want_arg=want_arg)
        return out, (plan.input_positions(arg) if want_arg else None)
    vals = x if rows is None else x.index_select(0, rows)
    best = _reduce.segment_combine(vals, plan.seg, S, "amax" if largest else "amin")
    arg = None
    if want_arg:
        k = _reduce.segment_arg(vals, plan.seg, S, _arange(vals.shape[0], x.device), best)
        arg = plan.input_positions(k)
    return _fill_empty(best, plan, empty), arg


def _fill_empty(out: torch.Tensor, plan, value) -> torch.Tensor:
    """``out`` with the rows of the empty segments set to ``value`` in place (None: as is)."""
    return out if value is None or out.numel() == 0 else plan.fill_empty_(out, value)


def gather_scatter_sum(
    x: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, num_segments: int
) -> torch.Tensor:
    """``out[s] = sum(w[i] * x[rows[i]] for i with ids[i] == s)`` for a 2-D ``x``, ``(num_segments,
    x.shape[1])``, on the compiled kernels (numba needed: the caller asked :func:`compiled_for`):
    in position order, summed in ``x``'s dtype, with no sort and no ``(n, D)`` temporary (the rows
    read and written at random prefetched).  Sorted ids (a CSR or coalesced pattern's rows) run the
    sorted kernel, which keeps each output row in registers until its segment ends (2x faster than
    scattering into it); any other order the scatter kernel.  Every index is checked (an
    IndexError as the eager kernels raise)."""
    from sparsefill._kernels.segment_plan import Plan

    ids = _contig(ids)
    # (kept while the ids recur: a compiled training step passes the same pattern every call)
    offsets = storage_cached(
        ("sorted_offsets", num_segments), (ids,), lambda: _sorted_offsets(ids, num_segments)
    )
    if offsets is not None:
        plan = Plan(num_segments, ids.shape[0], offsets=offsets, compiled=True)
        form = "sorted"
    else:
        plan = Plan(num_segments, ids.shape[0], ids=ids, compiled=True)
        form = "scatter"
    out, _ = _reduce_compiled(form, "wsum", x, plan, _contig(rows), _contig(w.to(x.dtype)))
    return out


def _sorted_offsets(ids: torch.Tensor, num_segments: int) -> torch.Tensor | None:
    """The segment offsets of non-decreasing ``ids`` in ``[0, num_segments)``, else None."""
    offsets = torch.empty(num_segments + 1, dtype=torch.int64)
    return offsets if _require_nb().sorted_offsets(_np(ids), _np(offsets)) < 0 else None


def sampled_dot(
    u: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor:
    """``out[i] = u[rows[i]] . v[cols[i]]`` (``(u @ v.T)[rows, cols]`` with no ``(n, D)``
    temporaries) on the compiled kernel (numba needed), summed in ``u``'s dtype; the positions split
    over the threads.  A pair out of range raises an IndexError."""
    nb = _require_nb()
    n = rows.shape[0]
    out = torch.empty(n, dtype=u.dtype)
    un, vn = _np(u.contiguous()), _np(v.to(u.dtype).contiguous())
    rn, cn, on = _np(_contig(rows)), _np(_contig(cols)), _np(out)
    T = _threads(n * u.shape[1])
    pos = [n * t // T for t in range(T + 1)]
    bad, _ = _run_jobs(nb.sampled_dot, [(un, vn, rn, cn, on, pos[t], pos[t + 1]) for t in range(T)])
    if bad >= 0:
        raise IndexError(
            f"sampled product: the pair ({int(rows[bad])}, {int(cols[bad])}) at position {bad} is "
            f"outside the operands' rows ({u.shape[0]}, {v.shape[0]})"
        )
    return out
