"""roundoff.torch: roundoff's emulated arithmetic inside PyTorch models.

Low-precision optimizers (SGD, Adam) with the `train` experiment's update rules, and
loss scaling (LossScaler). Needs PyTorch (scripts/setup --torch).
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:
    raise ImportError("roundoff.torch needs PyTorch: scripts/setup --torch installs it") from e

from ._optim import SGD, Adam, UPDATE_RULES, sr_seed
from ._scaling import LossScaler

__all__ = ["SGD", "Adam", "UPDATE_RULES", "sr_seed", "LossScaler"]
