"""``torch._foreach_*`` ops (optimizers' multi-tensor steps): the per-tensor op on every list
element.

``_foreach_f(xs, ys, alpha=a)[i] == f(xs[i], ys[i], alpha=a)`` — list arguments (``Tensor[]``,
``Scalar[]`` and the per-tensor ``scalars`` tensor) are zipped, the others broadcast, so each
SparseTensor element takes its own handler (element-wise ops stay sparse).
"""

from __future__ import annotations

import torch

from sparsefill.ops.registry import register

aten = torch.ops.aten


_PER = {
    "maximum": "clamp_min",
    "minimum": "clamp_max",
    "maximum_": "clamp_min_",
    "minimum_": "clamp_max_",
}


def _foreach(func, args, kwargs):
    name = func._schema.name.split("::")[1][len("_foreach_") :]
    per = getattr(aten, _PER.get(name, name))  # the overload is chosen per call
    schema = func._schema.arguments
    zipped = {a.name for a in schema if a.type.kind() == "ListType" or a.name == "scalars"}
    names = [a.name for a in schema]

    def pick(name, v, i):
        if name not in zipped:
            return v
        return v.tolist()[i] if isinstance(v, torch.Tensor) else v[i]

    # addcmul/addcdiv take value keyword-only; their foreach forms pass it (or per-tensor scalars)
    # positionally
    kw_only = [j for j in range(3, len(args))] if per.__name__.startswith("addc") else []
    lists = [
        len(a) for j, a in enumerate(args) if names[j] in zipped and isinstance(a, (list, tuple))
    ]
    n = lists[0]
    if any(k != n for k in lists):
        raise RuntimeError(
            f"{func._schema.name}: every list argument must have the same number of elements "
            f"as the first ({n}); got lengths {lists}"
        )
    outs = [
        per(
            *[pick(names[j], a, i) for j, a in enumerate(args) if j not in kw_only],
            **{"value": pick(names[j], args[j], i) for j in kw_only},
            **{k: pick(k, v, i) for k, v in kwargs.items()},
        )
        for i in range(n)
    ]
    return None if not func._schema.returns else outs


for _name in sorted(
    {s.name for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::_foreach_")}
):
    # (dir(aten) lists only the ops loaded so far)
    register(getattr(aten, _name[len("aten::") :]))(_foreach)
