#!/usr/bin/python3
"""The convolutional models through the real sweep binary, on small data written by the
data scripts into a scratch directory's results/:
  - the shipped configs fashion_mnist_mixed.yaml, resnet_sr.yaml, bn_fp16.yaml,
    esr_replicas.yaml and grad_accum.yaml are planned (--dry-run) against those files:
    their keys, values and data checks hold;
  - a small config over both models, several precision setups (stochastic rounding
    included), data-parallel replicas under the three esr modes, gradient accumulation
    in fp16 and fp32 buffers, and fp_exceptions: count gives bit-identical files with
    -j 1 and -j 2.
Skips (exit 77) when Debian's dataset-fashion-mnist or scikit-learn is not installed.

Usage: test_conv_sweep.py SWEEP SOURCE_ROOT
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

SWEEP = os.path.abspath(sys.argv[1])
ROOT = os.path.abspath(sys.argv[2])
SKIP = 77

SMALL = """experiment: train
seed: 5
replicas: 2
grid:
  data: results/fashion_mnist.h5
  train_samples: 48
  test_samples: 16
  width1: 2
  width2: 2
  resnet_width: 2
  batch: 16
  epochs: 1
  fp_exceptions: count
  hist_every: 2
zip:
  model: [convnet, convnet, resnet, resnet, convnet, convnet, resnet, convnet]
  update: [fp32, fp32-master, fp16-sr, fp16-rn, fp16-rn, fp16-rn, fp16-sr, fp32-master]
  unit: [fp32-seq, ipu-amp-half, ipu-amp, a100, ipu-amp, ipu-amp, ipu-amp-half, a100]
  esr: ["off", "off", "on", "off", "on", replica_identical_only, "off", "off"]
  dp_replicas: [1, 1, 1, 1, 2, 4, 2, 1]
  allreduce_order: [ring, ring, ring, ring, ring, tree, tree, ring]
  allreduce_format: [fp32, fp32, fp32, fp32, fp16, fp16, fp32, fp32]
  grad_accum: [1, 1, 1, 1, 2, 1, 2, 4]
  accum_format: [fp32, fp32, fp32, fp32, fp16, fp32, fp32, fp16]
  loss_scale: ["16777216", "16777216", "16777216", "16777216", "256", "256", "256", "16777216"]
"""


def run(args, cwd):
    return subprocess.run([SWEEP] + args, cwd=cwd, capture_output=True, text=True, timeout=600)


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f.visititems(visit)
    return out


def same(a, b):
    if a.dtype.kind == "f":
        return a.shape == b.shape and np.array_equal(a, b, equal_nan=True) and \
            np.array_equal(np.signbit(a), np.signbit(b))
    return a.shape == b.shape and np.array_equal(a, b)


def main():
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("skipped: Debian's dataset-fashion-mnist is not installed (scripts/setup installs it)")
        return SKIP
    failures = []
    with tempfile.TemporaryDirectory(prefix="roundoff-conv-sweep-") as d:
        os.mkdir(os.path.join(d, "results"))
        for script, args in (("make_fashion_mnist_h5.py", ["--train-samples", "256", "--test-samples", "64"]),
                             ("make_digits_h5.py", [])):
            p = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", script),
                                os.path.join("results", script[5:-6] + ".h5")] + args,
                               cwd=d, capture_output=True, text=True)
            if p.returncode != 0:
                if "sklearn" in p.stderr:
                    print("skipped: scikit-learn is not installed (Debian python3-sklearn)")
                    return SKIP
                failures.append("%s: exit %d: %s" % (script, p.returncode, p.stderr.strip()))
        for config in ("fashion_mnist_mixed.yaml", "resnet_sr.yaml", "bn_fp16.yaml", "esr_replicas.yaml",
                       "grad_accum.yaml"):
            p = run([os.path.join(ROOT, "configs", config), "--dry-run", "-o", "dry.h5"], d)
            if p.returncode != 0:
                failures.append("%s --dry-run: exit %d: %s" % (config, p.returncode, p.stderr.strip()))
            else:
                print("ok   %s plans: %s" % (config, p.stdout.strip().splitlines()[0]))

        with open(os.path.join(d, "small.yaml"), "w") as f:
            f.write(SMALL)
        files = {}
        for jobs in ("1", "2"):
            out = "j%s.h5" % jobs
            p = run(["small.yaml", "-o", out, "-j", jobs, "--quiet"], d)
            if p.returncode != 0:
                failures.append("-j %s: exit %d: %s" % (jobs, p.returncode, p.stderr.strip()))
                continue
            files[jobs] = datasets(os.path.join(d, out))
        if len(files) == 2:
            a, b = files["1"], files["2"]
            differ = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b or not same(a[k], b[k])]
            if differ:
                failures.append("-j 1 and -j 2 differ in %s" % ", ".join(differ))
            else:
                print("ok   -j 1 = -j 2 bit for bit over %d datasets" % len(a))
            acc = a["metrics/final_test_acc"]
            if not np.all(np.isfinite(acc)):
                failures.append("a run did not finish: final_test_acc %s" % acc.tolist())
            if a["fp_counts/count"].size == 0:
                failures.append("loss scale 2^24 in fp16 raised no counted flag: the counts were not exercised")
            # Replicas (rows 4-6 train with finite gradients, S = 256): drifted apart under
            # esr on (row 4), bit-identical under replica_identical_only (row 5) and off (row 6).
            differ = a["metrics/replica_frac_differ"]
            if not (differ[4] > 0).all() or (differ[5] != 0).any() or (differ[6] != 0).any():
                failures.append("replica_frac_differ: on %s, replica_identical_only %s, off %s"
                                % (differ[4].tolist(), differ[5].tolist(), differ[6].tolist()))
            if a["traces/bn_scale_std"].shape[2] != 7:
                failures.append("bn_scale_std holds %d layers, not 7 (ResNet-8)" % a["traces/bn_scale_std"].shape[2])
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
