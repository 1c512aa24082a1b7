"""Sphinx configuration of the sparsefill site: ``python -m sphinx -W docs docs/_build/html``.

The site is built from the package that ``import sparsefill`` finds (the checkout's ``src/`` first,
so a build from a clone needs no install of sparsefill itself), with warnings as errors: a docstring
that does not render, a page outside every table of contents or a public name missing from the API
reference stops the build.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

# torch's C++ warnings (the profiler the examples use for peak memory prints one per run) would land
# in the gallery's captured output; set before torch is imported.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(DOCS / "_ext"))

import sparsefill  # noqa: E402

# The examples' CSR products print torch's beta notice; it is torch's, not a defect of the page.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")

project = "sparsefill"
author = "The sparsefill authors"
copyright = "The sparsefill authors, BSD-3-Clause"
release = version = sparsefill.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "sphinx.ext.napoleon",  # torch's docstrings (reused by sparsefill.distributed) are Google style
    "sphinx.ext.viewcode",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "sparsefill_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "_build",
    "_generated",  # included by performance.md
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
    "auto_examples/*.zip",
    "auto_examples/*.md5",
    "auto_examples/*.json",
]
templates_path = ["_templates"]
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]  # generated coverage page starts below level 1 in places

# --- API reference -------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": False}
# Docstring roles (:func:, :class:, ...) name torch, numpy and sparsefill's internal helpers.
# This machine has no copy of torch's inventory (no intersphinx), so a role whose target is not a
# page of this site renders as plain code text; sparsefill's public names link to their pages.
nitpicky = False
add_module_names = False
python_display_short_literal_types = True

# --- examples gallery ------------------------------------------------------------------------
# The examples run at build time at small sizes (their command-line arguments below), each draws
# one figure (``--plot``); the full sizes are ``python -m sparsefill bench --filter model:``.
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r".*\.py$",
    "ignore_pattern": r"__init__\.py",
    "reset_argv": "sparsefill_docs.gallery_argv",
    "download_all_examples": False,
    "remove_config_comments": True,
    "plot_gallery": "True",
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "within_subsection_order": "FileNameSortKey",
    "show_memory": False,
    "min_reported_time": 1e9,  # no per-example timing lines (they vary with load)
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
}

# --- HTML ------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"sparsefill {version}"
html_static_path = ["_static"]
html_css_files = ["sparsefill.css"]
toc_object_entries_show_parents = "hide"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "header_links_before_dropdown": 7,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {"index": [], "getting_started": [], "performance": [], "coverage": []}
html_show_sourcelink = False
os.environ.setdefault("MPLBACKEND", "Agg")
