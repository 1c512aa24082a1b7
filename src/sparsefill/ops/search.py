"""Set and search ops of a SparseTensor (filled in below)."""
