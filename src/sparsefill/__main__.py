"""``python -m sparsefill``: the tour of worked examples (see ``sparsefill.tour``)."""

import sys

from .tour import main

sys.exit(main(sys.argv[1:]))
