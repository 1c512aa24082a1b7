"""The data class's one seam to the layers above it: the hook table ``HOOKS`` (re-exported by
``tensor.py``, where ``SparseTensor`` calls it), which those layers fill with
:func:`install_hooks` when they load.  An import downward, like every other; ``import sparsefill``
loads every layer, so every entry is installed before a SparseTensor is used.

Invariant: every name in ``Hooks.ENTRIES`` is an attribute of ``HOOKS`` (None until installed), and
nothing else can be installed.

>>> sorted(set(Hooks.ENTRIES) - set(vars(HOOKS)))
[]
"""

from __future__ import annotations


class Hooks:
    """The data class's one seam to the layers above it: entries that those layers install when
    they load (:func:`install_hooks`), so that this layer imports none of them.  ``import
    sparsefill`` loads every layer, so each entry is installed before any SparseTensor is used.

    ==================  ============================  =============================================
    entry               installed by                  what it does
    ==================  ============================  =============================================
    ``to_dense``        ``_autograd.functions``       ``A.to_dense(fill_value=)``, differentiable
    ``values``          ``_autograd.functions``       ``A.values()``: the stored values,
                                                      differentiable
    ``same_dense``      ``_creation.constructors``    ``fn(A)`` for a conversion ``fn`` (the same
                                                      dense tensor), differentiable
    ``convert``         ``_creation.constructors``    ``A.to_sparse(layout, fill_value, dense_dim)``
    ``to_sparse``       ``_creation.constructors``    ``sparsefill.to_sparse`` of a dense tensor
    ``to_torch``        ``_creation.constructors``    ``A.to_torch()``: torch's own sparse tensor
    ``to_scipy`` ...    ``_creation.interop``         ``A.to_scipy()``, ``to_pydata``, ``to_pandas``
    ``all_stored``      ``_compile.dynamo``           tangents of torch.compile (every element
    ``coerce_tangent``                                stored)
    ``dispatch``        ``ops``                       ``__torch_dispatch__``: ``ops.registry``
    ``fast``            ``ops``                       a shortcut for one op (``fast(func)``), or
                                                      False
    ``route``           ``ops``                       ``__torch_function__``: an autograd route, or
                                                      NotImplemented
    ``routed``          ``ops``                       the functions ``route`` may take when every
                                                      argument is a SparseTensor or a Python value
    ``sync``            ``ops``                       view ``V`` catches up with its base
    ``write_through``   ``ops``                       a write to view ``V`` goes through to its base
    ``track``           ``ops``                       ``V`` is now the view ``func(*args)`` of
                                                      ``args[0]``
    ``gate``            ``ops``                       a passed-through call's dense result that
                                                      requires grad: the derivative formulas of its
                                                      SparseTensor operands ask the densify policy
    ==================  ============================  =============================================
    """

    ENTRIES = (
        "to_dense",
        "values",
        "same_dense",
        "convert",
        "to_sparse",
        "to_torch",
        "to_scipy",
        "to_pydata",
        "to_pandas",
        "all_stored",
        "coerce_tangent",
        "dispatch",
        "fast",
        "route",
        "routed",
        "sync",
        "write_through",
        "track",
        "gate",
    )

    def __init__(self):
        for name in self.ENTRIES:
            setattr(self, name, None)
        self.routed = frozenset()


HOOKS = Hooks()


def install_hooks(**entries) -> None:
    """Install entries of :class:`Hooks` (called by the layers above when they load)."""
    for name, fn in entries.items():
        if name not in Hooks.ENTRIES:
            raise TypeError(f"install_hooks: unknown entry {name!r}")
        setattr(HOOKS, name, fn)
