"""Linear-time merges of sorted unique key sequences (the union and intersection of coalesced
patterns).

Keys are the row-major linear keys of :mod:`._index` (int64, strictly increasing within a run, as a
coalesced pattern stores them).  For runs ``a`` and ``b``::

    union, pa, pb = merge_union(a, b):
        union == torch.unique(torch.cat([a, b])),  union[pa] == a,  union[pb] == b
    common, ia, ib = merge_intersect(a, b):  common == a[ia] == b[ib] == the keys in both, ascending

On CPU with numba installed one compiled two-pointer pass (O(len(a) + len(b)), no sort of the
concatenation); elsewhere (other devices, no numba, small runs before numba is loaded) torch ops: a
binary search of one run in the other (``torch.searchsorted``, O(n log m); on CPU without numba the
union takes :func:`._index.unique_inverse`, faster there).  While torch.compile
traces (or fake tensors flow), :func:`union_inverse` takes the general ``torch.unique`` path.

Between keys and a dense buffer, with the same compiled kernels: :func:`fill_put_sorted`
(``to_dense``: the fill, then the values at their sorted keys, block by block), :func:`put_flat`
(the scatter) and :func:`find_differ` (``to_sparse``: the keys and values of the elements differing
from the fill).

>>> a, b = torch.tensor([1, 4, 6]), torch.tensor([0, 4, 9])
>>> [t.tolist() for t in merge_union(a, b)]
[[0, 1, 4, 6, 9], [1, 2, 3], [0, 2, 4]]
>>> [t.tolist() for t in merge_intersect(a, b)]
[[4], [1], [1]]
"""

from __future__ import annotations

import sys

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced

_COMPILED_MIN = (
    2048  # total keys from which a merge imports numba (below: torch ops unless numba is loaded)
)
_kernels = None  # the compiled kernels (see _compiled), or False without numba


def _compiled():
    """The compiled kernels ``(union, intersect, scatter, fill_scatter, count_differ,
    find_differ)``, built on the first call, or False without numba."""
    global _kernels
    if _kernels is None:
        _kernels = _build_kernels()
    return _kernels


def _build_kernels():
    try:
        import llvmlite.ir  # noqa: F401  (the intrinsics' code generation)
        from numba import config
    except ImportError:
        return False
    if config.DISABLE_JIT:
        # NUMBA_DISABLE_JIT=1, numba's debugging switch: its intrinsics cannot run (torch ops)
        return False
    import numpy as np

    _build_intrinsics(_stos_ready())
    union, intersect, scatter = _build_merges()
    fill_scatter, count_differ, find_differ = _build_dense_kernels()
    _LIKE.update({d: np.empty(0, torch.empty(0, dtype=d).numpy().dtype) for d in _SCATTER_DTYPES})
    return (union, intersect, scatter, fill_scatter, count_differ, find_differ)


def _build_intrinsics(stos):
    """Binds the module globals ``fill_at`` and ``address`` (globals of the kernels, not closure
    variables: the kernels that call them stay cached on disk)."""
    global address, fill_at
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def fill_at(typingctx, at, count, value):  # pragma: no cover (compiled)
        # ``count`` copies of ``value`` from address ``at``: x86-64's ``rep stos`` (fast-string
        # stores, no read of the lines first: 7% less than a store loop or numpy's fill on a 4
        # MB buffer), a loop elsewhere
        def codegen(context, builder, sig, args):
            ptr, n, v = args
            ty = context.get_value_type(sig.args[2])
            bits = 8 * context.get_abi_sizeof(ty)
            if stos and bits in (8, 16, 32, 64):
                slot = builder.alloca(ty)
                builder.store(v, slot)
                word, i64 = ir.IntType(bits), ir.IntType(64)
                pattern = builder.load(builder.bitcast(slot, word.as_pointer()))
                asm = ir.InlineAsm(
                    ir.FunctionType(ir.LiteralStructType([i64, i64]), [i64, i64, word]),
                    "rep stos" + {8: "b", 16: "w", 32: "l", 64: "q"}[bits],
                    "={di},={cx},0,1,{ax},~{memory},~{dirflag},~{fpsr},~{flags}",
                    side_effect=True,
                )
                builder.call(asm, [ptr, n, pattern])
            else:
                base = builder.inttoptr(ptr, ty.as_pointer())
                with cgutils.for_range(builder, n) as loop:
                    builder.store(v, builder.gep(base, [loop.index]))
            return context.get_dummy_value()

        return types.void(types.intp, types.intp, value), codegen

    @intrinsic
    def address(typingctx, at, like):  # pragma: no cover (compiled)
        # the pointer to address ``at`` of the element type of ``like`` (an array, or a NumPy
        # type)
        ptr = types.CPointer(like.dtype)
        return ptr(types.intp, like), lambda context, builder, sig, args: builder.inttoptr(
            args[0], context.get_value_type(ptr)
        )


