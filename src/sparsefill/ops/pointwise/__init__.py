"""Element-wise ops: the rule driven by ``torch.Tag.pointwise``, dense operands, activations,
dropout and the ``_foreach_*`` ops."""
