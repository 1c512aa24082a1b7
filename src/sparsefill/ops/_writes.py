"""Storage writes: an in-place result stored into an existing SparseTensor, which keeps its
identity.

    assign_(A, new).to_dense() == new.to_dense()        and ``A`` is still the same Python object

Lower than every op handler and the densify fallback (which write their in-place results through
here).
"""

from __future__ import annotations


import torch
from torch.utils._mode_utils import no_dispatch

from sparsefill._kernels.trace import same_tensor, traced
from sparsefill._tensor.parts import dense_to_sparse
from sparsefill._tensor.tensor import _STATE, SparseTensor


def assign_(A: SparseTensor, new: SparseTensor) -> SparseTensor:
    """Make ``A`` hold ``new``'s storage and fill (same shape, dtype and device)."""
    if (
        new._size != A._size
        and tuple(new._size) != tuple(A._size)
        or new._vals.dtype != A._vals.dtype
    ):
        # (the sizes made with, not .shape/.dtype: those go through __torch_function__)
        raise ValueError(
            f"cannot store a result of shape {tuple(new.shape)} and dtype {new.dtype} in a "
            f"SparseTensor of shape {tuple(A.shape)} and dtype {A.dtype}: a SparseTensor's shape "
            "and dtype are fixed, so in-place ops that change them (resize_, t_, unsqueeze_...) "
            "are not supported"
        )
    if traced(A._vals) and _traced_write_(A, new):  # torch.compile (see _traced_write_)
        return A
    if A._write_shared_(new):  # shared memory (share_memory_, another process) is written in place
        return A
    for name in _STATE[:-1]:  # everything but the view relation
        setattr(A, name, getattr(new, name))
    return A


# SparseTensors a view was taken of (``views.track`` marks them) have a fixed shape (see
# ``reshape_``).  The mark is an attribute that pickles and copies leave out
# (``_tensor.TRANSIENT``): a copy, a pickle or a loaded file of one has no views.  (Not a weak
# reference: ``torch.utils.swap_tensors`` refuses a tensor that has one, and nn.Module conversions
# swap parameters.)
def mark_viewed(A: SparseTensor) -> None:
    """Remember that a view of ``A`` was taken."""
    A._has_views = True


def viewed(A: SparseTensor) -> bool:
    return A.__dict__.get("_has_views", False)


def unmark_viewed(A: SparseTensor) -> None:
    A.__dict__.pop("_has_views", None)


def reshape_(A: SparseTensor, new: SparseTensor, func, args, kwargs) -> SparseTensor:
    """An in-place view op (``A.unsqueeze_(0)``, ``A.t_()``: ``func``) whose out-of-place result is
    ``new``: ``A`` keeps its identity and takes ``new``'s shape, storage and fill, as a dense tensor
    keeps its storage and takes new sizes.  torch's derivative formulas do this to their
    intermediates (``unsqueeze_`` in group_norm's).  Refused (ValueError, nothing modified) where
    another SparseTensor would have to follow: a view of a base, or a base with views
    (:func:`viewed`), and while torch.compile traces."""
    if A._view is not None or viewed(A) or traced(A._vals):
        raise ValueError(
            f"{func}: a SparseTensor that is a view, has views or is traced keeps its shape "
            f"{tuple(A.shape)} (its views would not follow): use the out-of-place op"
        )
    # the wrapper's own sizes and strides: func on it, dispatched to meta (as torch's
    with no_dispatch():
        # return_and_correct_aliasing does for subclasses)
        meta = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            func(A, *args[1:], **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta)
    for name in _STATE[:-1]:
        setattr(A, name, getattr(new, name))
    return A


def _traced_write_(A: SparseTensor, new: SparseTensor) -> bool:
    """``assign_`` while torch.compile traces; True when done here, False to rebind ``A``'s tensors
    as in eager.

    AOTAutograd sees a compiled function's write into a SparseTensor *input* only as writes into its
    inner tensors (it writes the result back with ``input.copy_(result)``): rebinding ``A._vals`` to
    another tensor there is lost, and the input silently kept its old values.  So:

    * dynamo's fake propagation: a result whose inner tensors do not have ``A``'s sizes (another
      pattern) or another layout or coalesced flag raises: a graph break, the op runs eagerly,
      exactly (``fullgraph=True``: an error naming sparsefill);
    * AOTAutograd's trace (functional inner tensors, which record writes): a result of ``A``'s inner
      sizes is copied into ``A``'s inner tensors; another (an intermediate's new pattern) rebinds
      them;
    * AOTAutograd's write-back into an input (``A`` fake, ``new`` functional): ``new``'s inner
      tensors are copied into ``A``'s (those that changed), which the graph records as the input's
      mutation."""
    from torch.fx.experimental.symbolic_shapes import (
        statically_known_true,
        sym_eq,
    )  # sympy: only when traced

    names = (("_idx",) if A._sf_layout is torch.sparse_coo else ("_crow", "_col")) + (
        "_vals",
        "_fill",
    )
    pairs = [(getattr(A, n), getattr(new, n)) for n in names]
    same = (new._sf_layout, new._indefinite, new._coalesced) == (
        A._sf_layout,
        A._indefinite,
        A._coalesced,
    ) and all(
        a is b or a.dtype == b.dtype and statically_known_true(sym_eq(a.shape, b.shape))
        for a, b in pairs
    )
    if _functional(A._vals):
        if not same:
            return False
    elif _functional(new._vals):
        if not same:
            raise NotImplementedError(
                f"sparsefill: torch.compile writes a result of another pattern into a "
                f"SparseTensor input (inner sizes {[tuple(b.shape) for _, b in pairs]} for "
                f"{[tuple(a.shape) for a, _ in pairs]})"
            )
        from torch._functorch._aot_autograd.functional_utils import from_fun

        pairs = [(a, from_fun(b)) for a, b in pairs]
    elif not same:
        raise NotImplementedError(
            "sparsefill: an in-place op that changes a SparseTensor's pattern (or its layout "
            "or coalesced flag) does not trace under torch.compile"
        )
    else:
        return False
    for a, b in pairs:
        # (an index tensor the operands share: no write, whose copy AOTAutograd
        if not same_tensor(a, b):
            a.copy_(b)  # would make once per input that holds it)
    A._zero = new._zero
    return True


def _functional(t: torch.Tensor) -> bool:
    """``t`` is a tensor of AOTAutograd's functionalized trace."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(t, FunctionalTensor) or torch._is_functional_tensor(t)


def respecify_(A: SparseTensor, x: torch.Tensor) -> SparseTensor:
    """Store dense ``x`` in ``A``, keeping ``A``'s fill, layout and dense dims."""
    return assign_(
        A,
        dense_to_sparse(x, A._fill, A._indefinite, A._fill_is_zero(), A._sf_layout, A.dense_dim()),
    )
