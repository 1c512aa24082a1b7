"""``hsplit``, ``vsplit``, ``dsplit`` and ``tensor_split`` of a SparseTensor as ``split`` with the
same piece sizes, so that their backward joins the pieces' gradients (``SplitWithSizesBackward0``:
``cat`` of them, which keeps a sparse gradient's pattern) instead of adding one gradient of the
input's shape per piece (torch's decomposition into slices: ``SliceBackward0`` embeds each piece's
gradient in zeros of the input's shape, and the sum of those embeddings stores the union of the
pieces -- every element where a piece's gradient has a fill of its own)::

    torch.hsplit(A, s) == torch.split(A, [p.shape[d] for p in torch.hsplit(probe, s)], d)

where ``probe`` is an empty tensor of ``A``'s shape (stride 0: no element allocated), which also
raises torch's errors for the sections or indices, with torch's words.

>>> import torch, sparsefill
>>> v = torch.tensor([1., 2.], requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor([[0, 4]], v, (6,), fill_value=3.)
>>> a, b = torch.hsplit(A, 2)
>>> G = torch.autograd.grad(a.sum() + b.sum(), A)[
...     0
... ]  # the pieces' gradients joined: A's pattern, fill 1
>>> G._nse(), float(G.fill_value())
(2, 1.0)
"""

from __future__ import annotations

import torch

from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route

T = torch.Tensor
_DIM = {"hsplit": lambda n: 1 if n > 1 else 0, "vsplit": lambda n: 0, "dsplit": lambda n: 2}


@register_route(
    torch.hsplit,
    T.hsplit,
    torch.vsplit,
    T.vsplit,
    torch.dsplit,
    T.dsplit,
    torch.tensor_split,
    T.tensor_split,
)
def _route_split(func, args, kwargs):
    """The pieces of ``func(A, ...)`` as ``torch.split(A, sizes, dim)``; ``NotImplemented`` for
    anything else."""
    A = args[0] if args else kwargs.get("input")
    if not isinstance(A, SparseTensor) or not A.requires_grad:
        return NotImplemented
    name = func.__name__
    if name == "tensor_split":
        dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
    else:
        dim = _DIM[name](A.dim())
    if not isinstance(dim, int) or isinstance(dim, bool):
        return NotImplemented
    # (stride 0: torch's errors and the pieces' shapes)
    probe = torch.empty((), dtype=A.dtype).expand(A.shape)
    pieces = (
        func(probe, *args[1:], **kwargs)
        if args
        else func(input=probe, **{k: v for k, v in kwargs.items() if k != "input"})
    )
    dim %= max(A.dim(), 1)
    return torch.split(A, [p.shape[dim] for p in pieces], dim)
