"""Losses in closed form over the stored elements (``losses``), and the masked mean of the losses
torch differentiates above the dispatcher (``masked_mean``)."""
