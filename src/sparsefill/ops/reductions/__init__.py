"""Reductions, softmax (along a dim and per edge) and their backward."""
