"""What crosses the wire: a tensor as a small int64 header and a byte payload.

    unpack(header(T), pack(T)) == T          (the same dense tensor, fill, layout and dense dims)

A SparseTensor travels as its coalesced stored elements -- linear keys over the sparse shape
(int64), values, then the fill -- never as the dense tensor: ``nse * (8 + itemsize *
prod(dense_shape))`` bytes plus the fill.  A dense tensor travels as its bytes.  The header says
what the payload holds and is
what the ranks compare before anything else moves (:func:`mismatch`)::

    present, kind, layout, dtype, ndim, dense_dim, indefinite, fill ndim, fill ones-mask, nse,
    nbytes, shape hash, call, call arg, has NaN (a stored value or the fill), shape[:K]
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import coalesced_parts, dense_of, parts_to_sparse
from sparsefill._tensor.validate import check_parts
from sparsefill._tensor.tensor import SparseTensor

K = 8  # shape entries shown in the header (the hash covers every dim)
H = 15 + K
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
]
LAYOUTS = [torch.sparse_coo, torch.sparse_csr]
SPARSE, DENSE = 1, 2
(
    PRESENT,
    KIND,
    LAYOUT,
    DTYPE,
    NDIM,
    DENSE_DIM,
    INDEFINITE,
    FILL_NDIM,
    FILL_ONES,
    NSE,
    NBYTES,
    SHASH,
    CALL,
    CALL_ARG,
    HAS_NAN,
) = range(15)


def _shape_hash(shape) -> int:
    return zlib.crc32(repr(tuple(shape)).encode()) & 0x7FFFFFFF


def _dtype_code(dtype) -> int:
    if dtype not in DTYPES:
        raise TypeError(
            f"sparsefill.distributed: dtype {dtype} cannot be sent (supported: "
            f"{', '.join(str(d) for d in DTYPES)})"
        )
    return DTYPES.index(dtype)


def describe(
    T: torch.Tensor | None, call: int = 0, arg: int = 0, nse: int = 0, nbytes: int = 0
) -> torch.Tensor:
    """The header of ``T`` (all zeros but the call for ``None``: nothing is sent or expected)."""
    h = torch.zeros(H, dtype=torch.int64)
    h[CALL], h[CALL_ARG] = call, arg
    if T is None:
        return h
    h[PRESENT], h[DTYPE], h[NDIM], h[NSE], h[NBYTES] = 1, _dtype_code(T.dtype), T.dim(), nse, nbytes
    h[SHASH] = _shape_hash(T.shape)
    h[H - K : H - K + min(T.dim(), K)] = torch.tensor(T.shape[:K], dtype=torch.int64)
    if isinstance(T, SparseTensor):
        h[KIND], h[LAYOUT], h[DENSE_DIM], h[INDEFINITE] = (
            SPARSE,
            LAYOUTS.index(T._sf_layout),
            T.dense_dim(),
            T._indefinite,
        )
        f = T._fill
        h[FILL_NDIM] = f.dim()
        h[FILL_ONES] = sum(1 << i for i, n in enumerate(f.shape) if n == 1)
    else:
        h[KIND] = DENSE
    return h


def what(h) -> str:
    """A header in words: ``a sparse_coo float32 tensor of shape (5,) (dense_dim 0)``."""
    if not h[PRESENT]:
        return "nothing"
    n = int(h[NDIM])
    dims = [int(x) for x in h[H - K : H - K + min(n, K)]] + (["..."] if n > K else [])
    shape = "(" + ", ".join(map(str, dims)) + ("," if n == 1 else "") + ")"
    dtype = DTYPES[int(h[DTYPE])]
    if h[KIND] == DENSE:
        return f"a dense {dtype} tensor of shape {shape}"
    fill = ", indefinite fill" if h[INDEFINITE] else ""
    layout = LAYOUTS[int(h[LAYOUT])]
    return f"a {layout} {dtype} SparseTensor of shape {shape} (dense_dim {int(h[DENSE_DIM])}{fill})"


def mismatch(s, e) -> tuple[type, str] | None:
    """Why what one rank sends (header ``s``) cannot be stored in what the other expects (``e``), or
    None."""
    if bool(s[PRESENT]) != bool(e[PRESENT]):
        return ValueError, "one side has no tensor"
    if not s[PRESENT]:
        return None
    if s[DTYPE] != e[DTYPE]:
        return TypeError, "the dtypes differ"
    if s[NDIM] != e[NDIM] or s[SHASH] != e[SHASH] or not torch.equal(s[H - K :], e[H - K :]):
        return ValueError, "the shapes differ"
    if (
        s[KIND] == SPARSE
        and e[KIND] == SPARSE
        and (s[LAYOUT] != e[LAYOUT] or s[DENSE_DIM] != e[DENSE_DIM])
    ):
        return ValueError, "the layouts differ (layout and dense_dim must agree)"
    if s[KIND] == SPARSE and e[KIND] == DENSE and s[INDEFINITE]:
        return (
            ValueError,
            "a dense tensor cannot hold the masked-out elements of an indefinite fill",
        )
    return None


# ---------------------------------------------------------------------- payloads
def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def _pad8(b: torch.Tensor) -> torch.Tensor:
    """``b`` padded to a multiple of 8 bytes: every payload in a received buffer starts 8-aligned
    (``view``)."""
    r = -b.numel() % 8
    return torch.cat([b, b.new_zeros(r)]) if r else b


def _keys_fit(shape) -> bool:
    return _index.numel(shape) < 2**63


def keys_of(idx: torch.Tensor, S) -> torch.Tensor:
    """Row-major linear keys of coordinates ``idx`` ``(len(S), n)``: ``_kernels.index.linearize``,
    one fused multiply-add per dim (Horner) and no ``(len(S), n)`` temporary."""
    if len(S) <= 1:
        return idx[0].to(torch.int64) if len(S) else idx.new_zeros(idx.shape[1], dtype=torch.int64)
    k = idx[0].to(torch.int64)
    for d in range(1, len(S)):
        k = idx[d].to(torch.int64).add(k, alpha=int(S[d]))
    return k


def coords_of(keys: torch.Tensor, S) -> torch.Tensor:
    """Inverse of :func:`keys_of`: ``(len(S), n)`` coordinates; one division and one
    multiply-subtract per dim (keys are non-negative: truncating division), written into one
    output."""
    out = keys.new_empty((len(S), keys.numel()))
    k = keys
    for d in range(len(S) - 1, 0, -1):
        q = torch.div(k, int(S[d]), rounding_mode="trunc")
        torch.sub(k, q, alpha=int(S[d]), out=out[d])
        k = q
    if len(S):
        out[0].copy_(k)
    return out


def parts(T: torch.Tensor):
    """``(index tensor, values, fill)`` as sent: keys (or coordinates past 2**63 positions),
    coalesced."""
    T._sync()
    idx, vals = coalesced_parts(T)
    S = T._sparse_shape
    return (keys_of(idx, S) if _keys_fit(S) else idx.to(torch.int64)), vals, T._fill


def pack(
    T: torch.Tensor | None, call: int = 0, arg: int = 0, nan: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(header, payload)`` of ``T`` (``None``: an absent header, no bytes); ``nan``: record in the
    header whether a stored value or the fill is NaN (one pass over the values)."""
    if T is None:
        return describe(None, call, arg), torch.empty(0, dtype=torch.uint8)
    if not isinstance(T, SparseTensor):
        payload = _pad8(_bytes(T))
        return describe(T, call, arg, 0, payload.numel()), payload
    keys, vals, fill = parts(T)
    payload = _pad8(torch.cat([_bytes(keys), _bytes(vals), _bytes(fill)]))
    h = describe(T, call, arg, vals.shape[0], payload.numel())
    h[HAS_NAN] = (
        nan
        and (vals.is_floating_point() or vals.is_complex())
        and bool(vals.isnan().any() or fill.isnan().any())
    )
    return h, payload


