"""Segment kernels with fill classes: the reducer protocol of ``sparsefill._reduce`` over scalar elements.

A reduction over dims ``R`` of a :class:`~._canon.Masked` input maps every stored scalar element
``(row r, dense position d)`` to an output segment ``s = slice(r) * Pk + d_kept`` and gives each
segment ``C = Pr`` *fill classes* (one per reduced dense position): class ``c`` of segment ``s`` is
``n[s, c]`` copies of the value ``F[s, c]``.  Every kernel computes, for each segment::

    out[s] = op(values[seg == s]  ++  [F[s, c]] * n[s, c] for c in range(C))

in closed form, never materialising the copies.  ``Slices`` prepares ``values``/``seg``/``F``/``n``
for the touched segments and for the *untouched* slice (all positions outside the pattern), whose
result is the output's fill.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _index
from .._reduce import group_slices, identity_of
from ._canon import Masked

__all__ = ["Slices", "seg_add", "seg_bcast", "seg_sum", "seg_prod", "seg_extreme", "seg_count", "seg_mean", "seg_var",
           "seg_logsumexp",
           "seg_norm", "seg_median", "seg_arg", "canonical_dims"]


def canonical_dims(dim, ndim: int) -> tuple[int, ...]:
    """As ``torch.masked``: None or ``()`` is every dim; duplicates and out-of-range dims raise."""
    if dim is None or dim == ():
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    n = max(ndim, 1)
    out = []
    for d in dims:
        if not -n <= d < n:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
        if d % n in out:
            raise RuntimeError(f"dim={d} appears multiple times in the list of dims")
        out.append(d % n)
    return tuple(sorted(d for d in out if d < ndim))


@dataclasses.dataclass
class Slices:
    """Output segments of reducing ``dims`` of ``X``; see the module docstring."""

    X: Masked
    dims: tuple

    def __post_init__(self):
        X, S, D = self.X, self.X.S, self.X.D
        sd = len(S)
        self.red_s = [d for d in self.dims if d < sd]
        self.red_d = [d - sd for d in self.dims if d >= sd]
        self.keep_d = [d for d in range(len(D)) if d not in self.red_d]
        self.Dk = tuple(D[d] for d in self.keep_d)
        self.Pk, self.Pr = _index.numel(self.Dk), _index.numel([D[d] for d in self.red_d])
        k = X.u.shape[0]
        dev = X.u.device
        if X.rows is not None and self.red_s == [1]:  # plain CSR along its columns: the rows are the slices
            counts = X.A._crow[1:] - X.A._crow[:-1]
            nonempty = counts > 0
            self.out_idx = nonempty.nonzero().T
            self.seg_row = X.rows if self.out_idx.shape[1] == counts.numel() else torch.repeat_interleave(
                torch.arange(self.out_idx.shape[1], device=dev), counts[nonempty], output_size=k)
            self.n_u = S[1] - counts[nonempty]
            lengths = counts[nonempty]
        elif self.red_s:
            self.seg_row, self.out_idx, self.n_u, lengths = _group(X.indices(), S, self.red_s)
        else:
            self.seg_row = torch.arange(k, device=dev)
            self.out_idx = X.indices()
            self.n_u = torch.zeros(k, dtype=torch.int64, device=dev)
            lengths = None
        self.N_r = _index.numel([S[d] for d in self.red_s])
        self.S_out = self.out_idx.shape[1]
        self.nseg = self.S_out * self.Pk
        self._perm = [0] + [d + 1 for d in self.keep_d] + [d + 1 for d in self.red_d]
        seg = self.seg_row[:, None, None]
        if self.Pk != 1:
            seg = seg * self.Pk + torch.arange(self.Pk, device=dev)[None, :, None]
        self.seg3 = seg.expand(k, self.Pk, self.Pr)
        # sorted, gap-free segments of one scalar each (rows of a plain matrix): segment_reduce and
        # repeat_interleave instead of index_add and gathers
        self.lengths = lengths if lengths is not None and self.Pk == 1 and self.Pr == 1 else None

    # ---------------------------------------------------------------- element views
    def scalars(self, t: torch.Tensor) -> torch.Tensor:
        """``(k, *D)`` -> ``(k, Pk, Pr)`` (kept dense dims, then reduced ones)."""
        return t.permute(self._perm).reshape(t.shape[0], self.Pk, self.Pr)

    def unscalars(self, t: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`scalars` (for outputs shaped like the input)."""
        D = self.X.D
        shp = (t.shape[0],) + tuple(D[d] for d in self.keep_d) + tuple(D[d] for d in self.red_d)
        inv = [self._perm.index(i) for i in range(len(self._perm))]
        return t.reshape(shp).permute(inv)

    def fill2(self, f: torch.Tensor) -> torch.Tensor:
        """A fill expanded to ``D`` -> ``(Pk, Pr)``."""
        return self.scalars(f.expand(self.X.D)[None])[0]

    def masked_in(self, u=None, m=None):
        """``(values, seg, lengths)`` of the masked-in stored scalar elements (``lengths``: see
        :func:`seg_add`; None unless every element is masked in and the segments are sorted rows)."""
        u = self.X.u if u is None else u
        m = self.X.m if m is None else m
        ms = self.scalars(m)
        if bool(ms.all()):
            return self.scalars(u).reshape(-1), self.seg3.reshape(-1), self.lengths
        return self.scalars(u)[ms], self.seg3[ms], None

    def fill_classes(self, f: torch.Tensor, counts: bool | None = None):
        """``(F, n)`` for touched segments, ``(F0, n0)`` for the untouched slice (``counts``: mfill by default)."""
        on = self.X.mfill if counts is None else counts
        F2 = self.fill2(f)
        F = F2.expand(self.S_out, self.Pk, self.Pr).reshape(self.nseg, self.Pr)
        n = (self.n_u * int(on))[:, None, None].expand(self.S_out, self.Pk, self.Pr).reshape(self.nseg, self.Pr)
        n0 = torch.full((self.Pk, self.Pr), self.N_r * int(on), dtype=torch.int64, device=F2.device)
        return (F, n), (F2, n0)

    def out_shape(self, keepdim: bool):
        """``(sparse shape, dense shape)`` of the result."""
        S, D = self.X.S, self.X.D
        if keepdim:
            return (tuple(1 if d in self.red_s else s for d, s in enumerate(S)),
                    tuple(1 if d in self.red_d else s for d, s in enumerate(D)))
        return tuple(s for d, s in enumerate(S) if d not in self.red_s), self.Dk

    def out_indices(self, keepdim: bool) -> torch.Tensor:
        if not keepdim or not self.red_s:
            return self.out_idx
        full = self.out_idx.new_zeros((len(self.X.S), self.S_out))
        keep = [d for d in range(len(self.X.S)) if d not in self.red_s]
        full[keep] = self.out_idx
        return full


