"""Parts from outside: a SparseTensor rebuilt from a file, a pickle, a ``torch.multiprocessing``
queue (a DataLoader worker) or a deep copy is checked before anything indexes memory with its
indices.

Every such path ends in ``sparsefill._tensor._rebuild(size, inner, ctx, requires_grad, extra)``
(what ``SparseTensor.__reduce_ex__`` names; ``torch.load(weights_only=True)`` allows that function
alone), which calls :func:`rebuild`::

    rebuild(*A.__reduce_ex__(2)[1]) == A             (a valid A: same layout, pattern, values, fill)
    rebuild(parts that break an invariant) raises ValueError naming the part and the numbers

The check is :func:`sparsefill._creation.check_parts` (the constructors' ``check_invariants=True``),
always on for these paths: one vectorised pass over the indices, O(nse + nrows), nothing dense.
torch's legacy (non-zip) ``torch.load`` reads the tensors' bytes only after unpickling; there the
check runs when torch validates its own sparse tensors, at the end of the load (:func:`_defer`),
before ``torch.load`` returns.
"""

from __future__ import annotations

import sys
import threading

import torch

from sparsefill import _torch_compat

from sparsefill._tensor.validate import check_parts

__all__ = ["rebuild"]

_NAMES = {
    torch.sparse_coo: ("_idx", "_vals", "_fill"),
    torch.sparse_csr: ("_crow", "_col", "_vals", "_fill"),
}
_PUBLIC = {
    "_idx": "indices",
    "_crow": "crow_indices",
    "_col": "col_indices",
    "_vals": "values",
    "_fill": "fill",
}


def rebuild(size, inner, ctx, requires_grad, extra=None):
    """The SparseTensor of ``SparseTensor.__reduce_ex__``'s parts, checked (ValueError
    otherwise)."""
    from sparsefill._tensor.tensor import _STATE, SparseTensor

    layout, indefinite, coalesced = _context(ctx)
    names = _NAMES[layout]
    if not isinstance(inner, dict) or set(inner) != set(names):
        got = sorted(inner) if isinstance(inner, dict) else type(inner).__name__
        raise ValueError(
            f"invalid SparseTensor parts: a {layout} tensor is stored as {list(names)}, got {got}"
        )
    fake = torch._subclasses.fake_tensor.FakeTensor
    odd = [
        n
        for n in names
        if isinstance(inner[n], torch.Tensor)
        and type(inner[n]) is not torch.Tensor
        and not isinstance(inner[n], fake)
    ]
    # (a subclass answers the checks' ops itself: only the tensor a file or copy holds is checked)
    if odd:
        raise ValueError(
            f"invalid SparseTensor parts: {_PUBLIC[odd[0]]} must be a plain torch.Tensor, got "
            f"{type(inner[odd[0]]).__name__}"
        )
    if not isinstance(requires_grad, bool):
        raise ValueError(
            f"invalid SparseTensor parts: requires_grad must be a bool, got {requires_grad!r}"
        )
    extra = _extra(extra, _STATE)
    parts = (
        layout,
        size,
        inner["_vals"],
        inner["_fill"],
        inner.get("_idx"),
        inner.get("_crow"),
        inner.get("_col"),
    )
    frame = _legacy_load_frame()
    if frame is None:
        _check(parts, indefinite, coalesced)
    else:
        _check_shapes_now(parts, indefinite, coalesced)
        _defer(frame, parts, indefinite, coalesced)
    t = SparseTensor._make(
        layout,
        tuple(int(s) for s in size),
        inner["_vals"],
        inner["_fill"],
        inner.get("_idx"),
        inner.get("_crow"),
        inner.get("_col"),
        indefinite,
        coalesced or layout is torch.sparse_csr,
        False,
    )
    for k, v in extra.items():
        setattr(t, k, v)
    return t.requires_grad_(True) if requires_grad else t


def _context(ctx):
    """``(layout, indefinite, coalesced)`` of the flatten metadata (a 4th entry, from files of older
    releases or a compiled tangent's, is ignored: a loaded tensor is no tangent)."""
    if (
        not isinstance(ctx, (tuple, list))
        or len(ctx) < 3
        or ctx[0] not in _NAMES
        or not all(isinstance(f, bool) for f in ctx[1:3])
    ):
        raise ValueError(
            "invalid SparseTensor parts: the metadata must be (layout, indefinite, coalesced) "
            f"with layout torch.sparse_coo or torch.sparse_csr, got {ctx!r}"[:300]
        )
    return ctx[0], ctx[1], ctx[2]


def _extra(extra, state) -> dict:
    """The instance attributes stored beside the parts (``_is_param`` of an ``nn.Parameter``): never
    a part of the storage nor a name of the class (a property or method), which would bypass the
    check."""
    from sparsefill._tensor.tensor import SparseTensor

    if extra is None:
        return {}
    bad = (
        [
            k
            for k in extra
            if not isinstance(k, str)
            or k in state
            or k.startswith("__")
            or hasattr(SparseTensor, k)
        ]
        if isinstance(extra, dict)
        else [extra]
    )
    if bad:
        raise ValueError(
            f"invalid SparseTensor parts: the extra attributes may not set {bad[:4]!r}"[:300]
        )
    return extra


def _check(parts, indefinite, coalesced) -> None:
    layout, size, vals, fill, idx, crow, col = parts
    try:
        check_parts(
            layout, size, vals, fill, idx, crow, col, indefinite=indefinite, coalesced=coalesced
        )
    except (ValueError, TypeError, IndexError) as e:
        raise ValueError(
            f"invalid SparseTensor parts (size {_size(size)}, {layout}): {e}"
        ) from None


def _check_shapes_now(parts, indefinite, coalesced) -> None:
    """Everything but the data (not read yet): on meta tensors of the parts' shapes."""
    meta = [
        None
        if t is None
        else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        if isinstance(t, torch.Tensor)
        else t
        for t in parts[2:]
    ]
    _check(parts[:2] + tuple(meta), indefinite, coalesced)


def _size(size):
    return tuple(size) if isinstance(size, (tuple, list, torch.Size)) else size


# ---------------------------------------------------------------------- torch's legacy load: data
# comes later
_LEGACY = getattr(getattr(torch.serialization, "_legacy_load", None), "__code__", None)
_pending = threading.local()


def _legacy_load_frame():
    """The frame of torch's legacy ``_legacy_load`` this call runs under (its tensors' bytes are
    read after the unpickler returns), or None."""
    f = sys._getframe(2)
    for _ in range(6):
        if f is None:
            return None
        if f.f_code is _LEGACY:
            return f
        f = f.f_back
    return None


def _defer(frame, parts, indefinite, coalesced) -> None:
    """Check ``parts`` when ``frame``'s load validates its sparse tensors (after reading every
    byte)."""
    _torch_compat.check_before_legacy_validation(_check_deferred)
    if not hasattr(_pending, "items"):
        _pending.items = []
    _pending.items.append((id(frame), parts, indefinite, coalesced))


def _check_deferred():
    """Check the SparseTensors that this load deferred (the load's frame calls torch's validation,
    which calls this); those of a load that failed earlier are dropped."""
    me = id(sys._getframe(2))
    items, _pending.items = getattr(_pending, "items", []), []
    for frame, parts, indefinite, coalesced in items:
        if frame == me:
            _check(parts, indefinite, coalesced)