def _build_merges():
    """The two-pointer merges and the scatter."""
    from numba import njit

    @njit(cache=True, nogil=True)
    def union(a, b, out, pa, pb):  # pragma: no cover (compiled)
        # branch-free steps (random patterns defeat a branch predictor: 2x faster): ``pa[i]`` is
        # rewritten until ``i`` moves on, so it ends as the place of ``a[i]``
        na, nb = a.shape[0], b.shape[0]
        i = j = k = 0
        while i < na and j < nb:
            x, y = a[i], b[j]
            le, ge = x <= y, y <= x
            out[k] = x if le else y
            pa[i] = k
            pb[j] = k
            i += le
            j += ge
            k += 1
        while i < na:
            out[k] = a[i]
            pa[i] = k
            i += 1
            k += 1
        while j < nb:
            out[k] = b[j]
            pb[j] = k
            j += 1
            k += 1
        return k

    @njit(cache=True, nogil=True)
    def intersect(a, b, ia, ib):  # pragma: no cover (compiled)
        na, nb = a.shape[0], b.shape[0]
        i = j = k = 0
        while i < na and j < nb:
            x, y = a[i], b[j]
            ia[k] = i
            ib[k] = j
            k += x == y
            i += x <= y
            j += y <= x
        return k

    @njit(cache=True, nogil=True)
    def scatter(out, keys, vals):  # pragma: no cover (compiled)
        for i in range(keys.shape[0]):
            out[keys[i]] = vals[i]

    return union, intersect, scatter


def _build_dense_kernels():
    """The kernels between keys and a dense buffer; binds the module global ``any_differ`` (see
    :func:`_build_intrinsics`)."""
    global any_differ
    import numpy as np
    from numba import carray, njit

    @njit(cache=True, nogil=True)
    def fill_scatter(
        at_out, n, at_fill, at_keys, at_vals, nse, like
    ):  # pragma: no cover (compiled)
        # arrays from addresses (cheaper than 3 .numpy() views and the fill's item() per call);
        # ``like``: the element type (a NumPy scalar type: no array to unbox); block by block:
        # the fill, then the values that fall in the block, while its lines are in cache
        out, vals = carray(address(at_out, like), n), carray(address(at_vals, like), nse)
        keys = carray(address(at_keys, np.int64), nse)
        size = out.itemsize
        block, value = _FILL_BYTES // size, carray(address(at_fill, like), 1)[0]
        j = 0
        for a in range(0, n, block):
            b = min(a + block, n)
            fill_at(at_out + a * size, b - a, value)
            lo, hi = j, nse  # e: the first key >= b (a binary search)
            while lo < hi:
                mid = (lo + hi) >> 1
                if keys[mid] < b:
                    lo = mid + 1
                else:
                    hi = mid
            e = lo
            for i in range(j, e):
                out[keys[i]] = vals[i]
            j = e

    @njit(cache=True, nogil=True)
    def count_differ(at_x, n, fill, like):  # pragma: no cover (compiled)
        # the elements != fill (NaN == NaN): a vectorized count
        x, f, c = carray(address(at_x, like), n), like.dtype.type(fill), 0
        if f != f:
            for i in range(n):
                c += x[i] == x[i]
        else:
            for i in range(n):
                c += x[i] != f
        return c

    @njit(cache=True, nogil=True, inline="always")
    def any_differ(x, a, f, nan):  # pragma: no cover (compiled)
        hit = False  # (a fixed trip count: vectorized)
        if nan:
            for i in range(a, a + _FIND_BLOCK):
                hit |= x[i] == x[i]
        else:
            for i in range(a, a + _FIND_BLOCK):
                hit |= x[i] != f
        return hit

    @njit(cache=True, nogil=True)
    def find_differ(at_x, n, fill, like, at_keys, at_vals, nse):  # pragma: no cover (compiled)
        # a block with no differing element costs a vectorized test; in the others every element
        # is written at k and k advances by the test (branch-free: random patterns defeat a
        # predictor), unguarded while more than a block of places is left
        x, f = carray(address(at_x, like), n), like.dtype.type(fill)
        keys, vals = (
            carray(address(at_keys, np.int64), nse),
            carray(address(at_vals, like), nse),
        )
        nan, k, B = f != f, 0, _FIND_BLOCK
        for a in range(0, n, B):
            b = min(a + B, n)
            if b - a == B and not any_differ(x, a, f, nan):
                continue
            if nse - k > B:
                for i in range(a, b):
                    v = x[i]
                    keys[k], vals[k] = i, v
                    k += (v == v) if nan else (v != f)
            else:
                for i in range(a, b):
                    v = x[i]
                    if k < nse:
                        keys[k], vals[k] = i, v
                    k += (v == v) if nan else (v != f)
        return k

    return fill_scatter, count_differ, find_differ