def _group(idx, S, red_s):
    """:func:`sparsefill._reduce.group_slices`; O(k) when the reduced dims are trailing sparse dims
    (then the kept keys of a coalesced pattern are already sorted)."""
    keep = [d for d in range(len(S)) if d not in red_s]
    if keep != list(range(len(keep))):
        return group_slices(idx, S, red_s) + (None,)
    kshape = [S[d] for d in keep]
    keys = _index.linearize(idx[: len(keep)], kshape)
    out_keys, seg, counts = torch.unique_consecutive(keys, return_inverse=True, return_counts=True)
    return seg, _index.unravel(out_keys, kshape), _index.numel([S[d] for d in red_s]) - counts, counts


# -------------------------------------------------------------------- kernels
def _sum_classes(F, n):
    return torch.where(n > 0, F * n.to(F.dtype) if F.is_floating_point() or F.is_complex() else F * n,
                       torch.zeros((), dtype=F.dtype, device=F.device)).sum(1)


def seg_add(v, seg, nseg, lengths=None):
    """``out[s] = sum(v[seg == s])``; with ``lengths`` (``seg`` sorted, every segment ``lengths[s] > 0``
    long) one pass of ``segment_reduce``."""
    if lengths is not None and v.is_floating_point():
        return torch.segment_reduce(v, "sum", lengths=lengths, unsafe=True)
    return v.new_zeros(nseg).index_add(0, seg, v)


