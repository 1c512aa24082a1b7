"""Element-wise activations whose aten kernels are not plain pointwise ops.

* ``log_sigmoid_forward`` returns ``(output, buffer)``; the buffer is a kernel workspace:
  element-wise on CPU (then sparse like the output), empty on other devices (passed through).
* ``rrelu_with_noise`` in evaluation mode is ``leaky_relu`` with slope ``(lower + upper) / 2``
  (as aten computes it); in training it draws one slope per element and densifies.
"""

from __future__ import annotations

import torch

from .._convert import coalesce_of, rewrap
from .._tensor import SparseTensor
from .registry import register

aten = torch.ops.aten


@register(aten.log_sigmoid_forward.default)
def _log_sigmoid_forward(func, args, kwargs):
    A = args[0] if args[0]._coalesced else coalesce_of(args[0])
    out_v, buf_v = func(A._vals)
    if A._indefinite:
        return tuple(rewrap(A, values=v, fill=v.new_empty(0), known_zero=False) if v.shape == out_v.shape else v
                     for v in (out_v, buf_v))
    out_f, buf_f = func(A._fill[None])
    return (rewrap(A, values=out_v, fill=out_f[0], known_zero=False),
            rewrap(A, values=buf_v, fill=buf_f[0], known_zero=False) if buf_v.shape == out_v.shape else buf_v)


@register(aten.rrelu_with_noise.default)
def _rrelu_with_noise(func, args, kwargs):
    kw = dict(zip(["noise", "lower", "upper", "training", "generator"], args[1:]), **kwargs)
    if kw.get("training", False) or not isinstance(args[0], SparseTensor):
        return NotImplemented
    return aten.leaky_relu.default(args[0], (kw.get("lower", 1 / 8) + kw.get("upper", 1 / 3)) / 2)
