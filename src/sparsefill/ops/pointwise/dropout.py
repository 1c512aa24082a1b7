"""Dropout of a SparseTensor whose unspecified elements are zero or masked: only the stored values
are dropped.

Dense dropout zeroes each element with probability ``p`` and scales the others by ``1 / (1 - p)``;
an element that is 0 stays 0 and a masked-out element stays masked, so for a zero or indefinite
fill::

    dropout(A) == A * M
        M: A's pattern, values Bernoulli(1 - p) / (1 - p), fill 0 (indefinite: masked)

in distribution (the random stream differs from dense's), with the gradient ``G * M`` at the pattern
(the same-pattern product's).  Duplicates are summed first (a dense element is dropped whole).  A
nonzero fill makes the result dense by nature: torch's composite runs (the densify fallback,
warned).  Torch's CPU dropout is composite (``empty_like(A).bernoulli_(1 - p)``), so without this
route it stored every element.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 2.], (4,), fill_value=0.)
>>> out = torch.nn.functional.dropout(A, 0.5)
>>> type(out).__name__, out._nse(), set(out.to_dense().tolist()) <= {0., 2., 4.}
('SparseTensor', 2, True)
"""

from __future__ import annotations

import torch

from sparsefill._tensor.parts import rewrap
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route


@register_route(torch.nn.functional.dropout, torch.dropout, torch.dropout_, always=True)
def _dropout(func, args, kwargs):
    names = (
        ("input", "p", "training", "inplace")
        if func is torch.nn.functional.dropout
        else ("input", "p", "train")
    )
    a = dict(zip(names, args), **kwargs)
    A, p = a.get("input"), a.get("p", 0.5)
    train, inplace = (
        a.get("training", a.get("train", True)),
        a.get("inplace", func is torch.dropout_),
    )
    if (
        not isinstance(A, SparseTensor)
        or not (A._indefinite or A._fill_is_zero())
        or not isinstance(p, (int, float))
        or not 0 <= p <= 1
    ):
        return (
            NotImplemented  # (torch's composite: its errors, or the dense result of a nonzero fill)
        )
    if not train or p == 0:
        return A
    C = A if A._coalesced else A.coalesce()
    keep = (
        torch.zeros_like(C._vals)
        if p == 1
        else torch.empty_like(C._vals).bernoulli_(1 - p).div_(1 - p)
    )
    # (M's fill a +0: C's may be -0.0, a zero fill too, and -0.0 * -0.0 is 0.0 where dense keeps
    # -0.0 * 0)
    M = rewrap(
        C.detach(), values=keep, fill=torch.zeros_like(C._fill), known_zero=not C._indefinite
    )
    if not inplace:
        return C * M
    return A.mul_(M) if C is A else A.copy_(C * M)
