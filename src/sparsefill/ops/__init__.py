"""The op rules: one registry keyed by aten ``OpOverload`` (``registry``), one folder per family of
handlers (``pointwise``, ``linalg``, ``reductions``, ``shape``, ``windows``), the view bookkeeping
(``views``) and the densify fallback (``fallback``).

Importing this package registers every handler and fills the data class's hook table with the op
layer's entries (``sparsefill._tensor.tensor.HOOKS``): the path of a call is

    SparseTensor.__torch_dispatch__ -> HOOKS.dispatch = registry.dispatch -> views.around
        -> registry.compute -> the registered handler, or pointwise.rule.pointwise_rule, or the
           op's decomposition, or fallback.densify_call
"""

# (the order of registration: where two modules register one op, the later one's handler is kept)
from sparsefill._tensor.tensor import install_hooks
from sparsefill.ops.pointwise import activations
from sparsefill.ops import backward_gate
from sparsefill.ops.shape import concat, coords
from sparsefill.ops import core, fallback
from sparsefill.ops.pointwise import foreach
from sparsefill.ops.shape import indexing
from sparsefill.ops.shape import diagonals, index_select, masked_index, rearrange
from sparsefill.ops.linalg import distance, product
from sparsefill.ops.losses import losses, margin
from sparsefill.ops.reductions import norm_layers
from sparsefill.ops.reductions import softmax
from sparsefill.ops.shape import pad
from sparsefill.ops.linalg import matrix_products
from sparsefill.ops.pointwise import rule
from sparsefill.ops.reductions import reduce, select, variance
from sparsefill.ops import registry
from sparsefill.ops.linalg import sampled
from sparsefill.ops.order import search, sort
from sparsefill.ops import views, windows

__all__ = [
    "activations",
    "backward_gate",
    "concat",
    "coords",
    "core",
    "distance",
    "diagonals",
    "fallback",
    "foreach",
    "index_select",
    "indexing",
    "losses",
    "margin",
    "masked_index",
    "matrix_products",
    "norm_layers",
    "pad",
    "product",
    "rearrange",
    "reduce",
    "registry",
    "rule",
    "sampled",
    "search",
    "select",
    "sort",
    "softmax",
    "variance",
    "views",
    "windows",
]


class _Everything:
    """``routed`` until the autograd routes load: every call asks :func:`_route`."""

    def __contains__(self, item) -> bool:
        return True


def _route(func, types, args, kwargs):
    """``autograd_routes.route``, loaded on the first torch function call of a SparseTensor (it
    imports the autograd Functions of the op families: not needed to import sparsefill)."""
    from sparsefill.ops.autograd_routes import ROUTED, route

    install_hooks(route=route, routed=ROUTED)
    return route(func, types, args, kwargs)


install_hooks(
    dispatch=registry.dispatch,
    fast=registry.fast_path,
    route=_route,
    routed=_Everything(),
    sync=views.sync,
    write_through=views.write_through,
    track=views.track,
    gate=backward_gate.gate,
)