def seg_bcast(t, seg, lengths=None):
    """``t[seg]``: a per-segment value at every element."""
    if lengths is not None:
        return torch.repeat_interleave(t, lengths, output_size=seg.numel())
    return t[seg]


def seg_sum(v, seg, nseg, F, n, lengths=None):
    out = seg_add(v, seg, nseg, lengths)
    return out + _sum_classes(F, n).to(out.dtype)


def seg_count(seg, nseg, n, lengths=None):
    if lengths is not None:
        return lengths + n.sum(1)
    return torch.bincount(seg, minlength=nseg)[:nseg] + n.sum(1) if seg.numel() else n.sum(1)


def seg_prod(v, seg, nseg, F, n, lengths=None):
    out = v.new_ones(nseg).scatter_reduce(0, seg, v, "prod", include_self=True)
    return out * torch.pow(F, n.to(F.dtype) if F.is_floating_point() else n).prod(1).to(out.dtype)


def seg_extreme(v, seg, nseg, F, n, mode, init=None, lengths=None):
    init = identity_of(mode, v.dtype) if init is None else init
    out = v.new_full((nseg,), init).scatter_reduce(0, seg, v, mode, include_self=True)
    if F.shape[-1] == 0:
        return out
    pad = torch.full((), init, dtype=F.dtype, device=F.device)
    f = torch.where(n > 0, F, pad)
    f = f.amax(1) if mode == "amax" else f.amin(1)
    out = torch.maximum(out, f) if mode == "amax" else torch.minimum(out, f)
    if torch.is_grad_enabled() and (v.requires_grad or F.requires_grad):
        return even_ties(out, v, seg, nseg, F, n)
    return out


def even_ties(best, v, seg, nseg, F, n):
    """``best`` (the extreme of every segment) as the mean of the elements equal to it, so that its gradient
    splits evenly among all of them, the ``n`` fill copies included (torch's amax/amin backward on the
    dense slice); segments with no such element (empty, NaN) keep ``best`` with no gradient."""
    b = best.detach()
    tv = v == b[seg]
    tf = (F == b[:, None]) & (n > 0)
    nf = torch.where(tf, n, torch.zeros_like(n)).to(b.dtype)
    count = seg_add(tv.to(b.dtype), seg, nseg) + nf.sum(1)
    total = seg_add(torch.where(tv, v, torch.zeros_like(v)), seg, nseg) + \
        torch.where(tf, F * nf, torch.zeros_like(F)).sum(1)
    return torch.where(count > 0, total / count.clamp_min(1), b)


def seg_mean(v, seg, nseg, F, n, lengths=None):
    return seg_sum(v, seg, nseg, F, n, lengths) / seg_count(seg, nseg, n, lengths)


def seg_var(v, seg, nseg, F, n, correction, lengths=None):
    count = seg_count(seg, nseg, n, lengths)
    mean = seg_sum(v, seg, nseg, F, n, lengths) / count
    d = v - seg_bcast(mean, seg, lengths)
    df = F - mean[:, None]
    acc = seg_add(d * d, seg, nseg, lengths) + _sum_classes(df * df, n)
    return acc / (count.to(acc.dtype) - correction).clamp_min(0)


def seg_logsumexp(v, seg, nseg, F, n, lengths=None):
    m = seg_extreme(v, seg, nseg, F, n, "amax")
    m0 = torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype, device=m.device)).detach()
    s = seg_add(torch.exp(v - seg_bcast(m0, seg, lengths)), seg, nseg, lengths) + \
        _sum_classes(torch.exp(F - m0[:, None]), n)
    return torch.log(s) + m0


