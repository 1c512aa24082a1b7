"""The style and typing checks, with the configuration in ``pyproject.toml``: ``ruff check``,
``ruff format --check`` and ``mypy`` (on the public modules) pass on the repository, and every public
function of sparsefill is annotated (``py.typed``: the package promises its annotations).

ruff and mypy are in the ``test`` extra, so CI runs these; where one is not installed its test is
skipped with that reason (``-rs`` lists it).
"""

import ast
import importlib
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = [
    "sparsefill",
    "sparsefill.masked",
    "sparsefill.segment",
    "sparsefill.nn",
    "sparsefill.data",
    "sparsefill.distributed",
]


def _tool(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (pip install '.[lint]')")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )


def test_ruff_check():
    _tool("ruff")
    r = _run("ruff", "check", "src", "tests", "examples", "tools")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format():
    _tool("ruff")
    r = _run("ruff", "format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_line_over_100_characters_in_src():
    """ruff's E501 passes a long line that ends in a ``# noqa`` or ``# type:`` comment; this
    does not."""
    long = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in sorted((ROOT / "src").rglob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > 100
    ]
    assert not long, long


def test_mypy_on_the_public_modules():
    _tool("mypy")
    r = _run("mypy")  # the files and options of [tool.mypy]
    assert r.returncode == 0, r.stdout + r.stderr


def _public_functions():
    """``(qualified name, function)`` of every public function and public method of a public
    class, torch's own functions that a module re-exports left out."""
    for mod in PUBLIC:
        M = importlib.import_module(mod)
        for name in M.__all__:
            obj = getattr(M, name)
            if inspect.isclass(obj):  # its methods, inherited ones included
                members = [
                    (f"{mod}.{name}.{k}", inspect.getattr_static(obj, k))
                    for k in dir(obj)
                    if not k.startswith("_") or k == "__init__"
                ]
            else:
                members = [(f"{mod}.{name}", obj)]
            for qual, f in members:
                f = inspect.unwrap(getattr(f, "__func__", f))  # (methods torch's wrappers patch)
                if inspect.isfunction(f) and f.__module__.startswith("sparsefill"):
                    yield qual, f


def test_public_functions_are_annotated():
    missing = []
    for qual, f in _public_functions():
        sig = inspect.signature(f)
        params = [
            p.name
            for p in sig.parameters.values()
            if p.annotation is inspect.Parameter.empty and p.name not in ("self", "cls")
        ]
        returns = sig.return_annotation is inspect.Signature.empty and f.__name__ != "__init__"
        if params or returns:
            missing.append(f"{qual}: {params}{' and the result' if returns else ''}")
    assert not missing, "not annotated:\n" + "\n".join(missing)


def test_the_public_functions_are_found():
    """The walk above sees the API it checks (a walk that found nothing would pass)."""
    names = {q for q, _ in _public_functions()}
    assert {
        "sparsefill.sparse_coo_tensor",
        "sparsefill.masked.sum",
        "sparsefill.segment.reduce",
        "sparsefill.segment.lengths_sum",
        "sparsefill.nn.SparseLinear.forward",
        "sparsefill.data.collate",
        "sparsefill.distributed.all_reduce",
        "sparsefill.explain",
    } <= names
    assert len(names) > 150


def test_segment_aliases_are_declared_for_type_checkers():
    """``sparsefill.segment`` makes its Caffe2 aliases at import; the names it declares for type
    checkers (under ``TYPE_CHECKING``) are exactly those."""
    seg = importlib.import_module("sparsefill.segment")
    tree = ast.parse(inspect.getsource(seg))
    declared = {
        node.target.id
        for block in tree.body
        if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.AnnAssign)
    }
    assert declared == set(seg.ALIASES)
