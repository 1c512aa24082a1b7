"""Shape, view, indexing, coordinate writes, concatenation and splits, with the backward of the
selections."""
