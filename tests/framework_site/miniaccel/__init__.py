"""A stand-in for Hugging Face Accelerate installed beside the target (its shape, plain torch):
`Accelerator.prepare` hands back the model, the optimizer wrapped in an `AcceleratedOptimizer`
(a `torch.optim.Optimizer` subclass that never runs the base class's `__init__` and delegates
`step` and `zero_grad` to the optimizer it wraps) and a new DataLoader built around the given
loader's batch sampler (whose own `sampler` is a default SequentialSampler it never draws
from); `Accelerator.backward` runs the loss's backward pass."""

from miniaccel.accelerator import AcceleratedOptimizer, Accelerator

__all__ = ["AcceleratedOptimizer", "Accelerator"]