def seg_norm(v, seg, nseg, F, n, p, lengths=None, size=None):
    """``vector_norm`` of each segment's masked-in elements; for a negative finite ``p`` the masked-out
    elements count as zeros (``torch.masked.norm``: ``where(mask, x, 0)``), so a segment with fewer
    than ``size`` masked-in elements has norm 0."""
    if p < 0 and not math.isinf(p):
        a, Fa = torch.abs(v), torch.abs(F)
        s = seg_sum(a ** p, seg, nseg, Fa ** p, n, lengths)
        out = s ** (1.0 / p)
        return torch.where(seg_count(seg, nseg, n, lengths) < size, torch.zeros_like(out), out)
    a, Fa = torch.abs(v), torch.abs(F)
    if math.isinf(p):
        return seg_extreme(a, seg, nseg, Fa, n, "amax" if p > 0 else "amin", init=0.0 if p > 0 else math.inf)
    if p == 0:
        return seg_sum((a != 0).to(a.dtype), seg, nseg, (Fa != 0).to(a.dtype), n, lengths)
    s = seg_sum(a ** p, seg, nseg, Fa ** p, n, lengths)
    pos = s != 0  # the root has no derivative at 0: use 0 there, as torch.linalg.vector_norm does
    return torch.where(pos, torch.where(pos, s, torch.ones_like(s)) ** (1.0 / p), torch.zeros_like(s))


def seg_median(v, seg, nseg, F, n, lengths=None):
    """Lower median of the non-NaN elements (``torch.nanmedian``); NaN for a segment with none."""
    C = F.shape[1] if F.dim() == 2 else 1
    vals = torch.cat([v, F.reshape(-1)])
    segs = torch.cat([seg, torch.arange(nseg, device=seg.device).repeat_interleave(C)])
    mult = torch.cat([torch.ones_like(seg), n.reshape(-1)])
    keep = (mult > 0) & ~torch.isnan(vals)
    vals, segs, mult = vals[keep], segs[keep], mult[keep]
    order = torch.argsort(vals.detach(), stable=True)
    order = order[torch.argsort(segs[order], stable=True)]
    vals, segs, mult = vals[order], segs[order], mult[order]
    total = torch.zeros(nseg, dtype=torch.int64, device=seg.device).index_add_(0, segs, mult)
    cum = torch.cumsum(mult, 0)
    start = torch.cumsum(total, 0) - total
    after = cum - start[segs]
    before = after - mult
    t = (total - 1).div(2, rounding_mode="floor")[segs]
    sel = (before <= t) & (t < after)
    out = torch.full((nseg,), math.nan, dtype=v.dtype, device=v.device)
    return out.index_put((segs[sel],), vals[sel])


def seg_arg(v, seg, nseg, pos, F, n, fpos, mode):
    """Position of the first maximum (``mode="amax"``) or minimum of each segment, NaN counting as
    the extreme (torch's argmax/argmin rule).  ``pos``: positions of the values; ``fpos[s, c]``: the
    first position of class ``c`` in segment ``s``."""
    best = seg_extreme(v, seg, nseg, F, n, mode)
    has_nan = torch.zeros(nseg, dtype=torch.bool, device=v.device)
    if v.is_floating_point():
        has_nan = has_nan.index_put((seg,), torch.isnan(v), accumulate=True) | (torch.isnan(F) & (n > 0)).any(1)
        best = torch.where(has_nan, torch.full((), math.nan, dtype=best.dtype, device=best.device), best)

    def hits(x, b):
        return (x == b) | (torch.isnan(x) & torch.isnan(b)) if x.is_floating_point() else x == b

    big = torch.iinfo(torch.int64).max
    cand = torch.where(hits(v, best[seg]), pos, torch.full_like(pos, big))
    out = torch.full((nseg,), big, dtype=torch.int64, device=v.device).scatter_reduce(0, seg, cand, "amin")
    fc = torch.where(hits(F, best[:, None]) & (n > 0), fpos, torch.full_like(fpos, big)).amin(1)
    return torch.minimum(out, fc)
