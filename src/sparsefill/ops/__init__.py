"""Op handlers, one module per family; importing this package fills the registry and installs the op
layer's entry points into ``SparseTensor`` (``_tensor.install_op_layer``: the data class imports no
op handler)."""

from sparsefill._tensor import tensor as _tensor
from sparsefill.ops.pointwise import activations
from sparsefill.ops import backward_gate
from sparsefill.ops.shape import concat, coords
from sparsefill.ops import core, fallback
from sparsefill.ops.pointwise import foreach
from sparsefill.ops.shape import indexing
from sparsefill.ops.linalg import product as linalg
from sparsefill.ops.reductions import softmax as normalizations
from sparsefill.ops.linalg import matrix_products as products
from sparsefill.ops.pointwise import rule as pointwise
from sparsefill.ops.reductions import reduce as reductions
from sparsefill.ops import registry
from sparsefill.ops.linalg import sampled
from sparsefill.ops import views, windows


def _route(func, types, args, kwargs):
    """``autograd_routes.route``, imported on the first torch function call (it loads the autograd
    Functions)."""
    from sparsefill.ops.autograd_routes import ROUTED, route

    _tensor.install_op_layer(route=route, routed=ROUTED)
    return route(func, types, args, kwargs)


_tensor.install_op_layer(
    dispatch=registry.dispatch,
    fast=registry.fast_path,
    route=_route,
    sync=views.sync,
    write_through=views.write_through,
    track=views.track,
    gate=backward_gate.gate,
)
