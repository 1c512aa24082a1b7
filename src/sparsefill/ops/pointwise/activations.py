"""Element-wise ops whose aten kernels are not plain pointwise ops.

* ``fill(A, v)`` / ``A.fill_(v)``: every element becomes ``v``: the pattern is kept, values and
  fill become ``v`` (the fill keeps the shape of A's dense dims when ``v`` is a tensor).

* ``log_sigmoid_forward`` returns ``(output, buffer)``; the buffer is a kernel workspace:
  element-wise on CPU (then sparse like the output), empty on other devices (passed through).
* ``rrelu_with_noise`` in evaluation mode is ``leaky_relu`` with slope ``(lower + upper) / 2``
  (as aten computes it); in training it draws one slope per element and densifies.
"""

from __future__ import annotations

import torch

from sparsefill._tensor.parts import coalesce_of, rewrap
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._writes import assign_
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
