"""The densify policy over torch's own derivative formulas (the backward of calls no route takes).

A call that no autograd route takes (``autograd_routes``) passes through to ``__torch_dispatch__``,
and autograd records *torch's* derivative formulas for it, above any handler: for a dense result
(the decomposition of ``einsum`` into ``bmm``, ``A * x``, a leaf's ``A @ X``) the gradient that such
a formula computes for a SparseTensor operand is a dense tensor of the operand's full shape
(``BmmBackward0``: ``grad @ mat2^T``), which sparsefill never sees being allocated.  :func:`gate`
therefore runs after every such call with a dense output that requires grad (a SparseTensor result
gets SparseTensor gradients from the routes and handlers: the first formula given a dense one is
that of a call with a dense result): it finds the call's own autograd nodes (those between its
outputs and its operands) whose gradient reaches a SparseTensor operand, and registers on each a
pre-hook that asks the densify gate *before* the formula
runs::

    check_densify(
        <node> of <op>, <dense bytes of the SparseTensor operands it differentiates>, by_nature=True
    )

when no gradient reaching the node is a SparseTensor (a formula on SparseTensor gradients runs
through the handlers, which ask the gate themselves).  So a byte limit holds in backward as in
forward: the formula raises :class:`~sparsefill.DensifyError` before allocating, instead of
allocating past the limit.  Such a gradient is dense by nature for what torch's formula computes (it
may vary over the unspecified elements), hence ``by_nature=True``: quiet by default,
``dense_by_nature="warn"``/``"raise"`` find or forbid them, and the byte limit applies in every
mode.  Nodes that form no dense tensor of their own (views of the gradient, ``sum``'s expand,
``add``'s pass-through) and sparsefill's own autograd Functions (as sparse as their forward) are not
gated.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 2.], (2, 2)).requires_grad_()
>>> y = A @ torch.ones(
...     2, 3
... )  # a leaf's gradient has dense semantics: MmBackward0's grad @ X^T, (2, 2)
>>> with sparsefill.densify_policy(limit_bytes=8):
...     y.sum().backward()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
sparsefill.DensifyError: MmBackward0 (torch's derivative formula of matmul) forms ...
"""

from __future__ import annotations

import functools

import torch

from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor

# nodes whose formula forms no dense tensor of their own: a view of the gradient, an expand of it
# (sum), the gradient itself (add, clone); a smaller one (expand's sum).  (select's, slice's and
# unbind's formulas scatter the gradient into zeros of the operand's shape: gated.)
_NO_DENSE = frozenset(
    f"{name}Backward{k}"
    for name in (
        "Permute",
        "Transpose",
        "T",
        "View",
        "ReshapeAlias",
        "UnsafeView",
        "Unsqueeze",
        "Squeeze",
        "Alias",
        "Expand",
        "Sum",
        "Add",
        "Clone",
        "Detach",
    )
    for k in range(4)
)
# nodes whose formula is element-wise arithmetic on the saved operands themselves (``dist``: ``(self
# - other) * f(grad, result)``): on SparseTensor operands it runs through the handlers, which ask
# the gate where they densify, and gives a SparseTensor gradient; a dense one is judged after the
# formula (never silent).
_ON_SAVED_OPERANDS = frozenset(
    f"{name}Backward{k}" for name in ("Dist", "Norm", "LinalgVectorNorm") for k in range(4)
)
_ACCUMULATE = type(torch.zeros((), requires_grad=True).view(()).grad_fn.next_functions[0][0])


def gate(out, func, args, kwargs) -> None:
    """Register the densify gate's pre-hooks on the autograd nodes of the call ``func(*args,
    **kwargs) -> out`` that differentiate one of its SparseTensor operands (see the module
    docstring)."""
    with torch._C.DisableTorchFunctionSubclass():  # (attribute reads of SparseTensors: no re-entry)
        outs = [
            t
            for t in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(t, torch.Tensor) and t.grad_fn is not None
        ]
        if not outs:
            return
        flat = [
            a
            for x in (*args, *kwargs.values())
            for a in (x if isinstance(x, (tuple, list)) else (x,))
            if isinstance(a, torch.Tensor) and a.grad_fn is not None
        ]  # (tensors: at most in a list)
        sparse = {(a.grad_fn, a.output_nr) for a in flat if isinstance(a, SparseTensor)}
        stop = {a.grad_fn for a in flat}
        name = getattr(func, "__name__", str(func))
        leads: dict = {}
        for t in outs:
            _walk(t.grad_fn, sparse, stop, leads, name)


def _walk(node, sparse, stop, leads, name) -> bool:
    """Whether ``node``'s gradient reaches a SparseTensor operand (``leads``: the memo); registers
    the gate on each node of the call that differentiates one densely."""
    if node in leads:
        return leads[node]
    leads[node] = False  # (a node is visited once)
    nbytes, shapes, reach, at = 0, [], False, []
    for i, (m, nr) in enumerate(node.next_functions):
        if m is None:
            continue
        if (m, nr) in sparse:
            hit = True
        elif type(m) is _ACCUMULATE:  # a leaf
            hit = isinstance(m.variable, SparseTensor)
        elif m in stop:
            hit = False
        else:
            hit = _walk(m, sparse, stop, leads, name)
        if hit:
            meta = m._input_metadata[nr]
            nbytes += _numel(meta.shape) * meta.dtype.itemsize
            shapes.append(tuple(meta.shape))
            reach = True
            at.append(i)
    leads[node] = reach
    if reach and node.name() not in _NO_DENSE and not _own_function(node):
        what = (
            f"{node.name()} (torch's derivative formula of {name}) forms the dense gradient of a "
            f"SparseTensor operand of shape {', '.join(map(str, shapes))}"
        )
        if node.name() in _ON_SAVED_OPERANDS:  # (runs through the handlers: judged by its result)
            node.register_hook(functools.partial(_judge, what, nbytes, at))
        else:
            node.register_prehook(functools.partial(_ask, what, nbytes))
    return reach


def _judge(what: str, nbytes: int, at, grad_inputs, grad_outputs):
    """After a formula that may have run on the pattern: a dense gradient for a SparseTensor operand
    was formed by torch's arithmetic on dense tensors, outside the handlers: the gate is asked
    (late, never silent)."""
    if any(
        isinstance(grad_inputs[i], torch.Tensor) and not isinstance(grad_inputs[i], SparseTensor)
        for i in at
        if i < len(grad_inputs)
    ):
        check_densify(what, nbytes, by_nature=True)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _own_function(node) -> bool:
    """A node of sparsefill's own ``autograd.Function`` (its backward asks the gate where it
    densifies)."""
    cls = getattr(node, "_forward_cls", None)
    return cls is not None and cls.__module__.startswith("sparsefill.")


def _ask(what: str, nbytes: int, grad_outputs):
    if not any(isinstance(g, SparseTensor) for g in grad_outputs):
        check_densify(what, nbytes, by_nature=True)
