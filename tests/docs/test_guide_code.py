"""The code of the documentation's pages runs as written.

Every fenced ``python`` block of the README, ``docs/getting_started.md`` and ``docs/guide/*.md``
runs, the blocks of one page in order in one namespace (a page reads as one session). Blocks that
need what a test cannot give (a process group) are written as ``{code-block} python`` and are not
run. The examples gallery's scripts run in the site build and in ``tests/test_examples.py``; the
docstrings' examples are the package's doctests.
"""

import re
import warnings
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
if not DOCS.is_dir():
    pytest.skip(f"no docs folder at {DOCS} (not a source checkout)", allow_module_level=True)

PAGES = [
    DOCS.parent / "README.md",
    *sorted([DOCS / "getting_started.md", DOCS / "index.md", *(DOCS / "guide").glob("*.md")]),
]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_code_runs(page, capsys):
    blocks = BLOCK.findall(page.read_text())
    if page.stem in ("README", "getting_started", "operations", "autograd", "fill_values"):
        assert blocks, f"{page.name} lost its examples"
    namespace = {"__name__": f"docs_{page.stem}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DensifyWarning shown on purpose; CSR beta notice
        for i, code in enumerate(blocks):
            exec(compile(code, f"{page}:block{i}", "exec"), namespace)
