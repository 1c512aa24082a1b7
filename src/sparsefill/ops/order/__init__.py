"""Order statistics and set/search ops: sort, top-k, quantiles, unique, isin, searchsorted,
histograms, and their backward."""