def _stos_ready() -> bool:
    """Whether the fill kernel may use x86-64's ``rep stos`` (LLVM's inline assembly needs its
    parser)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        import llvmlite.binding

        llvmlite.binding.initialize_native_asmparser()
    except Exception:  # pragma: no cover - an llvmlite without it: the loop
        return False
    return True


_SCATTER_MIN = 4096  # stored values from which put_flat takes the compiled loop (CPU)
_SCATTER_DTYPES = {
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
}


def put_flat(out: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """``out.put_(keys, vals)`` for unique int64 ``keys`` into a contiguous ``out`` (1-d ``vals``):
    on CPU with numba, from ``_SCATTER_MIN`` values, one compiled loop (10-20% less than ``put_``
    into a freshly filled 4 MB buffer at 1-10% stored, the speed of torch's own sparse
    ``to_dense``).

    >>> put_flat(torch.zeros(5), torch.tensor([3, 0]), torch.tensor([7., 8.])).tolist()
    [8.0, 0.0, 0.0, 7.0, 0.0]
    """
    if (
        keys.numel() >= _SCATTER_MIN
        and out.is_cpu
        and vals.dtype in _SCATTER_DTYPES
        and vals.dtype == out.dtype
        and keys.dtype == torch.int64
        and out.is_contiguous()
        and not (vals.requires_grad or out.requires_grad or vals.is_conj() or vals.is_neg())
        and _by_address(out, keys, vals)
        and _compiled()
    ):
        _kernels[2](out.view(-1).numpy(), keys.reshape(-1).numpy(), vals.numpy())
        return out
    return out.put_(keys, vals)


_FIND_DTYPES = _SCATTER_DTYPES - {
    torch.complex64,
    torch.complex128,
}  # (complex: != component by component)
_FIND_BLOCK = (
    64  # elements per test of find_differ (1M float32: 64 best of 16-128 at 0.01-50% stored)
)
# elements from which a to_sparse imports numba for find_differ (below: torch ops unless loaded)
_FIND_MIN = 1 << 16


def find_differ(x: torch.Tensor, fill: torch.Tensor):
    """``(keys, values)`` of the elements of ``x`` that differ from the 0-d ``fill`` (NaN equal to
    NaN), keys ascending: ``keys == (x.view(-1) != fill).nonzero()[:, 0]`` and ``values ==
    x.view(-1)[keys]`` for a non-NaN fill.  Two compiled passes on CPU (a vectorized count, then the
    writes; 1M float32 at 0.01-1% stored: 5-10x less than ``nonzero``, which alone costs 1.6 ms);
    None where it does not apply (other devices, complex or other dtypes, a non-contiguous ``x``,
    negative bits, a ``fill`` of another dtype or not 0-d, autograd recording, tracing, no numba).

    >>> r = find_differ(torch.tensor([1., 5., 1., 7.]), torch.tensor(1.))
    >>> r is None or [t.tolist() for t in r] == [
    ...     [1, 3],
    ...     [5.0, 7.0],
    ... ]  # (None: numba not loaded, 4 elements)
    True
    """
    if not (
        x.is_cpu
        and fill.is_cpu
        and x.dtype in _FIND_DTYPES
        and fill.dtype == x.dtype
        and fill.dim() == 0
        and type(x) is torch.Tensor
        and x.is_contiguous()
        and not x.is_neg()
        and not traced(x)
        and not (torch.is_grad_enabled() and x.requires_grad)
        and ("numba" in sys.modules or x.numel() >= _FIND_MIN)
        and _compiled()
    ):
        return None
    if torch._C._functorch.is_functorch_wrapped_tensor(x) or not _by_address(x):
        return None
    like, n, at, f = _LIKE[x.dtype], x.numel(), x.data_ptr(), fill.item()
    nse = _kernels[4](at, n, f, like)
    keys, vals = torch.empty(nse, dtype=torch.int64), torch.empty(nse, dtype=x.dtype)
    _kernels[5](at, n, f, like, keys.data_ptr(), vals.data_ptr(), nse)
    return keys, vals


# bytes per block of fill_put_sorted (inside L1d; 1M float32, 1-10% stored: 4% less than 128 KiB)
_FILL_BYTES = 1 << 15
# its float32 elements (from this size on, a to_dense loads numba for the pass)
_FILL_BLOCK = _FILL_BYTES // 4


def fill_put_sorted(
    out: torch.Tensor, fill: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor
) -> bool:
    """``out.fill_(fill).put_(keys, vals)`` for strictly increasing int64 ``keys`` (a coalesced
    pattern's), 0-d ``fill``, 1-d ``vals`` and a contiguous ``out`` of their dtype, on CPU with
    numba: one compiled pass that fills a 32 KiB block and writes the values falling in it while its
    lines are still in cache (faster than a whole ``fill_`` then the scatter: the buffer is read
    from memory once).  On x86-64 a block is filled by ``rep stos`` (fast-string stores: no read of
    the lines first, slightly faster than ``np.full`` or ``torch.full``).  True when done; False,
    ``out`` untouched, where it does not apply (other devices or dtypes, a non-contiguous operand,
    negative or conjugate bits of ``vals``, ``keys`` and ``vals`` of different lengths, no numba,
    torch's ops being recorded: :func:`_recording`); a RuntimeError for a freed storage (address 0).

    >>> out, keys, vals = torch.empty(5), torch.tensor([0, 3]), torch.tensor([8., 7.])
    >>> if not fill_put_sorted(out, torch.tensor(-1.), keys, vals):
    ...     _ = out.fill_(-1.).put_(keys, vals)  # (no numba)
    >>> out.tolist()
    [8.0, -1.0, -1.0, 7.0, -1.0]
    """
    # the kernel reads and writes at the tensors' addresses: every condition below is needed
    # (vals.numel(), not vals.shape[0]: cheaper; one dict look-up)
    if (
        not (
            (_kernels or _compiled())
            and fill.dim() == 0
            and vals.dim() == 1
            and out.is_cpu
            and vals.is_cpu
            and keys.is_cpu
            and fill.is_cpu
            and vals.dtype == (dtype := out.dtype) == fill.dtype
            and keys.dtype is _INT64
            and keys.numel() == (nse := vals.numel())
            and out.is_contiguous()
            and vals.is_contiguous()
            and keys.is_contiguous()
            and not (vals.is_neg() or vals.is_conj())
        )
        or (run := _FILL_ENTRY.get(dtype) or _fill_entry(dtype)) is None
        or _recording()
    ):
        return False
    # (the fill is read at its address too: its value, with the bits applied)
    if fill.is_neg() or fill.is_conj():
        fill = fill.resolve_conj().resolve_neg()
    at_fill, at_keys, at_vals = fill.data_ptr(), keys.data_ptr(), vals.data_ptr()
    # (torch's fill_, put_ would crash on address 0)
    if not at_fill or nse and not (at_keys and at_vals):
        raise RuntimeError(
            "to_dense: the storage of the SparseTensor's "
            + ("fill" if not at_fill else "values" if not at_vals else "indices")
            + " was freed (data_ptr() is 0 for "
            "a tensor with elements; untyped_storage().resize_(0), as FSDP frees parameters)"
        )
    entry, like = run
    entry(out.data_ptr(), out.numel(), at_fill, at_keys, at_vals, nse, like)
    return True


def _by_address(*tensors) -> bool:
    """The compiled kernels may read and write ``tensors`` at their addresses: nothing records
    torch's ops (see :func:`_recording`) and no storage was freed (``resize_(0)``, as FSDP does:
    address 0)."""
    return not _recording() and all(t.data_ptr() or not t.numel() for t in tensors)


def _recording() -> bool:
    """``torch.jit.trace`` or ``make_fx(tracing_mode="real")`` records torch's ops on real data: a
    replay would run them alone, without a compiled kernel's writes (uninitialized memory), so the
    kernels step aside."""
    return _jit_state() is not None or _dispatch_mode(_PROXY) is not None


_FILL_ENTRY = {}  # dtype -> (the compiled fill_put_sorted pass for it, its element type)
# (bound here: no module attribute look-up per call)
_INT64, _jit_state, _dispatch_mode = (
    torch.int64,
    torch._C._get_tracing_state,
    torch._C._get_dispatch_mode,
)
_PROXY = torch._C._TorchDispatchModeKey.PROXY


def _fill_entry(dtype):
    """``(entry, like)``: the fill pass's compiled entry point for ``dtype`` (called directly it
    skips numba's dispatcher, its type resolution of each argument on every call) and its element
    type; None for a dtype the pass does not read."""
    if (like := _LIKE.get(dtype)) is None:
        return None
    kernel, like = (
        _kernels[3],
        like.dtype.type,
    )  # (a type, not an array: no array to unbox per call)
    run = _FILL_ENTRY[dtype] = (
        kernel.compile(tuple(kernel.typeof_pyval(a) for a in (0,) * 6 + (like,))),
        like,
    )
    return run


# dtype -> an empty NumPy array of that dtype (the kernels' element type), with the kernels
_LIKE = {}


def _path(a: torch.Tensor, b: torch.Tensor, compiled) -> str:
    """``"numba"`` (the compiled pass), ``"unique"`` (CPU without numba:
    :func:`_kernels.index.unique_inverse`'s merge of the presorted runs, 4x faster there than the
    binary searches) or ``"search"`` (torch ops, any device)."""
    if compiled is not None:
        return "numba" if compiled and _compiled() else "search"
    if a.device.type != "cpu" or b.device.type != "cpu" or _recording():
        return "search"
    if ("numba" in sys.modules or a.numel() + b.numel() >= _COMPILED_MIN) and _compiled():
        return "numba"
    return "unique"


def _check(a: torch.Tensor, b: torch.Tensor):
    if a.dim() != 1 or b.dim() != 1 or a.dtype != torch.int64 or b.dtype != torch.int64:
        raise TypeError(
            f"merge: keys must be 1-d int64 tensors, got {a.dtype} of shape {tuple(a.shape)} "
            f"and {b.dtype} of shape {tuple(b.shape)}"
        )
    if a.device != b.device:
        raise ValueError(f"merge: keys on different devices, {a.device} and {b.device}")


def merge_union(a: torch.Tensor, b: torch.Tensor, *, compiled: bool | None = None):
    """``(union, pa, pb)`` of strictly increasing int64 runs: ``union[pa] == a``, ``union[pb] ==
    b``.

    ``compiled``: the numba kernel (True) or torch's binary searches (False); None chooses
    (:func:`_path`).
    """
    _check(a, b)
    path = _path(a, b, compiled)
    if path == "unique":
        union, inv = _index.unique_inverse(torch.cat([a, b]))
        return union, inv[: a.numel()], inv[a.numel() :]
    if path == "numba":
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty(a.numel() + b.numel(), dtype=torch.int64)
        pa, pb = torch.empty_like(a), torch.empty_like(b)
        k = _kernels[0](a.numpy(), b.numpy(), out.numpy(), pa.numpy(), pb.numpy())
        return out[:k], pa, pb
    # torch ops: sa[j] = #{a < b[j]}; b[j] found in a or new; new keys before j shift b[j]'s place
    a, b = a.contiguous(), b.contiguous()
    sa = torch.searchsorted(a, b)
    found = (
        a[sa.clamp(max=max(a.numel() - 1, 0))] == b
        if a.numel()
        else torch.zeros_like(b, dtype=torch.bool)
    )
    new = ~found
    before = torch.cumsum(new, 0).sub_(new.long())
    pb = sa + before
    pa = torch.arange(a.numel(), device=a.device) + torch.searchsorted(b[new], a)
    out = a.new_empty(a.numel() + int(new.sum()))
    out[pa] = a
    out[pb] = b
    return out, pa, pb


def union_or_superset(a: torch.Tensor, b: torch.Tensor):
    """:func:`merge_union`'s ``(union, pa, pb)``, except where one run holds every key of a run at
    most 1/16 its length (a gradient's pattern beside the forward's): that run is the union (the
    same tensor) and its
    positions, the identity, are None; the other's come from a binary search, no merge::

        union, pa, pb = union_or_superset(a, b):
            union[pa] == a (union is a where pa is None), likewise b

    >>> a, b = torch.arange(0, 80, 2), torch.tensor([4, 10])
    >>> union, pa, pb = union_or_superset(a, b)
    >>> union is a, pa, pb.tolist()
    (True, None, [2, 5])
    """
    na, nb = a.numel(), b.numel()
    if (
        16 * min(na, nb) < max(na, nb)
        and not traced(a)
        and not traced(b)
        and a.device.type != "meta"
    ):
        big, small = (a, b) if na > nb else (b, a)
        pos, found = _index.lookup(big, small)
        if bool(found.all()):
            return (big, None, pos) if big is a else (big, pos, None)
    return merge_union(a, b)


def merge_intersect(a: torch.Tensor, b: torch.Tensor, *, compiled: bool | None = None):
    """``(common, ia, ib)``: the keys in both strictly increasing int64 runs, ascending, and their
    positions (``a[ia] == b[ib] == common``)."""
    _check(a, b)
    if _path(a, b, compiled) == "numba":
        a, b = a.contiguous(), b.contiguous()
        n = min(a.numel(), b.numel())
        ia, ib = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
        k = _kernels[1](a.numpy(), b.numpy(), ia.numpy(), ib.numpy())
        return a[ia[:k]], ia[:k], ib[:k]
    if not a.numel() or not b.numel():
        e = a.new_empty(0)
        return e, e, e.clone()
    a, b = a.contiguous(), b.contiguous()
    sa = torch.searchsorted(a, b).clamp_(max=a.numel() - 1)
    ib = (a[sa] == b).nonzero().squeeze(1)
    return b[ib], sa[ib], ib


def union_inverse(keys: list[torch.Tensor]):
    """``(union, [positions of each run's keys in union])`` of strictly increasing int64 runs: a
    fold of :func:`merge_union` (``union[pos[t]] == keys[t]``); while tracing, ``torch.unique`` of
    the concatenation."""
    if any(traced(k) for k in keys) or keys[0].device.type == "meta":
        union, inverse = _index.unique_inverse(torch.cat(keys))
        return union, list(inverse.split([k.numel() for k in keys]))
    union, pos = keys[0], [None]  # (None: the identity, no gather)
    for k in keys[1:]:
        union, pu, pk = merge_union(union, k)
        pos = [pu if p is None else pu[p] for p in pos] + [pk]
    return union, [
        torch.arange(union.numel(), device=union.device) if p is None else p for p in pos
    ]
