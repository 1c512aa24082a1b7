"""``python -m sparsefill``: the tour of worked examples (``sparsefill.tour``);
``python -m sparsefill bench ...``: the benchmarks against the peers (``sparsefill.bench``)."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "bench":
    from sparsefill.bench import main

    sys.exit(main(sys.argv[2:]))

from sparsefill.tour import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
