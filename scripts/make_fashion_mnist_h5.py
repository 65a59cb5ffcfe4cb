#!/usr/bin/python3
"""Writes Fashion-MNIST (Zalando's 28x28 greyscale article images, 10 classes, shipped
as IDX files by Debian's dataset-fashion-mnist, no download) into roundoff's
training-data layout, keeping the official train/test split:
  x      [60000, 1, 28, 28] float32  training images, pixel intensities 0..255
  y      [60000]            int64    their labels 0..9
  x_test [10000, 1, 28, 28] float32  test images
  y_test [10000]            int64    their labels
Usage: scripts/make_fashion_mnist_h5.py [OUTPUT] [--train-samples N] [--test-samples M]
                                        [--source DIR]
  OUTPUT            default results/fashion_mnist.h5
  --train-samples N keep only the first N training images (default: all 60,000)
  --test-samples M  keep only the first M test images (default: all 10,000)
  --source DIR      where the IDX files are (default /usr/share/datasets/fashion-mnist)
Exits 2 with one line on stderr when the source files are missing or malformed.
"""
import argparse
import gzip
import os
import sys

import h5py
import numpy as np

DEFAULT_SOURCE = "/usr/share/datasets/fashion-mnist"
# (file, IDX magic number, expected count) per part; IDX: big-endian int32 magic
# 0x00000803 (unsigned bytes, 3 dimensions) for images, 0x00000801 for labels, then the
# dimensions as big-endian int32, then the bytes.
PARTS = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60000),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10000),
}
IMAGES_MAGIC, LABELS_MAGIC = 0x803, 0x801
SIDE = 28


class BadSource(Exception):
    pass


def read_idx(path, magic, dims):
    """The array of an IDX file with `dims` dimensions (uint8), checked."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise BadSource(f"{path}: cannot read: {e.strerror or e}")
    header = 4 + 4 * dims
    if len(raw) < header:
        raise BadSource(f"{path}: truncated IDX header")
    found = int.from_bytes(raw[0:4], "big")
    if found != magic:
        raise BadSource(f"{path}: IDX magic number {found:#x}, expected {magic:#x}")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    if len(raw) != header + int(np.prod(shape)):
        raise BadSource(f"{path}: {len(raw) - header} data bytes for shape {shape}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def read_part(source, part, keep):
    images_file, labels_file, count = PARTS[part]
    images = read_idx(os.path.join(source, images_file), IMAGES_MAGIC, 3)
    labels = read_idx(os.path.join(source, labels_file), LABELS_MAGIC, 1)
    if images.shape != (count, SIDE, SIDE) or labels.shape != (count,):
        raise BadSource(f"{source}: {part} images {images.shape} and labels {labels.shape}, "
                        f"expected ({count}, {SIDE}, {SIDE}) and ({count},)")
    if labels.max() > 9:
        raise BadSource(f"{source}/{labels_file}: label {labels.max()} outside 0..9")
    n = count if keep is None else keep
    x = images[:n].astype(np.float32).reshape(n, 1, SIDE, SIDE)
    return x, labels[:n].astype(np.int64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output", nargs="?", default=os.path.join("results", "fashion_mnist.h5"))
    parser.add_argument("--train-samples", type=int, default=None)
    parser.add_argument("--test-samples", type=int, default=None)
    parser.add_argument("--source", default=DEFAULT_SOURCE)
    args = parser.parse_args()
    for name, keep, count in (("--train-samples", args.train_samples, 60000),
                              ("--test-samples", args.test_samples, 10000)):
        if keep is not None and not 1 <= keep <= count:
            print(f"make_fashion_mnist_h5.py: {name} {keep} is not in 1..{count}", file=sys.stderr)
            return 2
    if not os.path.isdir(args.source):
        print(f"make_fashion_mnist_h5.py: {args.source}: no such directory (install Debian's "
              "dataset-fashion-mnist: scripts/setup --tests does)", file=sys.stderr)
        return 2
    try:
        x, y = read_part(args.source, "train", args.train_samples)
        x_test, y_test = read_part(args.source, "test", args.test_samples)
    except BadSource as e:
        print(f"make_fashion_mnist_h5.py: {e}", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with h5py.File(args.output, "w") as f:
        f.create_dataset("x", data=x)
        f.create_dataset("y", data=y)
        f.create_dataset("x_test", data=x_test)
        f.create_dataset("y_test", data=y_test)
        f.attrs["source"] = ("Fashion-MNIST (Xiao, Rasul and Vollgraf 2017), IDX files of Debian's "
                             f"dataset-fashion-mnist in {args.source}; official train/test split")
    print(f"wrote {args.output}: x {x.shape} float32, y {y.shape} int64, "
          f"x_test {x_test.shape}, y_test {y_test.shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
