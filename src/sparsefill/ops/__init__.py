"""Op handlers, one module per family; importing this package fills the registry."""

from . import (activations, coords, core, fallback, foreach, indexing, linalg, normalizations,  # noqa: F401
               reductions, registry)
