"""Element-wise ops: the rule driven by ``torch.Tag.pointwise`` (``rule``), its fast path for the
common calls (``fast_path``) and the union of two patterns it merges on (``union``), dense operands
(``dense_operands``), activations, dropout and the ``_foreach_*`` ops."""
