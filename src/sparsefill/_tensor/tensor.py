"""SparseTensor: a torch.Tensor wrapper subclass with COO/CSR storage and a fill value.

For a COO tensor ``A`` with ``indices`` ``(S, nse)``, ``values`` ``(nse, *D)`` and
fill ``f`` (broadcastable to ``D``), the dense tensor it stands for is::

    A.to_dense()[i] = sum(values[n] for n if indices[:, n] == i)   if i is specified
                    = f.expand(D)                                   otherwise

CSR stores the same with ``crow_indices``/``col_indices`` over the last two sparse
dims (leading batch dims allowed, equal nse per batch).  An *indefinite* fill
(``fill_value=sparsefill.indefinite``, or ``[]``) marks unspecified elements as masked out.

The wrapper is created with ``layout=torch.strided`` (autograd would drop the fill
of a ``sparse_coo`` layout gradient); the storage format is ``A.sparse_layout``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced_dispatch
from sparsefill._tensor.host import HostMixin
from sparsefill._tensor.hooks import HOOKS, Hooks as Hooks, install_hooks as install_hooks

__all__ = ["SparseTensor"]

_STATE = (
    "_sf_layout",
    "_size",
    "_idx",
    "_crow",
    "_col",
    "_vals",
    "_fill",
    "_indefinite",
    "_coalesced",
    "_zero",
    "_view",
)
# attributes of this object alone: pickles and copies leave them out
TRANSIENT = frozenset({"_has_views"})
_PUBLIC_NAMES = {
    "_idx": "indices",
    "_crow": "crow_indices",
    "_col": "col_indices",
    "_vals": "values",
}


def _version(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else t._version


class SparseTensor(HostMixin, torch.Tensor):
    """A sparse tensor with a fill value that behaves as its dense equivalent.

    Build one with :func:`sparsefill.sparse_coo_tensor`, :func:`sparsefill.sparse_csr_tensor`
    or :func:`sparsefill.to_sparse`; the raw constructor below does no validation.

    >>> import torch, sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 3]], [7., 9.], (5,), fill_value=5.)
    >>> A.to_dense()
    tensor([7., 5., 5., 9., 5.])
    """

    # The storage attributes (``_STATE``, set by ``_store``), declared for type checkers only (no
    # class attribute is made): the index tensors of the other layout are None.
    _sf_layout: torch.layout
    _size: torch.Size
    _idx: Any
    _crow: Any
    _col: Any
    _vals: torch.Tensor
    _fill: torch.Tensor
    _indefinite: bool
    _coalesced: bool
    _zero: tuple
    _view: Any

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """Every function passes through to ``__torch_dispatch__`` as
        ``torch._C._disabled_torch_function_impl`` (results are never re-wrapped); the op layer's
        ``route`` (``ops.autograd_routes.route``) may take the call first (while grad mode is on,
        the few functions whose backward must know the pattern, docs/architecture.md; in every mode,
        the few whose composite torch body cannot run on a SparseTensor).  A call with no keyword
        arguments, every argument a SparseTensor or a Python value, of a function not in the op
        layer's ``routed``, is one ``route`` declines: it passes through at once (no route call)."""
        if not kwargs and func not in HOOKS.routed:
            for a in args:
                if a.__class__ is not SparseTensor and a.__class__ not in _PLAIN:
                    break
            else:
                return _gated(_PASS_THROUGH(func, types, args, {}), func, args, {})
        if kwargs is None:
            kwargs = {}
        out = HOOKS.route(func, types, args, kwargs)
        if out is not NotImplemented:
            return out
        return _gated(_PASS_THROUGH(func, types, args, kwargs), func, args, kwargs)

    @staticmethod
    def __new__(
        cls,
        layout,
        size,
        values,
        fill,
        *,
        indices=None,
        crow=None,
        col=None,
        indefinite=False,
        coalesced=False,
        requires_grad=False,
        known_zero=False,
    ):
        size = tuple(size)
        r = _make_wrapper(
            cls,
            size,
            None,
            None,
            None,
            values.dtype,
            _STRIDED,
            values.device,
            False,
            bool(requires_grad),
        )
        _store(
            r,
            layout,
            size,
            indices,
            crow,
            col,
            values,
            fill,
            bool(indefinite),
            bool(coalesced) or layout is torch.sparse_csr,
            bool(known_zero) and not indefinite,
        )
        return r

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    @classmethod
    def _make(
        cls,
        layout,
        size,
        values,
        fill,
        indices,
        crow,
        col,
        indefinite: bool,
        coalesced: bool,
        known_zero: bool,
    ) -> SparseTensor:
        """``SparseTensor(layout, size, values, fill, indices=..., ...)`` for parts an op computed
        itself, at the cost of the wrapper alone: every argument positional, the flags already bools
        (``coalesced`` True for CSR, ``known_zero`` False when indefinite), no ``requires_grad`` (a
        result inside ``__torch_dispatch__``; autograd wraps it above).  Nothing is checked, so
        nothing may come from a user."""
        r = _make_wrapper(cls, size, None, None, None, values.dtype, _STRIDED, values.device)
        _store(r, layout, size, indices, crow, col, values, fill, indefinite, coalesced, known_zero)
        return r

    def _with_values(self, values: torch.Tensor, fill: torch.Tensor) -> SparseTensor:
        """A coalesced definite SparseTensor of this one's pattern (its layout, shape and index
        tensors: a
        pattern's cached linear keys carry over) holding ``values`` and the definite ``fill``::

            A._with_values(f(A.values()), f(A.fill)) == f(A)
                for an element-wise f and a coalesced A

        (``_store``'s assignments inline, through the attribute dicts: this runs once per
        element-wise op.)
        """
        s = self.__dict__
        size = s["_size"]
        r = _make_wrapper(
            SparseTensor, size, None, None, None, values.dtype, _STRIDED, values.device
        )
        d = r.__dict__
        d["_sf_layout"] = s["_sf_layout"]
        d["_size"] = size
        d["_idx"], d["_crow"], d["_col"] = s["_idx"], s["_crow"], s["_col"]
        d["_vals"] = values
        d["_fill"] = fill
        d["_indefinite"] = False
        d["_coalesced"] = True
        d["_zero"] = _UNKNOWN
        d["_view"] = None
        return r

    # ------------------------------------------------------------------ metadata
    @property
    def sparse_layout(self) -> torch.layout:
        """``torch.sparse_coo`` or ``torch.sparse_csr`` (``A.layout`` is ``torch.strided``)."""
        return self._sf_layout

    def dense_dim(self) -> int:
        return self._vals.dim() - (1 if self._sf_layout is torch.sparse_coo else self._col.dim())

    def _sparse_ndim(self) -> int:
        """Number of leading non-dense dims (COO sparse dims; CSR batch dims + 2)."""
        return self.dim() - self.dense_dim()

    def sparse_dim(self) -> int:
        """As torch: the number of COO sparse dims, 2 for CSR (batch dims not counted)."""
        return self._idx.shape[0] if self._sf_layout is torch.sparse_coo else 2

    @property
    def _sparse_shape(self) -> torch.Size:
        return self.shape[: self._sparse_ndim()]

    @property
    def _dense_shape(self) -> torch.Size:
        return self.shape[self._sparse_ndim() :]

    def _nse(self) -> int:
        """Number of specified elements (per batch for batched CSR), as torch's ``_nnz``."""
        self._sync()
        return self._vals.shape[0] if self._sf_layout is torch.sparse_coo else self._col.shape[-1]

    _nnz = _nse

    def is_coalesced(self) -> bool:
        return self._coalesced

    def is_fill_indefinite(self) -> bool:
        """True when unspecified elements are masked out (``sparsefill.indefinite``)."""
        return self._indefinite

    def _sync(self) -> SparseTensor:
        """A view (``A[0]``, ``A.t()``...) catches up with its base if the base changed
        (ops/views.py)."""
        if self._view is not None:
            HOOKS.sync(self)
        return self

    def _fill_is_zero(self) -> bool:
        """Host-side: True only when the fill is known to be zero (never syncs a device)."""
        if self._indefinite:
            return False
        # traced (FakeTensor, FunctionalTensor): read no data
        if type(self._fill) is not torch.Tensor:
            return self._zero[1] and self._zero[0] == _version(self._fill)
        # cheap, and sees writes that bypass version counters (.data)
        if self._fill.device.type == "cpu":
            return not bool(self._fill.any())
        v = _version(self._fill)
        if v is None or v != self._zero[0]:
            known = self._fill.device.type == "cpu" and not bool(self._fill.any())
            self._zero = (v, known)
        return self._zero[1]

    # ------------------------------------------------------------------ storage accessors
    def _require(self, layout, what):
        if self._sf_layout is not layout:
            raise RuntimeError(
                f"{what}() is defined for {layout} tensors, this one is {self._sf_layout}"
            )

    def indices(self) -> torch.Tensor:
        self._sync()
        self._require(torch.sparse_coo, "indices")
        if not self._coalesced:
            raise RuntimeError(
                "Cannot get indices on an uncoalesced tensor, please call .coalesce() first"
            )
        return self._idx

    def _indices(self) -> torch.Tensor:
        self._sync()
        self._require(torch.sparse_coo, "_indices")
        return self._idx

    def crow_indices(self) -> torch.Tensor:
        self._sync()
        self._require(torch.sparse_csr, "crow_indices")
        return self._crow

    def col_indices(self) -> torch.Tensor:
        self._sync()
        self._require(torch.sparse_csr, "col_indices")
        return self._col

    def values(self) -> torch.Tensor:
        """The specified values, differentiable (gradient: a zero-fill SparseTensor)."""
        self._sync()
        if not self._coalesced:
            raise RuntimeError(
                "Cannot get values on an uncoalesced tensor, please call .coalesce() first"
            )
        return HOOKS.values(self)

    def _values(self) -> torch.Tensor:
        self._sync()
        return HOOKS.values(self)

    def fill_value(self) -> torch.Tensor:
        """The fill expanded to the dense dims (a view: ``A.fill_value().fill_(x)`` changes ``A``).

        Indefinite fill: an empty tensor of shape ``(0,)``.
        """
        self._sync()
        return self._fill if self._indefinite else self._fill.expand(self._dense_shape)

    def _fill_value(self) -> torch.Tensor:
        self._sync()
        """The fill as specified (may be smaller than the dense dims: it broadcasts over them)."""
        return self._fill

    # (fill values are typed Any here: their alias, sparsefill._creation.FillValue, lives above)
    def set_fill_value_(self, fill_value: Any) -> SparseTensor:
        """Replace the fill in place (any kind: scalar, array, ``[]`` for indefinite). Returns
        ``self``."""
        from sparsefill._tensor.fill import normalize_fill

        self._sync()
        fill, indefinite, zero = normalize_fill(
            fill_value, self.dtype, self.device, self._dense_shape, own=True
        )
        self._fill, self._indefinite, self._zero = fill, indefinite, (_version(fill), zero)
        if not self.is_inference():
            torch.autograd.graph.increment_version(self)
        if self._view is not None:
            HOOKS.write_through(self)
        return self

    def _coo_parts(self):
        """``(indices over all non-dense dims, values (nse_total, *dense))`` for any layout."""
        if self._sf_layout is torch.sparse_coo:
            return self._idx, self._vals
        batch = self.shape[: self._col.dim() - 1]
        nrows = self.shape[len(batch)]
        nb = _index.numel(batch)
        nse = self._col.shape[-1]
        crow = self._crow.reshape(nb, nrows + 1)
        counts = (crow[:, 1:] - crow[:, :-1]).reshape(-1)
        grow = _index.runs_to_ids(counts, nb * nse)
        rows = [grow % nrows, self._col.reshape(-1)]
        idx = (
            torch.stack(list(_index.unravel(grow // nrows, batch)) + rows)
            if batch
            else torch.stack(rows)
        )
        return idx, self._vals.reshape((nb * nse,) + tuple(self._dense_shape))

    def _keys(self) -> torch.Tensor:
        """Linear keys (row-major over the sparse shape) of the stored elements."""
        return _index.linearize(self._coo_parts()[0], self._sparse_shape)

    # ------------------------------------------------------------------ conversions
    def coalesce(self) -> SparseTensor:
        self._sync()
        if self._coalesced:
            return self
        from sparsefill._tensor.parts import coalesce_of

        return HOOKS.same_dense(self, coalesce_of)

    def to_dense(
        self,
        dtype: torch.dtype | None = None,
        *,
        fill_value: Any = None,
        masked_grad: bool | None = None,
    ) -> torch.Tensor:
        """The dense tensor ``A`` stands for; ``fill_value=`` stands in for an indefinite fill."""
        if self._view is not None:  # (self._sync(), inline: one Python call less per to_dense)
            HOOKS.sync(self)
        out = HOOKS.to_dense(self, fill_value)
        return out if dtype is None else out.to(dtype)

    def to_sparse(
        self,
        layout: torch.layout | None = None,
        *,
        fill_value: Any = None,
        dense_dim: int | None = None,
        blocksize: Any = None,
    ) -> SparseTensor:
        """Change layout (COO <-> CSR), fill and/or dense dims; the dense equivalent is unchanged.

        As torch, an int first argument is ``sparse_dim`` (COO with that many sparse dims).
        """
        self._sync()
        if isinstance(layout, int):
            layout, dense_dim = torch.sparse_coo, self.dim() - layout
        if blocksize is not None:
            raise ValueError("sparsefill supports COO and CSR layouts only; blocksize must be None")
        # the fill kept: exact
        if fill_value is None and dense_dim is not None and dense_dim != self.dense_dim():
            from sparsefill._tensor.dense_dims import resplit

            return HOOKS.same_dense(self, lambda a: resplit(a, dense_dim, layout))
        return HOOKS.convert(self, layout, fill_value, dense_dim)

    def to_sparse_coo(self, fill_value: Any = None) -> SparseTensor:
        return self.to_sparse(torch.sparse_coo, fill_value=fill_value)

    def to_sparse_csr(
        self, dense_dim: int | None = None, *, fill_value: Any = None
    ) -> SparseTensor:
        return self.to_sparse(torch.sparse_csr, fill_value=fill_value, dense_dim=dense_dim)

    def to_torch(self, *, materialize: bool = False) -> torch.Tensor:
        """A torch native sparse tensor (zero fill) of the same layout; see
        :func:`sparsefill.to_torch`."""
        self._sync()
        return HOOKS.to_torch(self, materialize=materialize)

    def prune(self, *, atol: float = 0.0) -> SparseTensor:
        """Drop stored elements (dense slices) equal to the fill, within ``atol`` (NaN equals NaN).

        Nothing prunes implicitly; the dense tensor is unchanged up to ``atol``:
        ``A.prune().to_dense() == A.to_dense()`` for ``atol=0``.
        """
        from sparsefill._tensor.parts import prune_of

        self._sync()
        return HOOKS.same_dense(self, lambda a: prune_of(a, atol))

    # ------------------------------------------------------------------ numpy and the peers (see
    # _creation/interop.py) ------------------------------------------------------------------
    # subclass protocol
    def __tensor_flatten__(self):
        """``(inner tensor names, metadata)`` for torch.compile: the metadata reads no data
        (so tracing never syncs on a value) and the stored-element count is a dynamic size (as
        torch's nested tensors mark their ragged dim), so a new pattern with another nse reuses the
        compiled graph."""
        if self._view is not None:
            self._sync()
        # (dynamo's guards call this twice per compiled call: kept to plain attribute reads)
        vals = self._vals
        if type(vals) is torch.Tensor and not hasattr(vals, "_dynamo_propagated_dynamic_indices"):
            _mark_nse_dynamic(self)
        layout = self._sf_layout
        meta = (layout, self._indefinite, self._coalesced)
        # the all-stored form and its dense dims (_compile.coerce_tangent)
        if "_tangent" in self.__dict__:
            meta += ("all-stored", len(self._dense_shape))
        return ["_idx", "_vals", "_fill"] if layout is _COO else [
            "_crow",
            "_col",
            "_vals",
            "_fill",
        ], meta

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        # (files saved before: a 4th entry, the zero flag, is ignored)
        layout, indefinite, coalesced = ctx[:3]
        # (the wrapper alone: compiled code rebuilds each output per call)
        csr = layout is torch.sparse_csr
        out = SparseTensor._make(
            layout,
            outer_size,
            inner["_vals"],
            inner["_fill"],
            inner.get("_idx"),
            inner.get("_crow") if csr else None,
            inner.get("_col") if csr else None,
            bool(indefinite),
            bool(coalesced) or csr,
            False,
        )
        if len(ctx) > 3 and ctx[3] == "all-stored":  # a tangent (see _compile.coerce_tangent)
            out._tangent = True
        return out

    def _stable_hash_for_caching(self) -> str:
        """AOTAutograd's cache key of this tensor: its metadata and its inner tensors' (no data)."""
        import hashlib

        names, meta = self.__tensor_flatten__()
        key = [tuple(self.shape), self.dtype, self.device, self.requires_grad, meta]
        key += [
            (n, tuple(t.shape), t.dtype, t.stride()) for n in names for t in (getattr(self, n),)
        ]
        return hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()

    def __coerce_tangent_metadata__(self):
        """AOTAutograd traces the gradient of a SparseTensor output in the all-stored form (sizes
        from the shape only: a runtime gradient may have any pattern; see
        ``_compile.coerce_tangent``)."""
        return HOOKS.all_stored(self._sync())

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        """The incoming gradient ``self`` in the form the traced backward expects (``expected_type``
        and the flatten metadata): the all-stored form of the expected layout, its dense tensor
        unchanged; None where no exact form exists (see ``_compile.coerce_tangent``)."""
        return HOOKS.coerce_tangent(self, expected_metadata, expected_type)

    @property
    def data(self) -> SparseTensor:
        """As ``Tensor.data``: an alias that autograd does not track."""
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, new) -> None:
        """``A.data = B``, as for a dense tensor: ``A`` keeps its identity and autograd metadata and
        becomes an alias of ``B`` (its shape, dtype, storage and fill).  A dense ``B`` of ``A``'s
        shape (as ``torch.nn.utils.vector_to_parameters`` gives) is converted exactly, with ``A``'s
        fill, layout and dense dims (a copy: no storage to share)."""
        if not isinstance(new, torch.Tensor):
            raise TypeError(f"A.data = B needs a tensor B, got {type(new).__name__}")
        if isinstance(new, SparseTensor):
            new._sync()
        elif new.shape != self.shape:
            raise ValueError(
                f"A.data = B with a dense B of shape {tuple(new.shape)} for a SparseTensor of "
                f"shape {tuple(self.shape)}: convert it first (sparsefill.to_sparse(B, "
                "fill_value=...))"
            )
        else:
            from sparsefill._tensor.fill import indefinite

            fill = indefinite if self._indefinite else self._fill.to(new.dtype)
            new = HOOKS.to_sparse(
                new.detach(), fill_value=fill, layout=self._sf_layout, dense_dim=self.dense_dim()
            )
        torch._C.TensorBase.data.__set__(self, new)  # shape and dtype
        for name in _STATE[:-1]:
            setattr(self, name, getattr(new, name))
        self._view = None
        HOOKS.track(self, torch.ops.aten.alias.default, (new,), {})

    def __repr__(self, *, tensor_contents=None):
        self._sync()
        names, _ = self.__tensor_flatten__()
        parts = [f"{_PUBLIC_NAMES[n]}={getattr(self, n)!r}" for n in names[:-1]]
        fill = "indefinite" if self._indefinite else repr(self._fill)
        parts += [
            f"size={tuple(self.shape)}",
            f"nse={self._nse()}",
            f"layout={self._sf_layout}",
            f"fill_value={fill}",
            f"dtype={self.dtype}",
        ]
        if self.device.type != "cpu":
            parts.append(f"device='{self.device}'")
        if self.grad_fn is not None:
            parts.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            parts.append("requires_grad=True")
        k = len(names) - 1
        return "SparseTensor(" + ",\n       ".join(parts[:k] + [", ".join(parts[k:])]) + ")"

    def __format__(self, format_spec):
        """As ``torch.Tensor``: a 0-d tensor formats its item (no DensifyWarning; an unspecified
        element of an indefinite tensor has no value: to_dense's ValueError); any other
        ``object.__format__`` (``""``: the repr; a format spec: TypeError).

        >>> import sparsefill
        >>> A = sparsefill.sparse_coo_tensor([[0], [1]], [2.], (2, 2))
        >>> f"{A[0, 1]:.2f}", f"{A[1, 1]}"
        ('2.00', '0.0')
        """
        if self.dim() == 0 and not self.is_meta:
            return self.detach().item().__format__(format_spec)
        return object.__format__(self, format_spec)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # (keyed by the C++ op: an OpOverload's __hash__ is Python code)
        fast = _FAST.get(func._op)
        if fast is None:
            fast = _FAST[func._op] = HOOKS.fast(func)
        if fast:  # element-wise on one pattern with Python scalars: the aten calls and little else
            out = fast(func, args, kwargs or {})
            if out is not None:
                return out
        mode = _tracing_mode()
        if mode is not None:  # torch.compile (see _kernels.trace.traced_dispatch)
            return traced_dispatch(HOOKS.dispatch, mode, func, types, args, kwargs or {})
        if func.is_view and torch.is_inference_mode_enabled() and not args[0].is_inference():
            # a view of a normal tensor must not be an inference tensor
            with torch.inference_mode(False):
                return HOOKS.dispatch(func, types, args, kwargs or {})
        return HOOKS.dispatch(func, types, args, kwargs or {})


# (cls, size, strides, storage_offset, memory_format, dtype, layout, device, pin_memory,
# requires_grad): positional, cheaper than keywords
_make_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided  # the wrapper's layout (see the module docstring)
_COO = torch.sparse_coo
_PASS_THROUGH = torch._C._disabled_torch_function_impl
_TENSOR = torch.Tensor


def _gated(out, func, args, kwargs):
    """``out`` of a passed-through call; where it is dense and requires grad (its gradient is
    dense), the derivative formulas torch recorded for it ask the densify policy before they form a
    dense gradient of a SparseTensor operand (the op layer's ``gate``).  (A SparseTensor result, ``2
    * A``, gets SparseTensor gradients: it skips the gate, whose cost is far above this test's.)"""
    if (
        out.__class__ is _TENSOR
        and out.requires_grad
        or isinstance(out, tuple)
        and out
        and any(t.__class__ is _TENSOR and t.requires_grad for t in out)
    ):
        HOOKS.gate(out, func, args, kwargs)
    return out


_PLAIN = {
    int,
    float,
    bool,
    complex,
    type(None),
}  # arguments of __torch_function__ that are no tensor (route's too)
_UNKNOWN = (None, False)  # A._zero of a fill not known to be zero


def _store(
    r: SparseTensor,
    layout,
    size,
    indices,
    crow,
    col,
    values,
    fill,
    indefinite: bool,
    coalesced: bool,
    known_zero: bool,
) -> None:
    """Set the storage attributes (``_STATE``) of a new wrapper ``r``; ``r._size`` is the size it
    was made with (``r.shape`` without the ``__torch_function__`` hop; fixed, as the shape is:
    ``A.data = B`` copies it)."""
    r._sf_layout = layout
    r._size = size
    r._idx, r._crow, r._col = indices, crow, col
    r._vals = values
    r._fill = fill
    r._indefinite = indefinite
    r._coalesced = coalesced
    # (the version matters only when known)
    r._zero = (_version(fill), True) if known_zero else _UNKNOWN
    r._view = None  # while a view: what of which base (an ops.views.View record)


def _mark_nse_dynamic(A: SparseTensor) -> None:
    """Mark the stored-element dims of ``A``'s inner tensors dynamic for dynamo (unguarded, as
    torch's nested tensors mark their ragged dim): COO ``indices`` dim 1 and ``values`` dim 0, CSR
    ``col_indices``' and ``values``' nse dim."""
    if A._sf_layout is torch.sparse_coo:
        A._idx._dynamo_propagated_dynamic_indices = {1}
        A._vals._dynamo_propagated_dynamic_indices = {0}
    else:
        k = A._col.dim() - 1
        A._col._dynamo_propagated_dynamic_indices = {k}
        A._vals._dynamo_propagated_dynamic_indices = {k}


_FAKE_MODE = torch._C._TorchDispatchModeKey.FAKE
# the active FakeTensorMode or None
_tracing_mode = functools.partial(torch._C._get_dispatch_mode, _FAKE_MODE)
# OpOverload._op -> the op layer's fast(func): a shortcut where the op may take it, else False
_FAST: dict = {}


def _rebuild(size, inner, ctx, requires_grad, extra=None):
    """The SparseTensor of ``__reduce_ex__``'s parts (files, pickles, queues, deep copies name this
    function; its arguments stay as they are), checked before any kernel indexes memory with them:
    ``_tensor.loading.rebuild``."""
    from sparsefill._tensor.loading import rebuild

    return rebuild(size, inner, ctx, requires_grad, extra)


# Files, pickles and queues of every version name the function sparsefill._tensor._rebuild (the
# package re-exports it). The only safe global for torch.load(weights_only=True): the class itself
# would let a file call the unchecked constructor or set its attributes.
_rebuild.__module__ = "sparsefill._tensor"
torch.serialization.add_safe_globals([_rebuild])
