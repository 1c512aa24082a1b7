"""The documentation's API reference lists every public name, and nothing that is not public.

``docs/api/*.rst`` lists the names by hand, in sections (the autosummary entries under a
``currentmodule``); the public names are the ``__all__`` of each public module, plus
``sparsefill.explain``. The source lists are compared with ``__all__`` on every run; the rendered
site's inventory (``docs/_build/html/objects.inv``, written by ``python -m sphinx -W docs
docs/_build/html``; CI builds it before the tests) is compared when a build is there. The build
itself fails when a public name is not a documented object (``docs/_ext/sparsefill_docs.py``).
"""

import importlib
import re
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"
INVENTORY = ROOT / "docs" / "_build" / "html" / "objects.inv"
PUBLIC_MODULES = (
    "sparsefill",
    "sparsefill.masked",
    "sparsefill.segment",
    "sparsefill.distributed",
    "sparsefill.nn",
    "sparsefill.data",
)
EXTRA = {"sparsefill.explain"}

if not API.is_dir():
    pytest.skip(f"no docs/api folder at {API} (not a source checkout)", allow_module_level=True)


def public_names() -> set[str]:
    names = set(EXTRA)
    for name in PUBLIC_MODULES:
        mod = importlib.import_module(name)
        names |= {f"{name}.{n}" for n in mod.__all__}
    return names


def listed_names(text: str) -> list[str]:
    """The qualified names of the autosummary entries of one page, in order."""
    out, module, in_summary = [], None, False
    for line in text.splitlines():
        m = re.match(r"\.\. currentmodule:: (\S+)", line)
        if m:
            module = m.group(1)
            continue
        if line.startswith(".. autosummary::"):
            in_summary = True
            continue
        if in_summary:
            entry = line.strip()
            if line and not line.startswith("   "):
                in_summary = False
            elif entry and not entry.startswith(":"):
                out.append(f"{module}.{entry}")
    return out


def test_every_public_name_is_listed_once():
    listed = [n for page in sorted(API.glob("*.rst")) for n in listed_names(page.read_text())]
    public = public_names()
    assert len(public) > 150  # the walk found the modules' __all__
    duplicates = sorted({n for n in listed if listed.count(n) > 1})
    assert not duplicates, f"listed twice: {duplicates}"
    missing = sorted(public - set(listed))
    assert not missing, f"public names missing from docs/api/*.rst: {missing}"
    extra = sorted(set(listed) - public)
    assert not extra, f"docs/api/*.rst lists names that are not public: {extra}"


def test_listed_names_parser_reads_sections():
    text = (
        ".. currentmodule:: sparsefill.nn\n\nA\n-\n\n.. autosummary::\n   :toctree: generated\n\n"
        "   SparseLinear\n   SparseParameter\n\nText after.\n\n.. currentmodule:: sparsefill\n\n"
        ".. autosummary::\n\n   explain\n"
    )
    assert listed_names(text) == [
        "sparsefill.nn.SparseLinear",
        "sparsefill.nn.SparseParameter",
        "sparsefill.explain",
    ]


def rendered_names(path: Path) -> set[str]:
    """The ``py:`` objects of a Sphinx inventory (version 2: four header lines, then zlib)."""
    data = path.read_bytes()
    lines = data.split(b"\n", 4)
    assert lines[0].startswith(b"# Sphinx inventory version 2"), lines[0]
    names = set()
    for line in zlib.decompress(lines[4]).decode().splitlines():
        name, role = line.split(" ", 2)[:2]
        if role.startswith("py:"):
            names.add(name)
    return names


def test_rendered_reference_documents_every_public_name():
    if not INVENTORY.exists():
        pytest.skip(
            f"no built site at {INVENTORY.parent} (python -m sphinx -W docs docs/_build/html)"
        )
    missing = sorted(public_names() - rendered_names(INVENTORY))
    assert not missing, f"public names without a page in the built site: {missing}"
