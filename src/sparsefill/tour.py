"""The tour: worked examples of the fill-value semantics, each checked against its dense equivalent.

Run it with ``python -m sparsefill``.  Every example computes a result on
SparseTensors and the same on ``A.to_dense()``; the check is the invariant
``densify(result) == dense result``.  The tour reports, per example, whether the
result stayed sparse and whether any step went through the densify fallback.
"""

from __future__ import annotations

import math
import warnings

import torch

import sparsefill
from sparsefill import SparseTensor

EXAMPLES = []


def example(title: str, source: str):
    def deco(fn):
        EXAMPLES.append((title, source, fn))
        return fn

    return deco


def _dense(x):
    return x.to_dense() if isinstance(x, SparseTensor) else x


@example("membrane potential of a rare-event signal", "fill values: an application")
def membrane_potential():
    idx = torch.tensor([[3, 8, 9, 17]])
    signal = sparsefill.sparse_coo_tensor(
        idx, torch.tensor([7.0, 6.0, 8.0, 9.0]), (1_000_001,), fill_value=5.0
    )
    mV_unit, a, extracellular = -8.0, 0.03, 4.0

    def compute(s):
        membrane_potential = s * mV_unit
        return extracellular * torch.exp(-a * membrane_potential)

    expected_fill = extracellular * math.exp(-a * 5 * mV_unit)
    out = compute(signal)
    ref = compute(signal.to_dense())
    assert abs(float(ref[0]) - expected_fill) < 1e-4 * expected_fill
    return out, ref


@example("fill of a hybrid tensor: scalar given, array seen", "fill values: hybrid tensors")
def hybrid_fill():
    A = sparsefill.sparse_coo_tensor([[0, 3]], [[0.11, 0.12], [0.31, 0.32]], (4, 2), fill_value=1.2)
    assert A._fill_value().shape == () and A.fill_value().shape == (2,)
    return A, torch.tensor([[0.11, 0.12], [1.2, 1.2], [1.2, 1.2], [0.31, 0.32]])


@example("changing the fill in place", "fill values: in place")
def fill_in_place():
    A = sparsefill.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (5,), fill_value=0.0)
    A.fill_value().fill_(1.2)
    return A, torch.tensor([1.0, 1.2, 1.2, 2.0, 1.2])


@example("softmax of a hybrid tensor along its sparse dim: an array fill", "reductions: softmax")
def hybrid_softmax():
    A = sparsefill.sparse_coo_tensor([[0, 3]], [[0.11, 0.12], [0.31, 0.32]], (4, 2))
    out = A.softmax(0)
    expect = sparsefill.sparse_coo_tensor(
        [[0, 3]], [[0.2492, 0.2503], [0.3044, 0.3057]], (4, 2), fill_value=[0.2232, 0.2220]
    )
    torch.testing.assert_close(_dense(out), expect.to_dense(), atol=1e-4, rtol=0)
    return out, A.to_dense().softmax(0)


@example("n-ary op: the fill is the op applied to the fills", "element-wise ops")
def nary_fill():
    A = sparsefill.sparse_coo_tensor([[0, 1], [0, 0]], [1.0, 3.0], (2, 2), fill_value=2.0)
    B = sparsefill.sparse_coo_tensor([[0, 1], [0, 1]], [5.0, 8.0], (2, 2), fill_value=6.0)
    return A + B, torch.tensor([[6.0, 8.0], [9.0, 10.0]])


@example("to_sparse with a fill: nothing left to specify", "conversions: to_sparse")
def to_sparse_fill():
    A = sparsefill.to_sparse(torch.ones(10), fill_value=1.0)
    assert A._nse() == 0
    return A, torch.ones(10)


@example("factories with a layout: fills per the table", "constructors")
def factories():
    outs = [
        sparsefill.zeros(2, 3),
        sparsefill.ones(2, 3, layout=torch.sparse_csr),
        sparsefill.full((2, 3), 7.0),
        sparsefill.eye(2, 3),
    ]
    assert all(isinstance(o, SparseTensor) for o in outs)
    return torch.cat([o.to_dense() for o in outs]), torch.cat(
        [torch.zeros(2, 3), torch.ones(2, 3), torch.full((2, 3), 7.0), torch.eye(2, 3)]
    )


@example("softmax along the sparse dim: fill 1/d per dense row", "reductions: softmax")
def softmax_along_sparse_dim():
    A = sparsefill.sparse_coo_tensor(
        [[0, 2, 4]],
        torch.tensor([[11.0, 21.0], [13.0, 23.0], [15.0, 25.0]], dtype=torch.float64),
        (5, 2),
    )
    out = A.softmax(0)
    d = torch.tensor(
        [
            math.exp(11) + 2 + math.exp(13) + math.exp(15),
            math.exp(21) + 2 + math.exp(23) + math.exp(25),
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(_dense(out)[1], 1 / d)
    return out, A.to_dense().softmax(0)


@example("indefinite fill: unspecified elements have no value", "fill values: indefinite")
def indefinite():
    A = sparsefill.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,), fill_value=sparsefill.indefinite)
    try:
        A.to_dense()
    except ValueError:
        pass
    else:
        raise AssertionError("to_dense() of an indefinite fill must raise")
    return A.to_dense(fill_value=float("nan")), torch.tensor([1.0, float("nan"), 2.0, float("nan")])


def run(verbose: bool = True) -> list[dict]:
    """Run every example; return one record per example (``ok``, ``sparse``, ``densified``,
    ``error``)."""
    records = []
    for title, source, fn in EXAMPLES:
        rec = {"title": title, "source": source}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out, ref = fn()
                torch.testing.assert_close(
                    _dense(out), _dense(ref), equal_nan=True, atol=1e-4, rtol=1e-4
                )
                rec.update(ok=True, sparse=isinstance(out, SparseTensor))
            except Exception as e:  # noqa: BLE001 - reported per example
                rec.update(ok=False, sparse=False, error=f"{type(e).__name__}: {e}")
        rec["densified"] = sorted(
            {
                str(w.message).split(":")[0]
                for w in caught
                if issubclass(w.category, sparsefill.DensifyWarning)
            }
        )
        records.append(rec)
        if verbose:
            status = "ok  " if rec["ok"] else "FAIL"
            kind = "sparse result" if rec["sparse"] else "dense result"
            how = f"densified: {', '.join(rec['densified'])}" if rec["densified"] else "native"
            print(f"[{status}] {title}  ({source})\n       {kind}; {how}")
            if not rec["ok"]:
                print(f"       {rec['error']}")
    return records


def main(argv=None) -> int:
    print(
        f"sparsefill {sparsefill.__version__} on torch {torch.__version__}: the worked examples, "
        "each checked against its dense equivalent\n"
    )
    records = run()
    bad = [r for r in records if not r["ok"]]
    print(f"\n{len(records) - len(bad)}/{len(records)} examples agree with the dense computation.")
    return 1 if bad else 0
