"""Losses and normalization layers of SparseTensors against the dense ops.

- **cross_entropy over sparse logits** (sampled softmax): ``batch`` rows of ``classes`` logits, of
  which ``stored`` per row (the target among them) are stored with an indefinite fill: forward
  and backward of ``F.cross_entropy``.  Peer: dense ``F.cross_entropy`` of the ``-inf``-filled
  logits (the same loss and gradient), forward and backward.
- **layer_norm over a hybrid tensor's dense dims**: ``rows x features`` with 1% of the rows stored
  (fill 0), ``F.layer_norm`` over the features (the pattern is kept: each stored row and the fill
  row once).  Peer: ``torch.nn.LayerNorm`` on the dense tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import sparsefill

from sparsefill.benchmarks.runner import case

_CE = {"batch 256, 50k classes, 100 stored per row": (256, 50_000, 100)}
_CE_QUICK = {"batch 64, 10k classes, 100 stored per row": (64, 10_000, 100)}
_CE_TINY = {"batch 4, 50 classes, 5 stored per row": (4, 50, 5)}


def _logits(param):
    batch, classes, stored = param
    g = torch.Generator().manual_seed(0)
    cols = torch.stack([torch.randperm(classes, generator=g)[:stored] for _ in range(batch)])
    rows = torch.arange(batch).repeat_interleave(stored)
    idx = torch.stack([rows, cols.reshape(-1)])
    vals = torch.randn(batch * stored, generator=g)
    target = cols[:, 0].clone()
    return idx, vals, target, (batch, classes)


def _ce_check(param, out):
    ref = out["dense F.cross_entropy, -inf logits"]
    for label, got in out.items():
        torch.testing.assert_close(got[0], ref[0], rtol=1e-4, atol=1e-5, msg=label)


@case(
    "cross_entropy over sparse logits (sampled softmax), forward + backward",
    sizes=_CE,
    quick_sizes=_CE_QUICK,
    tiny_sizes=_CE_TINY,
    check=_ce_check,
)
def sparse_cross_entropy(param):
    idx, vals, target, shape = _logits(param)
    dense = torch.full(shape, float("-inf")).index_put(tuple(idx), vals)

    def sparse_step():
        v = vals.clone().requires_grad_()
        A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=sparsefill.indefinite)
        loss = F.cross_entropy(A, target)
        loss.backward()
        return loss.detach(), v.grad

    def dense_step():
        x = dense.clone().requires_grad_()
        loss = F.cross_entropy(x, target)
        loss.backward()
        return loss.detach(), x.grad

    return [("sparsefill", sparse_step), ("dense F.cross_entropy, -inf logits", dense_step)]


_LN = {"16384 x 64 (1M elements), 1% of rows stored": (16384, 64, 0.01)}
_LN_TINY = {"64 x 8, 10% of rows stored": (64, 8, 0.1)}


def _ln_check(param, out):
    ref = out["dense nn.LayerNorm"]
    for label, got in out.items():
        got = got.to_dense() if isinstance(got, sparsefill.SparseTensor) else got
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5, msg=label)


@case(
    "layer_norm over a hybrid tensor's dense dims",
    sizes=_LN,
    tiny_sizes=_LN_TINY,
    check=_ln_check,
)
def hybrid_layer_norm(param):
    rows, features, density = param
    g = torch.Generator().manual_seed(0)
    stored = torch.randperm(rows, generator=g)[: max(1, int(rows * density))].sort().values
    x = torch.zeros(rows, features)
    x[stored] = torch.randn(stored.numel(), features, generator=g)
    H = sparsefill.to_sparse(x, fill_value=torch.zeros(features), dense_dim=1)
    ln = torch.nn.LayerNorm(features)
    w, b = ln.weight.detach(), ln.bias.detach()
    with torch.no_grad():
        return [
            ("sparsefill", lambda: F.layer_norm(H, (features,), w, b)),
            ("dense nn.LayerNorm", lambda: ln(x).detach()),
        ]
