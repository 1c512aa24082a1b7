"""Op handlers, one module per family; importing this package fills the registry and installs the op
layer's entry points into ``SparseTensor`` (``_tensor.install_op_layer``: the data class imports no
op handler)."""

from .. import _tensor
from . import (
    activations,
    backward_gate,
    concat,
    coords,
    core,
    fallback,
    foreach,
    indexing,
    linalg,  # noqa: F401
    losses,
    norm_layers,
    normalizations,
    padding,
    products,
    pointwise,
    reductions,
    registry,
    sampled,
    views,
    windows,
)


def _route(func, types, args, kwargs):
    """``autograd_routes.route``, imported on the first torch function call (it loads the autograd
    Functions)."""
    from .autograd_routes import ROUTED, route

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
