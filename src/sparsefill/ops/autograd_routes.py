"""Autograd routes: torch functions whose backward must know the sparse pattern (torch's own
formula would form a dense gradient first; docs/architecture.md).

Autograd's derivative formulas run above ``__torch_dispatch__``: for ``A @ X`` torch computes the
gradient of the SparseTensor ``A`` as the dense ``G @ X^T`` (N x N) before any handler sees it.
``SparseTensor.__torch_function__`` therefore calls :func:`route` while grad mode is on:

* a function in ``ROUTES`` (registered per op family with :func:`register_route`, e.g. the
  matrix products of ``linalg_autograd.py``) runs through an ``autograd.Function`` whose
  backward is as sparse as its forward; a route returns ``NotImplemented`` to decline;
* any other function mixing a SparseTensor with a dense tensor that requires grad sees that tensor
  through :class:`DenseGrad`, so its gradient is dense (and torch's formulas for its SparseTensor
  operands ask the densify policy first: ``backward_gate.py``): a dense leaf's ``.grad`` is a dense
  tensor (torch's contract), never a SparseTensor (a torch native sparse COO/CSR tensor through
  ``_autograd.NativeGrad``: its ``.grad`` is a native sparse tensor of its layout);
* ``A.requires_grad_()`` / ``A.requires_grad = True`` (``nn.Parameter(A)`` too) on a SparseTensor
  leaf registers ``_autograd.LeafGradHook``: its ``.grad`` is a SparseTensor of its layout and dense
  dims, the gradient represented exactly (torch's contract: a leaf's gradient has the leaf's type);
* ``torch.sparse.sum(A)`` (``torch._sparse_sum``, whose composite body calls ``coalesce``, which
  checks for torch's sparse layout) is ``A.sum()``, in every grad mode;
* everything else (and everything with grad mode off) passes through as
  ``torch._C._disabled_torch_function_impl``: straight to ``__torch_dispatch__``, results never
  re-wrapped.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 2.], (2, 2), fill_value=3.)
>>> w = torch.ones(2, 2, requires_grad=True)
>>> (A * w).sum().backward()
>>> type(w.grad).__name__, w.grad.tolist()
('Tensor', [[3.0, 1.0], [2.0, 3.0]])
>>> L = A.detach().requires_grad_()
>>> (L * w).sum().backward()
>>> type(L.grad).__name__, L.grad.sparse_layout, L.grad.to_dense().tolist()
('SparseTensor', torch.sparse_coo, [[1.0, 1.0], [1.0, 1.0]])
"""

from __future__ import annotations

import sys

import torch

from sparsefill._autograd.functions import NativeGrad, dense_grad, sparse_inside, track_leaf
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.backward_gate import gate
from sparsefill.ops.out_variants import write_out

_REQUIRES_GRAD_, _REQUIRES_GRAD = (
    torch._C.TensorBase.requires_grad_,
    torch._C.TensorBase.requires_grad,
)
# ``A.requires_grad = True`` arrives as the descriptor's bound __set__
_SETTER = type(_REQUIRES_GRAD.__set__)
ROUTES: dict = {}  # torch function (as __torch_function__ receives it) -> route(func, args, kwargs)
# functions routed with grad mode off too (torch decomposes them above __torch_dispatch__)
ALWAYS: set = set()
# the functions route may take when every argument is a SparseTensor or a Python value, no keywords
# (ROUTES' and requires_grad_): SparseTensor.__torch_function__ does not call route for any other
# such call (route declines it)
ROUTED: set = {_REQUIRES_GRAD_, _REQUIRES_GRAD.__set__}


def register_route(*funcs, always: bool = False):
    """Decorator: ``route(func, args, kwargs)`` takes calls of ``funcs`` while grad mode is on
    (``always``: in every mode, for functions whose composite torch implementation cannot run on a
    SparseTensor)."""

    def deco(fn):
        for f in funcs:
            ROUTES[f] = fn
            ROUTED.add(f)
            if always:
                ALWAYS.add(f)
        return fn

    return deco