class Parts(NamedTuple):
    """A received SparseTensor before it is built: linear keys (sorted, unique), values, fill."""

    keys: torch.Tensor
    vals: torch.Tensor
    fill: torch.Tensor
    indefinite: bool
    layout: torch.layout


def unpack(h, payload: torch.Tensor, shape, device, *, keys: bool = False):
    """The tensor a ``(header, payload)`` pair stands for (a coalesced SparseTensor, or dense);
    ``shape`` is the receiver's (equal to the sender's: :func:`mismatch` compared them).  ``keys``:
    a SparseTensor whose sparse shape has < 2**63 positions comes as its :class:`Parts` (no
    unravelling of the keys)."""
    shape = tuple(shape)
    dtype, nkey, nval = _checked_header(h, payload.numel(), shape)
    payload = payload.to(device)
    if h[KIND] == DENSE:
        return _from_bytes(payload, dtype, shape)
    sdim = int(h[NDIM]) - int(h[DENSE_DIM])
    S, D = shape[:sdim], shape[sdim:]
    nse = int(h[NSE])
    ix = _from_bytes(payload[:nkey], torch.int64, (-1,))
    vals = _from_bytes(payload[nkey : nkey + nval], dtype, (nse,) + tuple(D))
    fill = _from_bytes(payload[nkey + nval :], dtype, fill_shape(h, D)).clone()
    layout = LAYOUTS[int(h[LAYOUT])]
    if _keys_fit(S):
        _check_keys(ix, S)
        if keys:
            return Parts(ix, vals, fill, bool(h[INDEFINITE]), layout)
        idx = coords_of(ix, S)
    else:
        idx = ix.view(sdim, nse)
        _received(
            check_parts,
            torch.sparse_coo,
            S + tuple(D),
            vals,
            fill,
            idx,
            indefinite=bool(h[INDEFINITE]),
            coalesced=True,
        )
    return parts_to_sparse(
        idx, vals, shape, fill, indefinite=bool(h[INDEFINITE]), layout=layout, coalesced=True
    )


