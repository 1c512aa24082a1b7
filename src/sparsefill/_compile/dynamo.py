"""torch.compile support: tracing helpers for the handlers, and what AOTAutograd asks of a traceable
wrapper subclass beyond flatten/unflatten.

A SparseTensor output of a compiled function that requires grad gets its gradient (the *tangent*)
from whatever runs after it, of any pattern.  AOTAutograd traces the backward once, for a tangent
whose inner sizes it takes from the traced one, so the tangent is traced, and every runtime gradient
converted, in the all-stored form (:func:`all_stored`, nse = the numel of the sparse dims: O(numel)
per backward)::

    dense_of(coerce_tangent(G, meta)) == dense_of(G)

A gradient that arrives as a dense tensor (``out.backward(G)``, a dense loss of ``out`` computed
eagerly) is converted as well: torch.Tensor gets ``__coerce_same_metadata_as_tangent__``
(:func:`_coerce_plain_tangent`, for a SparseTensor tangent only) when torch._dynamo loads.

>>> import torch, sparsefill
>>> G = sparsefill.sparse_coo_tensor([[2, 0, 2]], [1., 2., 3.], (4,), fill_value=0.5)
>>> T = coerce_tangent(G, (torch.sparse_coo, False, True, ALL_STORED))
>>> T._nse(), T.to_dense()
(4, tensor([2.0000, 0.5000, 4.0000, 0.5000]))
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

import torch

from sparsefill import _torch_compat
from sparsefill._creation.constructors import sparse_coo_tensor, sparse_csr_tensor
from sparsefill._kernels import index as _index
from sparsefill._tensor.fill import _Indefinite, indefinite as _indefinite
from sparsefill._tensor.parts import dense_of
from sparsefill._tensor.tensor import SparseTensor, install_hooks

from sparsefill._kernels.trace import inner_sizes

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # sparsefill/


def every_element(x: torch.Tensor, layout, dense_dim: int):
    """The dense ``x`` as a SparseTensor of ``layout`` with every element stored (fill 0,
    coalesced), differentiable: while traced, a result that is dense by nature is kept in this form,
    whose sizes depend on the shape only (``to_sparse`` would store the elements that differ from
    the fill: a count read from
    the data, an unbacked size)::

        every_element(x, layout, dense_dim).to_dense() == x

    >>> every_element(torch.tensor([[0., 2.], [3., 0.]]), torch.sparse_csr, 0)._nse()
    4
    """

    sd = x.dim() - dense_dim
    S, D = tuple(x.shape[:sd]), tuple(x.shape[sd:])
    N = _index.numel(S)
    zero = x.new_zeros(())
    if layout is torch.sparse_coo or sd < 2:
        idx = _index.unravel(torch.arange(N, device=x.device), S)
        return sparse_coo_tensor(
            idx, x.reshape((N,) + D), x.shape, fill_value=zero, is_coalesced=True
        )
    batch, (m, n) = S[:-2], S[-2:]
    crow = (torch.arange(m + 1, device=x.device) * n).expand(batch + (m + 1,))
    col = torch.arange(n, device=x.device).repeat(m).expand(batch + (m * n,))
    return sparse_csr_tensor(crow, col, x.reshape(batch + (m * n,) + D), x.shape, fill_value=zero)


# the 4th entry of the flatten metadata of a tangent in the all-stored form (5th: dense dims)
ALL_STORED = "all-stored"


def all_stored(G, layout=None):
    """``G`` with every element of its sparse dims stored (row-major, coalesced), in ``layout``
    (default G's), flagged as a tangent: ``dense_of(all_stored(G)) == dense_of(G)``; an indefinite
    ``G``'s masked-out elements (no gradient) become 0.  Its sizes depend on the shape only (nse =
    the sparse dims' numel; the fill, which no element reads, a 0-d zero: a gradient's fill may be
    an array over the dense dims)."""

    layout = G._sf_layout if layout is None else layout
    X = dense_of(G, G._vals.new_zeros(tuple(G._dense_shape)) if G._indefinite else None)
    # (read by no element: a 0-d zero)
    fill = G._vals.new_empty(0) if G._indefinite else G._vals.new_zeros(())
    return _all_stored_of(X, len(G._dense_shape), layout, fill, G._indefinite)


def _all_stored_of(X: torch.Tensor, dense_dims: int, layout, fill: torch.Tensor, indefinite: bool):
    """The dense ``X`` as a tangent in the all-stored form of ``layout`` (see
    :func:`all_stored`)."""

    S, D = tuple(X.shape[: X.dim() - dense_dims]), tuple(X.shape[X.dim() - dense_dims :])
    N = _index.numel(S)
    vals = X.reshape((N,) + D)
    if layout is torch.sparse_coo:
        idx = _index.unravel(torch.arange(N, device=X.device), S)
        out = SparseTensor(
            layout, X.shape, vals, fill, indices=idx, indefinite=indefinite, coalesced=True
        )
    else:
        batch, (m, n) = S[:-2], S[-2:]
        crow = (torch.arange(m + 1, device=X.device) * n).expand(batch + (m + 1,))
        col = torch.arange(n, device=X.device).repeat(m).expand(batch + (m * n,))
        out = SparseTensor(
            layout,
            X.shape,
            vals.reshape(batch + (m * n,) + D),
            fill,
            crow=crow,
            col=col,
            indefinite=indefinite,
        )
    out._tangent = True
    return out


def coerce_tangent(G, meta, expected_type=None):
    """``G`` in the form of the tangent AOTAutograd traced, flatten metadata ``meta``: the
    all-stored form (:func:`all_stored`) of the expected layout.  The backward graph was traced for
    a tangent of sizes known from the output's shape, whatever pattern the runtime gradient has.
    ``G`` may be a SparseTensor of any pattern or a dense tensor (a dense loss computed outside the
    compiled function: its values are the all-stored form's, fill 0).  None where no exact form
    exists (a SparseTensor gradient of a dense output: AOTAutograd's own error)."""

    if (
        expected_type is not None
        and expected_type is not SparseTensor
        or len(meta) < 4
        or meta[3] != ALL_STORED
    ):
        return None
    layout, indefinite = meta[:2]
    if not isinstance(G, SparseTensor):  # a dense gradient (shape and dtype checked by autograd)
        zero = G.new_zeros(())
        return _all_stored_of(
            G,
            meta[4] if len(meta) > 4 else 0,
            layout,
            G.new_empty(0) if indefinite else zero,
            indefinite,
        )
    G = all_stored(G._sync(), layout)
    # (a definite gradient of a masked output: the masked-out values are unused)
    if indefinite != G._indefinite:
        G._indefinite, G._fill = (
            indefinite,
            G._vals.new_empty(0) if indefinite else G._vals.new_zeros(()),
        )
    return G


def _coerce_plain_tangent(self, expected_metadata, expected_type=None):
    """``torch.Tensor.__coerce_same_metadata_as_tangent__`` (installed when torch._dynamo loads,
    where torch.Tensor has none): a dense gradient of a compiled function's SparseTensor output
    (``out.backward(G)``, a dense loss of ``out`` computed eagerly) in the all-stored form its
    compiled backward was traced for; None (AOTAutograd's own error, as without this method) for any
    other expected type."""

    if expected_type is not SparseTensor or isinstance(self, SparseTensor):
        return None
    return coerce_tangent(self, expected_metadata, expected_type)


# ---------------------------------------------------------------------- entry points dynamo records
# whole Python functions of sparsefill that dynamo cannot trace line by line (they call SparseTensor
# methods that return metadata, which dynamo puts in its graph as ops, or hold locks): each is
# replaced in dynamo's view (``substitute_in_graph``) by a wrapper that ``allow_in_graph`` makes one
# node of dynamo's graph, run on fake tensors to propagate shapes (:func:`_recorded_whole`);
# AOTAutograd then traces into it (its autograd.Functions included).  Registered when torch._dynamo
# is first imported, never importing it (3 s of a cold start).
_IN_GRAPH = {
    "sparsefill": ("sparse_coo_tensor", "sparse_csr_tensor"),
    "sparsefill.masked": (
        "sum",
        "prod",
        "cumsum",
        "cumprod",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "mean",
        "median",
        "norm",
        "var",
        "std",
        "logsumexp",
        "logaddexp",
        "softmax",
        "log_softmax",
        "softmin",
        "normalize",
    ),
}


_INDEFINITE = (
    "sparsefill.indefinite"  # the indefinite fill as it enters dynamo's graph (see _as_constant)
)


def _as_constant(x):
    """``x``, the ``sparsefill.indefinite`` sentinel as the string :data:`_INDEFINITE`: dynamo
    passes a string to an ``allow_in_graph`` function as a constant, an object of sparsefill's own
    class not at all ('Failed to convert args/kwargs to proxy', a graph break; with
    ``fullgraph=True`` that unnamed error).  Traced by dynamo."""
    return _INDEFINITE if type(x) is _Indefinite else x


def _from_constant(x):
    """``x``, :data:`_INDEFINITE` as the sentinel again (the inverse of :func:`_as_constant`)."""
    return _indefinite if isinstance(x, str) and x == _INDEFINITE else x


def _recorded_whole(fn):
    """``fn`` as dynamo's graph records it (one node; dynamo calls it in place of ``fn``): while
    traced, the sizes that depend on data inside it and do not reach its result (the slices of a
    softmax, a coalesce's count) may stay unbound, as inside a handler (:func:`traced_dispatch`).
    Its arguments arrive with the indefinite fill as a constant (:func:`_as_constant`)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        args = tuple(_from_constant(a) for a in args)
        kwargs = {k: _from_constant(v) for k, v in kwargs.items()}
        with inner_sizes():
            return fn(*args, **kwargs)

    return run


def _register_with_dynamo() -> None:
    """The :data:`_IN_GRAPH` functions recorded whole; sparsefill's other code inlined when traced
    code calls it (as torch's own modules) but never compiled as a frame of its own: after a graph
    break sparsefill runs eagerly, where dynamo would otherwise try (and fail, slowly) to compile
    each of its functions."""
    dynamo = sys.modules["torch._dynamo"]
    for module, names in _IN_GRAPH.items():
        mod = importlib.import_module(module)
        for name in names:
            fn = getattr(mod, name)
            run = dynamo.allow_in_graph(_recorded_whole(fn))
            dynamo.substitute_in_graph(fn, skip_signature_check=True)(
                lambda *a, _run=run, **k: _run(
                    *(_as_constant(x) for x in a), **{n: _as_constant(x) for n, x in k.items()}
                )
            )
    _torch_compat.set_plain_tangent_coercion(_coerce_plain_tangent)
    # sparsefill's kernels are compiled lazily by numba, also while a compiled frame's backward
    # runs eagerly: dynamo must not trace numba's dispatcher frames
    _torch_compat.inline_in_dynamo(_PACKAGE_DIR, "sparsefill", "numba")
    _torch_compat.bind_unbound_symbols_at_graph_end(
        sys.modules["torch._dynamo.output_graph"].SubgraphTracer
    )
    _REGISTERED.append(True)
    while _ON_DYNAMO:
        _ON_DYNAMO.pop(0)()


_ON_DYNAMO: list = []  # callbacks run once torch._dynamo is loaded (see when_dynamo_loads)


def when_dynamo_loads(callback) -> None:
    """Run ``callback()`` once ``torch._dynamo`` is imported (now, if it is): code that needs
    dynamo's decorators (``torch.compiler.disable`` imports it, 3 s of a cold start) without
    importing it itself."""
    if "torch._dynamo" in sys.modules and _REGISTERED:
        callback()
    else:
        _ON_DYNAMO.append(callback)


_REGISTERED: list = []


def _install() -> None:
    """Register with dynamo once a program imports it (see ``_torch_compat.run_after_import``)."""
    _torch_compat.run_after_import("torch._dynamo", _register_with_dynamo)


install_hooks(all_stored=all_stored, coerce_tangent=coerce_tangent)
