"""Output segments of a masked reduction: scalar elements and the fill table of
``sparsefill._kernels.reducer``.

A reduction over dims ``R`` of a :class:`~._canon.Masked` input maps every stored scalar element
``(row r, dense position d)`` to an output segment ``s = slice(r) * Pk + d_kept`` and gives each
segment ``C = Pr`` fill classes (one per reduced dense position): class ``c`` of segment ``s`` is
``n[s, c]`` copies of the value ``F[s, c]``.  The reducers of ``sparsefill._kernels.reducer`` (the
protocol shared with sparse and segment reductions) take ``(values, seg, nseg, fill=F, n_fill=n)``
as a fill
table and compute, for each segment, in closed form::

    out[s] = op(values[seg == s]  ++  [F[s, c]] * n[s, c] for c in range(C))

``Slices`` prepares ``values``/``seg``/``F``/``n`` for the touched segments and for the *untouched*
slice (all positions outside the pattern), whose result is the output's fill.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._kernels.grouping import csr_row_slices, group_slices
from sparsefill.masked._canon import Masked

__all__ = ["Slices", "canonical_dims", "reduce"]


def canonical_dims(dim, ndim: int) -> tuple[int, ...]:
    """As ``torch.masked``: None or ``()`` is every dim; duplicates and out-of-range dims raise."""
    if dim is None or dim == ():
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    n = max(ndim, 1)
    out = []
    for d in dims:
        if not -n <= d < n:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})"
            )
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
        # plain CSR along its columns: the rows are the slices
        if X.rows is not None and self.red_s == [1]:
            counts = X.A._crow.diff()
            # (static)
            self.out_idx, self.n_u, lengths = csr_row_slices(counts, S[1], all_rows=traced(counts))
            self.seg_row = (
                X.rows
                if self.out_idx.shape[1] == counts.numel()
                else _index.runs_to_ids(lengths, k)
            )
        elif self.red_s:
            self.seg_row, self.out_idx, self.n_u = group_slices(X.indices(), S, self.red_s)
            trailing = max(self.red_s) == len(S) - 1 and len(self.red_s) == len(S) - min(self.red_s)
            lengths = _index.numel([S[d] for d in self.red_s]) - self.n_u if trailing else None
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
        self.unsorted = False  # out_idx gained slices at its end (see _count_extra)
        self.n_in = self.n0_in = None
        if X.extra is not None:
            self._count_extra(X.extra)

    def _count_extra(self, mk):
        """Per (segment, class): the unspecified elements the strided mask ``mk`` masks in, as the
        total it masks in over the reduced sparse dims minus the stored ones.  Summed on ``mk`` as
        given (size-1 dims broadcast by a factor), so memory is O(mask + output).  Untouched slices
        with the same counts share the output's fill; otherwise those with a masked-in element join
        ``out_idx``."""
        X, S, D = self.X, self.X.S, self.X.D
        sd = len(S)
        keep_s = [d for d in range(sd) if d not in self.red_s]
        c = mk.to(torch.int64)
        summed = [d for d in self.red_s if mk.shape[d] > 1]
        if summed:
            c = c.sum(summed, keepdim=True)
        c = c * _index.numel([S[d] for d in self.red_s if mk.shape[d] == 1])
        kp = [c.shape[d] for d in keep_s]  # kept sparse dims: full or 1
        c = (
            c.reshape(kp + list(c.shape[sd:]))
            .expand(kp + list(D))
            .reshape([_index.numel(kp)] + list(D))
        )
        cs = self.scalars(c)  # (G', Pk, Pr)

        def at(idx):  # counts of output slices at kept sparse indices idx (len(keep_s), t)
            sub = (
                torch.stack(
                    [idx[i] if kp[i] > 1 else torch.zeros_like(idx[i]) for i in range(len(kp))]
                )
                if kp
                else idx
            )
            return cs[_index.linearize(sub, kp)]

        dev = cs.device
        tot = at(self.out_idx)  # (S_out, Pk, Pr)
        ms = self.scalars(X.m)
        cls = torch.arange(self.Pr, device=dev).expand(ms.shape)
        stored = torch.zeros((self.nseg, self.Pr), dtype=torch.int64, device=dev).index_put_(
            (self.seg3.reshape(-1), cls.reshape(-1)),
            ms.reshape(-1).to(torch.int64),
            accumulate=True,
        )
        n = tot.reshape(self.nseg, self.Pr) - stored
        kshape = [S[d] for d in keep_s]
        untouched = _index.numel(kshape) > self.S_out
        if not untouched or cs.shape[0] == 1 or bool((cs == cs[:1]).all()):
            self.n_in, self.n0_in = n, cs[0]
            return
        from sparsefill.masked._canon import _broadcast_positions

        pos = (cs.reshape(cs.shape[0], -1) > 0).any(1).nonzero().squeeze(1)
        pos = _broadcast_positions(_index.unravel(pos, kp), tuple(kp), tuple(kshape))
        new = pos[
            :, ~torch.isin(_index.linearize(pos, kshape), _index.linearize(self.out_idx, kshape))
        ]
        self.out_idx = torch.cat([self.out_idx, new], 1)
        self.n_in = torch.cat([n, at(new).reshape(-1, self.Pr)])
        self.n0_in = torch.zeros((self.Pk, self.Pr), dtype=torch.int64, device=dev)
        self.S_out = self.out_idx.shape[1]
        self.nseg = self.S_out * self.Pk
        self.lengths, self.unsorted = None, new.shape[1] > 0

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
        """``(values, seg, lengths)`` of the masked-in stored scalar elements (``lengths``: the
        segments are sorted gap-free runs, see ``_kernels.reducer.segment_combine``; None unless
        every element is masked in and the segments are sorted rows)."""
        u = self.X.u if u is None else u
        every = self.every_in if m is None else bool(m.all())
        ms = self.scalars(self.X.m if m is None else m)
        if every:
            return self.scalars(u).reshape(-1), self.seg3.reshape(-1), self.lengths
        return self.scalars(u)[ms], self.seg3[ms], None

    @functools.cached_property
    def every_in(self) -> bool:
        """Every stored element is masked in (the pattern-as-mask use; one read for an expanded
        mask)."""
        if self.X.all_in:  # (mask=None: no read, which torch.compile could not trace)
            return True
        m = self.X.m
        if traced(m):  # (torch.compile: not known without reading m; the general path)
            return False
        if m.numel() and all(st == 0 for st in m.stride()):
            return bool(m.reshape(-1)[0])
        return bool(m.all())

    def fill_classes(self, f: torch.Tensor, counts: bool | None = None):
        """``(F, n)`` for touched segments, ``(F0, n0)`` for the untouched slice (``counts``: mfill
        by default)."""
        on = self.X.mfill if counts is None else counts
        F2 = self.fill2(f)
        F = F2.expand(self.S_out, self.Pk, self.Pr).reshape(self.nseg, self.Pr)
        # a strided mask's masked-in unspecified elements
        if self.n_in is not None and counts is None:
            return (F, self.n_in), (F2, self.n0_in)
        n = (
            (self.n_u * int(on))[:, None, None]
            .expand(self.S_out, self.Pk, self.Pr)
            .reshape(self.nseg, self.Pr)
        )
        n0 = torch.full((self.Pk, self.Pr), self.N_r * int(on), dtype=torch.int64, device=F2.device)
        return (F, n), (F2, n0)

    def out_shape(self, keepdim: bool):
        """``(sparse shape, dense shape)`` of the result."""
        S, D = self.X.S, self.X.D
        if keepdim:
            return (
                tuple(1 if d in self.red_s else s for d, s in enumerate(S)),
                tuple(1 if d in self.red_d else s for d, s in enumerate(D)),
            )
        return tuple(s for d, s in enumerate(S) if d not in self.red_s), self.Dk

    def out_indices(self, keepdim: bool) -> torch.Tensor:
        if not keepdim or not self.red_s:
            return self.out_idx
        full = self.out_idx.new_zeros((len(self.X.S), self.S_out))
        keep = [d for d in range(len(self.X.S)) if d not in self.red_s]
        full[keep] = self.out_idx
        return full


def reduce(reducer, sl: Slices, v, seg, F, n, F0, n0, lengths=None):
    """``(per touched segment, per kept dense position of the untouched slice)``: ``reducer`` (a
    ``sparsefill._kernels.reducer`` reducer, or any callable with its signature) over the fill
    tables."""
    return (
        reducer(v, seg, sl.nseg, fill=F, n_fill=n, lengths=lengths),
        reducer(v[:0], seg[:0], sl.Pk, fill=F0, n_fill=n0),
    )
