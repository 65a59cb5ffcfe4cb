"""Fashion-MNIST for the Python examples: Debian's dataset-fashion-mnist IDX files, read
and checked by scripts/make_fashion_mnist_h5.py (no HDF5 file needed), as torch tensors."""
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "scripts"))
from make_fashion_mnist_h5 import DEFAULT_SOURCE, read_part  # noqa: E402


@functools.lru_cache(maxsize=2)
def load(train_samples, test_samples):
    """(x, y, x_test, y_test): the first train_samples training and test_samples test
    images of the official split (0: all), [N, 1, 28, 28] float32 pixel intensities
    divided by 255 as the IPU tutorial does, and int64 labels 0..9."""
    x, y = read_part(DEFAULT_SOURCE, "train", train_samples or None)
    x_test, y_test = read_part(DEFAULT_SOURCE, "test", test_samples or None)
    return (torch.from_numpy(x / 255), torch.from_numpy(y), torch.from_numpy(x_test / 255),
            torch.from_numpy(y_test))
