"""Shape, view, indexing, coordinate writes, concatenation and splits, with the backward of the
selections: views and reshapes (``reshape``), ``select``/``slice``/``A[i, j]``/``split``
(``indexing``), ``index_select`` (``index_select``), ``flip roll rot90 repeat`` (``rearrange``),
``tril triu diagonal trace`` (``diagonals``), ``nonzero masked_select masked_scatter``
(``masked_index``), reads and writes at coordinates (``coords``) and their backward
(``index_backward``), ``cat``/``stack`` (``concat``), splits (``split``), padding (``pad``)."""
