"""Matrix products: the fill decomposition, the aten handlers, products with non-finite fills,
sampled products, and their backward."""
