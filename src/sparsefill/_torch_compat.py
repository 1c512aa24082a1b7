"""Every change sparsefill makes to torch's own objects, in one place, with why.

Checked on torch 2.13.0, the version CI installs (``pyproject.toml`` allows ``>=2.13,<2.14``);
``tests/test_torch_compat.py`` checks that each target still exists in the installed torch.

===================================================  ============================================
patch                                                why
===================================================  ============================================
:func:`run_after_import`: a ``sys.meta_path``        dynamo's registration runs when a program
finder that runs a callback once a module            imports ``torch._dynamo`` (importing it
(``torch._dynamo``) is imported, then removes        ourselves would add seconds to
itself                                               ``import sparsefill``)
:func:`set_plain_tangent_coercion`:                  AOTAutograd asks a *dense* incoming gradient
``torch.Tensor.__coerce_same_metadata_as_tangent__`` for the form of a SparseTensor tangent it
(set only where torch has none)                      traced; without it a dense ``out.backward(G)``
                                                     fails in a compiled backward
:func:`inline_in_dynamo`: dynamo's                   sparsefill's code is inlined where traced code
``trace_rules.BUILTIN_INLINE_WHEN_CALLED`` and       calls it (as torch's own modules) and never
``trace_rules.add``                                  compiled as a frame of its own; numba's
                                                     dispatcher frames are skipped
:func:`bind_unbound_symbols_at_graph_end`: wraps     dynamo binds a shared inner tensor's sizes
``SubgraphTracer.lookup_unbound_symbols``            where first needed, which can be before the
                                                     input that owns it (an invalid graph when an
                                                     optimizer's state shares a parameter's index
                                                     tensor); the bindings go to the graph's end
:func:`check_before_legacy_validation`: replaces     torch's legacy ``torch.load`` format reads a
``torch._utils._validate_loaded_sparse_tensors``     tensor's bytes after unpickling; the parts of
                                                     a SparseTensor in such a file are checked
                                                     there, before any kernel indexes memory
===================================================  ============================================

This module imports nothing else of sparsefill: the layers that need a patch call it.
"""

from __future__ import annotations

import importlib.machinery
import sys

import torch

TESTED_TORCH = "2.13"


def run_after_import(name: str, callback) -> None:
    """Run ``callback()`` right after module ``name`` is imported (now, if it is)."""
    if name in sys.modules:
        callback()
        return

    class _AfterImport:
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                callback()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterImport())


def set_plain_tangent_coercion(fn) -> None:
    """``torch.Tensor.__coerce_same_metadata_as_tangent__ = fn`` where torch defines none."""
    if not hasattr(torch.Tensor, "__coerce_same_metadata_as_tangent__"):
        torch.Tensor.__coerce_same_metadata_as_tangent__ = fn


def inline_in_dynamo(package_dir: str, *skipped: str) -> None:
    """Dynamo inlines the code under ``package_dir`` where traced code calls it, and never compiles
    a frame of it or of the modules ``skipped`` on its own."""
    import os

    rules = sys.modules["torch._dynamo"].trace_rules
    rules.BUILTIN_INLINE_WHEN_CALLED.add(package_dir + os.sep)
    for name in skipped:
        rules.add(name)


def bind_unbound_symbols_at_graph_end(tracer_cls) -> None:
    """``tracer_cls.lookup_unbound_symbols`` makes its binding nodes at the end of the graph (after
    every placeholder): they read only the sizes of the input that owns them."""
    lookup = getattr(tracer_cls, "lookup_unbound_symbols", None)
    if lookup is None or getattr(lookup, "_sparsefill", False):
        return

    def lookup_unbound_symbols(self, s):
        with self.graph.inserting_after(None):  # (None: the end of the graph)
            return lookup(self, s)

    lookup_unbound_symbols._sparsefill = True
    tracer_cls.lookup_unbound_symbols = lookup_unbound_symbols


def check_before_legacy_validation(check):
    """``torch._utils._validate_loaded_sparse_tensors`` runs ``check()`` first (once installed,
    further calls change nothing); returns torch's own function."""
    current = torch._utils._validate_loaded_sparse_tensors
    original = getattr(current, "_sparsefill_original", current)
    if original is current:

        def validate():
            try:
                check()
            finally:
                original()

        validate._sparsefill_original = original
        torch._utils._validate_loaded_sparse_tensors = validate
    return original
