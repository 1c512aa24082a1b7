"""SparseTensors built from gradient leaves ``(values, fill)`` and their dense twins, over the
layouts the op tests sweep: the gradient of an op on the SparseTensor must equal the gradient of
the same op on the dense twin, for the values and for the fill."""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill

LAYOUTS = ("coo", "csr", "hybrid", "uncoalesced", "nan", "empty")


class Leaves:
    """A random pattern over ``shape`` (~half stored) and the leaves of ``layout``."""

    def __init__(self, shape, layout="coo", dtype=torch.float64, seed=0, fill=0.25):
        g = torch.Generator().manual_seed(seed)
        if layout == "empty":
            shape = (0,) + tuple(shape[1:])
        self.layout, self.shape = layout, tuple(shape)
        self.dense_dim = 1 if layout == "hybrid" else 0
        S = self.shape[: len(shape) - self.dense_dim]
        D = self.shape[len(shape) - self.dense_dim :]
        self.mask = torch.rand(S, generator=g) < 0.5
        self.idx = self.mask.nonzero().T
        self.values = torch.randn((self.idx.shape[1],) + D, generator=g, dtype=dtype)
        self.fill = (
            torch.full(D, float("nan"), dtype=dtype)
            if layout == "nan"
            else torch.randn(D, generator=g, dtype=dtype)
            if D
            else torch.tensor(fill, dtype=dtype)
        )

    def leaves(self):
        return self.values.clone().requires_grad_(), self.fill.clone().requires_grad_()

    def sparse(self, v, f):
        idx = self.idx
        if self.layout == "uncoalesced":  # each element twice, halves adding up, shuffled
            perm = torch.randperm(2 * idx.shape[1], generator=torch.Generator().manual_seed(1))
            idx, v = torch.cat([idx, idx], 1)[:, perm], torch.cat([v / 2, v / 2])[perm]
        A = sparsefill.sparse_coo_tensor(idx, v, self.shape, fill_value=f)
        return A.to_sparse_csr() if self.layout == "csr" else A

    def dense(self, v, f):
        z = torch.zeros(self.shape, dtype=v.dtype).index_put(tuple(self.idx), v)
        m = self.mask.reshape(self.mask.shape + (1,) * self.dense_dim)
        return torch.where(m, z, f)


def dense_value(t):
    if isinstance(t, sparsefill.SparseTensor):
        return t.to_dense()
    if isinstance(t, (tuple, list)):
        return type(t)(dense_value(x) for x in t)
    return t


def check_op(op, leaves: Leaves, *, native=True, seed=2):
    """``op(A)`` against ``op(D)``: the values, and the gradients of ``values`` and ``fill`` of
    ``sum(op(.) * W)``; with ``native`` no DensifyWarning forward or backward."""
    v, f = leaves.leaves()
    dv, df = leaves.leaves()
    try:
        ref = op(leaves.dense(dv, df))
    except Exception as e:  # noqa: BLE001 - the dense op rejects the input: so must the sparse call
        with pytest.raises(type(e)):
            op(leaves.sparse(v, f))
        return
    with warnings.catch_warnings():
        if native:
            warnings.simplefilter("error", sparsefill.DensifyWarning)
        out = op(leaves.sparse(v, f))
        outs, refs = dense_value(out), ref
        if isinstance(refs, torch.Tensor):
            outs, refs = (outs,), (refs,)
        g = torch.Generator().manual_seed(seed)
        loss_s, loss_d = 0, 0
        for o, r in zip(outs, refs):
            torch.testing.assert_close(o, r, equal_nan=True, **_tol(r))
            if r.requires_grad:
                W = torch.randn(r.shape, generator=g, dtype=r.dtype)
                loss_s, loss_d = loss_s + (o * W).sum(), loss_d + (r * W).sum()
        if isinstance(loss_d, int):
            return
        loss_s.backward()
        loss_d.backward()
    z, tol = torch.zeros_like, _tol(v)
    torch.testing.assert_close(
        z(v) if v.grad is None else v.grad,
        z(dv) if dv.grad is None else dv.grad,
        equal_nan=True,
        **tol,
    )
    torch.testing.assert_close(
        z(f) if f.grad is None else f.grad,
        z(df) if df.grad is None else df.grad,
        equal_nan=True,
        **tol,
    )


def _tol(t) -> dict:
    """float32: the fill's gradient sums many elements (n * g in closed form, one by one densely),
    so the two differ by rounding beyond assert_close's float32 default."""
    return dict(rtol=1e-4, atol=1e-4) if t.dtype == torch.float32 else {}
