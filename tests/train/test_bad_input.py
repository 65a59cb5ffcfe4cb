#!/usr/bin/python3
"""Bad input to the training experiments, through the real sweep binary: every class of
bad data file, unit/format combinations a unit refuses, a batch larger than the
training split, and data the convolutional models cannot take (flat samples, images too
small, a test split of another shape) must stop the sweep before any run (exit status 2, one line on stderr
naming the config, the point, the file and the reason), never as "this is a bug" (1); so
must a batch that does not split into dp_replicas x grad_accum micro-batches and unknown
esr modes, all-reduce orders, buffer formats or a grad_accum of 0.
Also: loss_scale takes a plain YAML number.

Usage: test_bad_input.py SWEEP   (SWEEP = path of build/sweep)
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

SWEEP = os.path.abspath(sys.argv[1])
failures = []


def run(cwd, config_text, name="c.yaml"):
    with open(os.path.join(cwd, name), "w") as f:
        f.write(config_text)
    p = subprocess.run([SWEEP, name, "-o", "out.h5", "--force"], cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def expect_bad(cwd, label, config_text, *fragments):
    out = os.path.join(cwd, "out.h5")
    if os.path.exists(out):
        os.remove(out)
    code, _, err = run(cwd, config_text)
    lines = err.strip().splitlines()
    problems = []
    if code != 2:
        problems.append("exit %d, not 2" % code)
    if len(lines) != 1:
        problems.append("%d lines on stderr, not 1" % len(lines))
    for fragment in ("c.yaml:",) + fragments:
        if fragment not in err:
            problems.append("stderr lacks %r" % fragment)
    if "bug" in err:
        problems.append("stderr calls it a bug")
    if os.path.exists(out):
        problems.append("an output file was written although nothing may run")
    if problems:
        failures.append("%s: %s\n    stderr: %s" % (label, "; ".join(problems), err.strip()))
    else:
        print("ok   %-28s %s" % (label, err.strip()))


def write(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            f.create_dataset(name, data=value)


def train_config(data, extra=""):
    return "experiment: train\ngrid:\n  data: %s\n  update: fp16-rn\n  epochs: 1\n%s" % (data, extra)


def main():
    with tempfile.TemporaryDirectory(prefix="roundoff-train-bad-") as d:
        rng = np.random.RandomState(0)
        x = rng.randn(100, 4).astype(np.float32)
        y = (np.arange(100) % 3).astype(np.int64)
        write(os.path.join(d, "good.h5"), x=x, y=y)
        # The good file runs (exit 0): the checks refuse only what is bad.
        code, _, err = run(d, train_config("good.h5"))
        if code != 0:
            failures.append("good file: exit %d: %s" % (code, err.strip()))

        os.mkdir(os.path.join(d, "folder.h5"))
        with open(os.path.join(d, "text.h5"), "w") as f:
            f.write("not an HDF5 file\n")
        write(os.path.join(d, "x1d.h5"), x=x[:, 0].copy(), y=y)
        write(os.path.join(d, "xint.h5"), x=(x * 10).astype(np.int32), y=y)
        write(os.path.join(d, "noy.h5"), x=x)
        write(os.path.join(d, "yfloat.h5"), x=x, y=y.astype(np.float32))
        write(os.path.join(d, "y2d.h5"), x=x, y=y.reshape(100, 1))
        write(os.path.join(d, "rows.h5"), x=x, y=y[:99])
        negative = y.copy()
        negative[5] = -1
        write(os.path.join(d, "negative.h5"), x=x, y=negative)
        nan = x.copy()
        nan[3, 2] = np.nan
        write(os.path.join(d, "nan.h5"), x=nan, y=y)

        cases = [
            ("missing file", "missing.h5", "no such file"),
            ("directory", "folder.h5", "is a directory"),
            ("not HDF5", "text.h5", "not an HDF5 file"),
            ("x not 2-D", "x1d.h5", "'x' must be a float dataset [N, D] or [N, C, H, W]"),
            ("x not float", "xint.h5", "its type is not float"),
            ("no y", "noy.h5", "no dataset 'y'"),
            ("y not integer", "yfloat.h5", "its type is not integer"),
            ("y not 1-D", "y2d.h5", "'y' must be a 1-D integer dataset"),
            ("row mismatch", "rows.h5", "x has 100 rows but y has 99 labels"),
            ("negative label", "negative.h5", "y[5] = -1 is not a label"),
            ("NaN in x", "nan.h5", "x[3, 2] is not finite"),
        ]
        for label, path, reason in cases:
            expect_bad(d, label, train_config(path), "data file '%s'" % path, reason)
            # grad_underflow reads the same files through the same check.
            expect_bad(d, "grad_underflow: " + label,
                       "experiment: grad_underflow\ngrid:\n  data: %s\n" % path, "data file '%s'" % path, reason)
        # A bad file in the middle of a grid: refused before the good points run.
        expect_bad(d, "bad file in a grid", train_config("[good.h5, nan.h5]"), "point 1", "data file 'nan.h5'")

        # Units that refuse the activation format as their matmul input format.
        for unit, fmt, says in [("v100", "bf16", "v100 tensor cores do not take bf16"),
                                ("ipu-amp", "bf16", "AMP"),
                                ("a100", "fp8-e4m3", "a100 tensor cores do not take fp8-e4m3")]:
            expect_bad(d, "unit %s + %s" % (unit, fmt),
                       "experiment: train\ngrid:\n  update: fp16-rn\n  unit: %s\n  act_format: %s\n  epochs: 1\n"
                       % (unit, fmt), "unit %s does not accept act_format %s" % (unit, fmt), says)

        # Batch larger than the training split: synthetic (2048 * 0.8 = 1638) and a file (80).
        expect_bad(d, "batch > synthetic split", "experiment: train\ngrid:\n  batch: [32, 1639]\n  epochs: 1\n",
                   "point 1", "batch 1639 is larger than the training split: 1638 of the 2048 samples")
        expect_bad(d, "batch > file split", train_config("good.h5", "  batch: 81\n"),
                   "batch 81 is larger than the training split: 80 of the 100 samples in data file 'good.h5'")
        expect_bad(d, "grad_underflow batch", "experiment: grad_underflow\ngrid:\n  batch: 1639\n",
                   "batch 1639 is larger than the training split")
        # Data-parallel replicas and gradient accumulation: the batch must split evenly into
        # micro-batches; the modes, orders and formats are checked by name.
        expect_bad(d, "batch not divisible", "experiment: train\ngrid:\n  dp_replicas: 3\n  epochs: 1\n",
                   "batch 32 is not a multiple of dp_replicas 3 x grad_accum 1 = 3")
        expect_bad(d, "batch not divisible (accum)",
                   "experiment: train\ngrid:\n  batch: 20\n  dp_replicas: 2\n  grad_accum: [2, 3]\n  epochs: 1\n",
                   "point 1", "batch 20 is not a multiple of dp_replicas 2 x grad_accum 3 = 6")
        expect_bad(d, "unknown esr mode", "experiment: train\ngrid:\n  esr: replica_identical\n",
                   "c.yaml:3:8", "grid.esr", "unknown esr 'replica_identical'", "replica_identical_only")
        expect_bad(d, "grad_accum 0", "experiment: train\ngrid:\n  grad_accum: 0\n",
                   "c.yaml:3:15", "grid.grad_accum", "must be >= 1, got 0")
        expect_bad(d, "dp_replicas 0", "experiment: train\ngrid:\n  dp_replicas: 0\n",
                   "grid.dp_replicas", "must be >= 1, got 0")
        expect_bad(d, "unknown allreduce order", "experiment: train\ngrid:\n  allreduce_order: butterfly\n",
                   "grid.allreduce_order", "unknown allreduce_order 'butterfly'")
        expect_bad(d, "unknown accum format", "experiment: train\ngrid:\n  accum_format: fp12\n",
                   "grid.accum_format", "fp12")
        expect_bad(d, "empty test split", "experiment: train\ngrid:\n  samples: 20\n  test_fraction: 0.01\n",
                   "leaves an empty training or test split")

        # The convolutional models: images only, large enough; a file's own test split
        # must match its training images; a missing shipped data file names its script.
        images = rng.randn(40, 1, 6, 6).astype(np.float32)
        labels = (np.arange(40) % 3).astype(np.int64)
        write(os.path.join(d, "images.h5"), x=images, y=labels)
        write(os.path.join(d, "tiny_images.h5"), x=rng.randn(40, 1, 3, 3).astype(np.float32), y=labels)
        write(os.path.join(d, "split_mismatch.h5"), x=images, y=labels,
              x_test=rng.randn(10, 2, 6, 6).astype(np.float32), y_test=labels[:10])
        write(os.path.join(d, "x_test_only.h5"), x=images, y=labels, x_test=images[:10])
        conv = "experiment: train\ngrid:\n  data: %s\n  model: %s\n  update: fp16-rn\n  epochs: 1\n  batch: 8\n"
        expect_bad(d, "convnet on flat data", conv % ("good.h5", "convnet"),
                   "data file 'good.h5'", "model convnet needs images x [N, C, H, W]", "flat samples x [N, 4]")
        expect_bad(d, "resnet on synthetic data", conv % ("synthetic", "resnet"),
                   "model resnet needs images: data must be an HDF5 file with x [N, C, H, W]")
        expect_bad(d, "convnet on 3x3 images", conv % ("tiny_images.h5", "convnet"),
                   "model convnet needs images of at least 4x4", "data file 'tiny_images.h5' holds [1, 3, 3]")
        expect_bad(d, "test split of other shape", conv % ("split_mismatch.h5", "convnet"),
                   "data file 'split_mismatch.h5'", "x_test's samples are [2, 6, 6] but x's are [1, 6, 6]")
        expect_bad(d, "x_test without y_test", conv % ("x_test_only.h5", "convnet"),
                   "has 'x_test' without 'y_test'")
        expect_bad(d, "missing fashion_mnist.h5", conv % ("results/fashion_mnist.h5", "convnet"),
                   "data file 'results/fashion_mnist.h5': no such file (create it with: /usr/bin/python3 "
                   "scripts/make_fashion_mnist_h5.py results/fashion_mnist.h5)")
        expect_bad(d, "conv: unit refuses format", conv % ("images.h5", "convnet") + "  unit: ipu-amp\n  act_format: bf16\n",
                   "unit ipu-amp does not accept act_format bf16")
        expect_bad(d, "conv: batch > train_samples", conv % ("images.h5", "resnet") + "  train_samples: 6\n",
                   "batch 8 is larger than the training split: 6 of the 40 samples in data file 'images.h5'",
                   "train_samples 6")
        # The good image file runs with both models (exit 0).
        code, _, err = run(d, conv % ("images.h5", "[convnet, resnet]") + "  width1: 2\n  width2: 2\n  resnet_width: 2\n")
        if code != 0:
            failures.append("images with convnet and resnet: exit %d: %s" % (code, err.strip()))
        else:
            print("ok   convnet and resnet on images")

        # loss_scale as a plain YAML number is the same as its quoted text.
        code, _, err = run(d, "experiment: train\ngrid:\n  samples: 100\n  epochs: 1\n  update: fp16-rn\n"
                              "  loss_scale: [128, \"256\", 1.0e3]\n")
        if code != 0:
            failures.append("loss_scale: 128 unquoted: exit %d: %s" % (code, err.strip()))
        else:
            with h5py.File(os.path.join(d, "out.h5"), "r") as f:
                stored = [v.decode() for v in f["points/loss_scale"][()]]
                scales = f["metrics/final_loss_scale"][:, 0].tolist()
            if stored != ["128", "256", "1.0e3"] or scales != [128.0, 256.0, 1000.0]:
                failures.append("loss_scale numbers: stored %s, final scales %s" % (stored, scales))
            else:
                print("ok   loss_scale numbers          stored %s, final_loss_scale %s" % (stored, scales))

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