# ---------------------------------------------------------------------- what a receiver checks
def _received(check, *args, **kwargs) -> None:
    """``check(*args, **kwargs)``, its error a ValueError that says the parts came from another
    rank."""
    try:
        check(*args, **kwargs)
    except (ValueError, TypeError, IndexError) as e:
        raise ValueError(f"sparsefill.distributed: received an invalid tensor: {e}") from None


def _checked_header(h, nbytes: int, shape) -> tuple:
    """``(dtype, key bytes, value bytes)`` of a received header that fits the receiver's ``shape``
    and a payload of ``nbytes`` (ValueError otherwise): the codes in range, the sizes within the
    payload."""

    def need(ok, what):
        if not ok:
            raise ValueError(
                f"sparsefill.distributed: received an invalid header ({what}): {h.tolist()}"
            )

    need(0 <= int(h[DTYPE]) < len(DTYPES) and int(h[KIND]) in (SPARSE, DENSE), "dtype or kind code")
    need(int(h[NDIM]) == len(shape), f"ndim for a tensor of shape {shape}")
    dtype = DTYPES[int(h[DTYPE])]
    if h[KIND] == DENSE:
        need(
            nbytes >= _index.numel(shape) * dtype.itemsize,
            f"{nbytes} bytes for a dense {dtype} {shape}",
        )
        return dtype, 0, 0
    sdim = len(shape) - int(h[DENSE_DIM])
    need(
        0 <= int(h[LAYOUT]) < len(LAYOUTS)
        and 0 <= sdim <= len(shape)
        and (sdim >= 2 or h[LAYOUT] == 0),
        "layout or dense_dim",
    )
    D, nse, nfill = shape[sdim:], int(h[NSE]), int(h[FILL_NDIM])
    need(
        0 <= nse
        and int(h[INDEFINITE]) in (0, 1)
        and 0 <= nfill <= (1 if h[INDEFINITE] else len(D)),
        "nse, fill ndim or indefinite",
    )
    nkey = nse * 8 * (1 if _keys_fit(shape[:sdim]) else sdim)
    nval = nse * _index.numel(D) * dtype.itemsize
    need(
        nkey + nval + _index.numel(fill_shape(h, D)) * dtype.itemsize <= nbytes,
        f"nse={nse} needs more than the {nbytes} bytes received",
    )
    return dtype, nkey, nval


def _check_keys(keys: torch.Tensor, S) -> None:
    """Received linear keys are sorted without duplicates (what the sender promises) and in ``[0,
    numel(S))``: one pass."""
    n = _index.numel(S)
    if keys.numel() and (int(keys[0]) < 0 or int(keys[-1]) >= n):
        raise ValueError(
            f"sparsefill.distributed: received an invalid tensor: keys: an entry "
            f"{int(keys[0]) if int(keys[0]) < 0 else int(keys[-1])} out of range [0, {n}) of the "
            f"sparse shape {tuple(S)}"
        )
    if keys.numel() > 1 and bool((keys[1:] <= keys[:-1]).any()):
        at = int((keys[1:] <= keys[:-1]).nonzero()[0]) + 1
        raise ValueError(
            f"sparsefill.distributed: received an invalid tensor: keys must be sorted without "
            f"duplicates; key {at} ({int(keys[at])}) follows {int(keys[at - 1])}"
        )


def parts_to_tensor(p: Parts, shape) -> torch.Tensor:
    """The SparseTensor of :class:`Parts` of a tensor of ``shape``."""
    sdim = len(shape) - (p.vals.dim() - 1)
    return parts_to_sparse(
        coords_of(p.keys, tuple(shape)[:sdim]),
        p.vals,
        tuple(shape),
        p.fill,
        indefinite=p.indefinite,
        layout=p.layout,
        coalesced=True,
    )


def fill_shape(h, D) -> tuple:
    """The fill's own shape: its last ``fill ndim`` dense dims, with the 1s the mask records."""
    n = int(h[FILL_NDIM])
    if h[INDEFINITE]:
        return (0,)
    ones = int(h[FILL_ONES])
    dims = tuple(D)[len(D) - n :] if n else ()
    return tuple(1 if ones >> i & 1 else d for i, d in enumerate(dims))


def _from_bytes(b: torch.Tensor, dtype, shape) -> torch.Tensor:
    n = _index.numel(shape) if -1 not in shape else b.numel() // dtype.itemsize
    return (
        b[: n * dtype.itemsize].view(dtype).reshape(shape)
        if n
        else torch.empty(shape if -1 not in shape else 0, dtype=dtype, device=b.device)
    )


def dense_value(T: torch.Tensor) -> torch.Tensor:
    """The dense tensor a received value stands for (to store in a dense output)."""
    return dense_of(T) if isinstance(T, SparseTensor) else T
