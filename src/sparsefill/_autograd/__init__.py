"""autograd Functions of the constructors and conversions, the SparseTensor leaf's gradient hook,
and the guards of torch.func transforms (``transforms``)."""