def route(func, types, args, kwargs):
    """The call's result, or ``NotImplemented`` for the plain pass-through."""
    if func is _DIM:  # (routed only for this check)
        if not _vmap_input():
            return NotImplemented
        raise NotImplementedError(
            "sparsefill: torch.func.vmap over a SparseTensor's dim is not supported (torch's "
            "batching rules would see its storage, and to_dense/values/fill_value would not run "
            "per example): pass it with in_dims=None (shared by every example), or loop: "
            "torch.stack([f(a) for a in A.unbind(0)])"
        )
    if (
        torch._C._are_functorch_transforms_active()
        and _masked_meets_transform(args, kwargs)
        and _differentiating()
    ):
        raise NotImplementedError(
            f"sparsefill: {getattr(func, '__name__', func)} of a SparseTensor with an indefinite "
            "fill and a tensor of a torch.func transform is not supported (the result, inside "
            "the transform, would be differentiated with dense semantics); use "
            "torch.autograd.grad, or a defined fill"
        )
    if func is _REQUIRES_GRAD_ or func.__class__ is _SETTER and func.__self__ is _REQUIRES_GRAD:
        out = torch._C._disabled_torch_function_impl(func, types, args, kwargs)
        # a leaf's .grad is a SparseTensor (_autograd.LeafGradHook)
        if isinstance(args[0], SparseTensor):
            with torch._C.DisableTorchFunctionSubclass():
                track_leaf(args[0])
        return out
    if not torch.is_grad_enabled() and func not in ALWAYS:
        return NotImplemented
    r = ROUTES.get(func)
    if r is not None:
        # attribute reads of SparseTensors: no re-entry
        with torch._C.DisableTorchFunctionSubclass():
            out = r(func, args, kwargs)
        if out is not NotImplemented:
            return out
    if not _needs_dense_grads(args, kwargs) or _writes(func, kwargs):
        return NotImplemented
    args = tuple(_dense_grad_arg(a) for a in args)
    kwargs = {k: _dense_grad_arg(v) for k, v in kwargs.items()}
    out = torch._C._disabled_torch_function_impl(func, types, args, kwargs)
    # torch's formulas for the SparseTensor operands: under the densify policy
    gate(out, func, args, kwargs)
    return out


_DIM = torch._C.TensorBase.dim
ROUTED.add(_DIM)  # (every A.dim() asks route: vmap's in_dims check is one)


def _vmap_input() -> bool:
    """``A.dim()`` called by ``torch.func.vmap`` checking the ``in_dims`` of its batched inputs (it
    reads the dim of an input only where its in_dim is not None): the SparseTensor is about to be
    batched."""
    # (route's caller: the op layer's loader, then SparseTensor.__torch_function__)
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            return False
        if (
            f.f_code.co_name == "_process_batched_inputs"
            and f.f_globals.get("__name__") == "torch._functorch.vmap"
        ):
            return True
        f = f.f_back
    return False


def _masked_meets_transform(args, kwargs) -> bool:
    """An indefinite-fill SparseTensor and a torch.func-wrapped tensor among the arguments (lists
    included)."""
    flat = [
        x for a in (*args, *kwargs.values()) for x in (a if isinstance(a, (list, tuple)) else (a,))
    ]
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(isinstance(a, SparseTensor) and a._indefinite for a in flat) and any(
        isinstance(a, torch.Tensor) and not isinstance(a, SparseTensor) and wrapped(a) for a in flat
    )


def _differentiating() -> bool:
    """A torch.func differentiation transform (grad, vjp, jacrev, jvp) is active (vmap alone reads
    no formula)."""
    T = torch._C._functorch.TransformType
    return any(
        i.key() in (T.Grad, T.Jvp) for i in torch._C._functorch.get_interpreter_stack() or ()
    )


# ---------------------------------------------------------------------- dense inputs get dense
# gradients
class DenseGrad(torch.autograd.Function):
    """``x -> x`` for a dense ``x``; a SparseTensor gradient reaching it is made dense.

    torch's formulas compute a dense input's gradient with the op's SparseTensor operand
    (``grad * A`` for ``A * w``), a SparseTensor; the input is dense, so its gradient is too
    (an indefinite gradient: 0 at the masked-out elements, which the forward did not read)."""

    generate_vmap_rule = True  # (a view: torch.func.vmap batches it as it batches view_as)

    @staticmethod
    def forward(x):
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        g = sparse_inside(g)
        if isinstance(g, SparseTensor):
            g = dense_grad(g)
        return g


def _is_dense_needing_grad(a) -> bool:
    """A dense or torch native sparse (COO/CSR) tensor needing a gradient: it gets one of its own
    layout."""
    return (
        isinstance(a, torch.Tensor)
        and not isinstance(a, SparseTensor)
        and a.requires_grad
        and a.layout in (torch.strided, torch.sparse_coo, torch.sparse_csr)
    )


def _grad_wrap(a):
    # (native: _autograd.native_grad)
    return DenseGrad.apply(a) if a.layout is torch.strided else NativeGrad.apply(a)


