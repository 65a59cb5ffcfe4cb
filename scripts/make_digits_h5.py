#!/usr/bin/python3
"""Writes scikit-learn's 8x8 handwritten digits (1,797 images, shipped by Debian's
python3-sklearn, no download) into roundoff's training-data layout:
  x [N, 1, 8, 8] float32 (one channel of 8x8 pixel intensities 0..16), y [N] int64
  (digit 0..9). The MLP reads each image as its 64 pixels in row-major order (as the
  earlier layout x [N, 64] held them, which is still read); the convolutional models
  need the image shape.
Usage: scripts/make_digits_h5.py [OUTPUT]   (default results/digits.h5)
"""
import os
import sys

import h5py
import numpy as np
from sklearn.datasets import load_digits


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join("results", "digits.h5")
    digits = load_digits()
    x = np.asarray(digits.images, dtype=np.float32).reshape(-1, 1, 8, 8)
    y = np.asarray(digits.target, dtype=np.int64)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with h5py.File(out, "w") as f:
        f.create_dataset("x", data=x)
        f.create_dataset("y", data=y)
        f.attrs["source"] = "sklearn.datasets.load_digits (UCI optical recognition of handwritten digits, 8x8)"
    print(f"wrote {out}: x {x.shape} float32, y {y.shape} int64, {len(np.unique(y))} classes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
