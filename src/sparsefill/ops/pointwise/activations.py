"""Element-wise ops whose aten kernels are not plain pointwise ops.

* ``fill(A, v)`` / ``A.fill_(v)``: every element becomes ``v``: the pattern is kept, values and
  fill become ``v`` (the fill keeps the shape of A's dense dims when ``v`` is a tensor).

* ``log_sigmoid_forward`` returns ``(output, buffer)``; the buffer is a kernel workspace:
  element-wise on CPU (then sparse like the output), empty on other devices (passed through).
* ``glu(A, d) = a * sigmoid(b)`` with ``a, b`` the halves of ``A`` along ``d``: along a dense dim
  the halves share ``A``'s pattern (the product keeps it), along a sparse dim the product is over
  the union of the halves' patterns; the fill becomes ``f_a * sigmoid(f_b)``.  Its gradient is
  torch's formula on the halves, concatenated.
* ``rrelu_with_noise`` in evaluation mode is ``leaky_relu`` with slope ``(lower + upper) / 2``
  (as aten computes it); in training it draws one slope per element and densifies.
"""

from __future__ import annotations

import torch

from sparsefill._tensor.parts import coalesce_of, rewrap
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._writes import assign_
from sparsefill.ops.decomposed import decomposed
from sparsefill.ops.registry import register

aten = torch.ops.aten


@register(
    aten.fill.Scalar, aten.fill.Tensor, aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default
)
def _fill(func, args, kwargs):
    A, v = args[0], (args[1] if len(args) > 1 else 0)
    if not isinstance(A, SparseTensor) or isinstance(v, SparseTensor):
        return NotImplemented
    if isinstance(v, torch.Tensor) and v.dim():  # a Python number stays one (no float32 rounding)
        raise RuntimeError(
            f"fill_ only supports 0-dimension value tensor but got tensor with {v.dim()} "
            "dimensions."
        )
    # indefinite stays so
    fill = A._fill if A._indefinite else A._fill.new_empty(A._fill.shape).fill_(v)
    B = A if A._coalesced else coalesce_of(A)  # duplicates would sum to a multiple of v
    new = rewrap(B, values=B._vals.new_empty(B._vals.shape).fill_(v), fill=fill, known_zero=False)
    return assign_(A, new) if func._schema.name.endswith("_") else new


@register(aten.glu.default, aten.glu_backward.default)
def _glu(func, args, kwargs):
    """``glu`` and its gradient by torch's decompositions (halves by ``narrow``, element-wise
    products and ``cat``, each native), after torch's own checks on meta stand-ins.

    >>> import torch, sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 3]], [2., 5.], (4,), fill_value=0.)
    >>> torch.nn.functional.glu(A, 0).to_dense()
    tensor([1., 0.])
    """
    func(*_meta_args(args), **kwargs)
    return decomposed(func, args, kwargs)


def _meta_args(args):
    return [
        torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
        for a in args
    ]


@register(aten.log_sigmoid_forward.default)
def _log_sigmoid_forward(func, args, kwargs):
    A = args[0] if args[0]._coalesced else coalesce_of(args[0])
    out_v, buf_v = func(A._vals)
    if A._indefinite:
        return tuple(
            rewrap(A, values=v, fill=v.new_empty(0), known_zero=False)
            if v.shape == out_v.shape
            else v
            for v in (out_v, buf_v)
        )
    out_f, buf_f = func(A._fill[None])
    return (
        rewrap(A, values=out_v, fill=out_f[0], known_zero=False),
        rewrap(A, values=buf_v, fill=buf_f[0], known_zero=False)
        if buf_v.shape == out_v.shape
        else buf_v,
    )


@register(aten.rrelu_with_noise.default)
def _rrelu_with_noise(func, args, kwargs):
    kw = dict(zip(["noise", "lower", "upper", "training", "generator"], args[1:]), **kwargs)
    if kw.get("training", False) or not isinstance(args[0], SparseTensor):
        return NotImplemented
    return aten.leaky_relu.default(args[0], (kw.get("lower", 1 / 8) + kw.get("upper", 1 / 3)) / 2)


@register(aten.rrelu_with_noise_backward.default)
def _rrelu_with_noise_backward(func, args, kwargs):
    """The gradient of :func:`_rrelu_with_noise` in evaluation mode: ``leaky_relu``'s (as aten
    computes it)."""
    kw = dict(zip(["noise", "lower", "upper", "training", "self_is_result"], args[2:]), **kwargs)
    if kw["training"] and kw["upper"] - kw["lower"] > 1e-6:
        return NotImplemented
    return aten.leaky_relu_backward.default(
        args[0], args[1], (kw["lower"] + kw["upper"]) / 2, kw["self_is_result"]
    )
