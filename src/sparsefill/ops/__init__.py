"""Op handlers, one module per family; importing this package fills the registry."""

from . import activations, core, fallback, foreach, indexing, linalg, normalizations, reductions, registry  # noqa: F401