def _needs_dense_grads(args, kwargs) -> bool:
    for a in args:  # (per call: Python values and SparseTensors cost a type test each)
        if a.__class__ is SparseTensor or a.__class__ in _PLAIN:
            continue
        if (
            _is_dense_needing_grad(a)
            or isinstance(a, (list, tuple))
            and any(map(_is_dense_needing_grad, a))
        ):
            return True
    return bool(kwargs) and _needs_dense_grads(tuple(kwargs.values()), {})


_PLAIN = {
    int,
    float,
    bool,
    complex,
    type(None),
    str,
    torch.dtype,
    torch.device,
}  # arguments that are no tensor


def _dense_grad_arg(a):
    if _is_dense_needing_grad(a):
        return _grad_wrap(a)
    if isinstance(a, (list, tuple)) and any(map(_is_dense_needing_grad, a)):
        return type(a)(_grad_wrap(x) if _is_dense_needing_grad(x) else x for x in a)
    return a


_GRAPH_FUNCS = {torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward}
_INPLACE_DUNDERS = {
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "div",
    "mod",
    "pow",
    "matmul",
    "and",
    "or",
    "xor",
    "lshift",
    "rshift",
}


def _writes(func, kwargs) -> bool:
    """In-place and ``out=`` calls, ``__setitem__``, attribute setters (``w.data = A``), the
    ``*_as`` functions that only read a shape or dtype from their other argument, and autograd's own
    functions: their tensors are used as they are."""
    name = getattr(func, "__name__", "")
    if func in _GRAPH_FUNCS or getattr(func, "__module__", "").startswith("torch.autograd"):
        return True
    if "out" in kwargs or name in ("__setitem__", "__set__") or name.endswith("_as"):
        return True
    if name.startswith("__") and name.endswith("__"):
        return name[2] == "i" and name[3:-2] in _INPLACE_DUNDERS
    return name.endswith("_")


# ---------------------------------------------------------------------- torch.sparse.sum over every
# dim
@register_route(torch._sparse_sum, always=True)
def _sparse_sum_all(func, args, kwargs):
    """``torch.sparse.sum(A) == A.sum()``: dense semantics, the masked sum of the stored elements
    for an indefinite fill (torch.sparse skips unspecified elements); with ``dim`` the aten handler
    runs."""
    if set(kwargs) - {"dtype"} or not (
        len(args) == 1 or len(args) == 2 and isinstance(args[1], torch.dtype)
    ):
        return NotImplemented
    return torch.sum(args[0], dtype=kwargs.get("dtype", args[1] if len(args) == 2 else None))


# torch's composite body of ``linalg_matrix_rank.out`` rebinds its output to a new tensor for a
# tensor subclass's input, leaving the caller's ``out`` unwritten
@register_route(torch.linalg.matrix_rank, always=True)
def _matrix_rank_out(func, args, kwargs):
    """``torch.linalg.matrix_rank(A, ..., out=o)``: the rank computed, then written into ``o``."""
    o = kwargs.get("out")
    if not isinstance(o, SparseTensor) and (
        not isinstance(o, torch.Tensor) or o.layout is not torch.strided
    ):
        return NotImplemented
    write_out(o, func(*args, **{k: v for k, v in kwargs.items() if k != "out"}))
    return o


# The families' routes register themselves when imported (each module imports register_route from
# here): the matrix products; the reductions over every sparse dim; dropout of a zero or masked fill
# (the stored values); x.sparse_mask(A) (x's gradient at A's pattern); row and column selection (a
# sparse backward).
from sparsefill.ops.linalg import backward  # noqa: E402,F401
from sparsefill.ops.reductions import backward as reduction_backward  # noqa: E402,F401
from sparsefill.ops.pointwise import dropout  # noqa: E402,F401
from sparsefill.ops.linalg import sampled_backward  # noqa: E402,F401
from sparsefill.ops.shape import index_backward  # noqa: E402,F401

# (hsplit/vsplit/dsplit/tensor_split: the pieces' gradients joined)
from sparsefill.ops.shape import split  # noqa: E402,F401

# (F.scaled_dot_product_attention with a SparseTensor mask: the fused tiles)
from sparsefill.ops.linalg import attention  # noqa: E402,F401

# sort/topk/kthvalue/mode: the gradient to the selected elements; quantile/nanquantile: ranks of
# the sorted stored values
from sparsefill.ops.order import sort_backward  # noqa: E402,F401
from sparsefill.ops.order import quantiles  # noqa: E402,F401

# the masked mean of l1_loss and BCE with logits; local_response_norm across channels
from sparsefill.ops.losses import masked_mean  # noqa: E402,F401
from sparsefill.ops.reductions import local_response_norm  # noqa: E402,F401
