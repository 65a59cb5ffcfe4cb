"""The shipped Python examples (experiments/python, configs/ipu_mixed_precision.yaml,
resnet_fp16_updates.yaml, resnet_bn_fp16.yaml) under the real build/sweep: every shipped
config plans (--dry-run reads each example's declaration), and resnet_bn_fp16.py runs on a
tiny grid (ResNet-8, two steps), whose figures roundoff.plot draws and whose HTML report
roundoff.report writes, both checked against what the runs computed.

Run by meson with SWEEP (build/sweep) and PYTHONPATH (build/python); skipped, saying why,
without torch or Debian's dataset-fashion-mnist. Under a minute on 2 cores (61 s measured with
other jobs loading them), most of it importing torch in the workers.
"""

import importlib.util
import os
import subprocess
import tempfile
import unittest

import numpy as np

import roundoff.report
from roundoff import plot as rp
from roundoff import results as rr

SWEEP = os.environ["SWEEP"]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
EXAMPLES = {"ipu_mixed_precision": 3 * 2, "resnet_fp16_updates": 4, "resnet_bn_fp16": 5}  # config: runs
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_DATA = os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")

TINY = """experiment: python
run: {example}:run
seed: 5
output: tiny.h5
grid:
  blocks: 1
  train_samples: 64
  test_samples: 50
  epochs: 1
  smooth: 1
zip:
  update: [fp16-rn, fp16-rn, fp32-master]
  bn_fp32: [false, true, false]
"""
# ResNet-8's batch norms: the stem's, bn1 and bn2 of its three blocks, and the shortcuts of
# the second and third (which halve the resolution).
BN_LAYERS = 1 + 3 * 2 + 2


def trace(res, name, point):
    """A trace of the point's replica 0, NaN padding left out: (x, y)."""
    x, y = res.traces[name]
    kept = ~np.isnan(x[point])
    return x[point][kept], y[point, 0][kept]


@unittest.skipUnless(HAVE_TORCH, "torch is not installed (python3-torch): the examples cannot run")
class PythonExamplesTest(unittest.TestCase):
    def sweep(self, *args, cwd):
        return subprocess.run([SWEEP, *args], cwd=cwd, capture_output=True, text=True, timeout=300)

    def test_every_shipped_example_config_plans(self):
        with tempfile.TemporaryDirectory() as folder:
            for name, runs in EXAMPLES.items():
                config = os.path.join(ROOT, "configs", name + ".yaml")
                run = self.sweep(config, "--dry-run", "-o", "dry.h5", cwd=folder)
                self.assertEqual(run.returncode, 0, run.stderr)
                self.assertTrue(run.stdout.startswith("python: ") and f"= {runs} runs\n" in run.stdout, run.stdout)

    @unittest.skipUnless(HAVE_DATA, "Debian's dataset-fashion-mnist is not installed (scripts/setup installs it)")
    def test_resnet_bn_example_runs_and_is_drawn_and_reported(self):
        example = os.path.join(ROOT, "experiments", "python", "resnet_bn_fp16.py")
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "tiny.yaml"), "w") as f:
                f.write(TINY.format(example=example))
            run = self.sweep("tiny.yaml", "-j", "2", "--quiet", cwd=folder)
            self.assertEqual(run.returncode, 0, run.stderr)
            res = rr.open(os.path.join(folder, "tiny.h5"))
            self.assertTrue(res.done_replicas.all())
            self.assertEqual(res.attrs["experiment"], "python")

            # Two steps of 32 images: the per-layer traces and their pooled metrics agree.
            loss_steps, _ = trace(res, "loss", 0)
            self.assertEqual(list(loss_steps), [0, 1])
            for p in range(3):
                layers, std = trace(res, "bn_scale_std", p)
                _, unchanged = trace(res, "bn_scale_unchanged", p)
                self.assertEqual(list(layers), list(range(1, BN_LAYERS + 1)))
                self.assertTrue(np.all((0 <= unchanged) & (unchanged <= 1)) and np.all(std >= 0))
                self.assertEqual(res.metrics["bn_scale_std_min"][p, 0], std.min())
                self.assertEqual(res.metrics["bn_layers_unchanged"][p, 0], np.sum(unchanged == 1))
            # Batch norm kept in fp32 moves every scale off 1.0; nothing is swamped in fp32.
            self.assertEqual(res.metrics["bn_scale_unchanged"][1, 0], 0)
            self.assertTrue(np.all(np.isfinite(res.metrics["final_test_acc"])))

            figures = dict(rp.figures(res))
            self.assertLessEqual({"loss", "bn_scale_std", "bn_scale_unchanged", "final_test_acc"}, set(figures))
            ax, = [a for a in figures["bn_scale_std"].axes if a.axison]
            self.assertEqual(ax.get_xlabel(), "batch-norm layer")
            lines = {line.get_label(): line for line in ax.get_lines()}
            self.assertEqual(set(lines), {"fp16-rn bn_fp32=false", "fp16-rn bn_fp32=true",
                                          "fp32-master bn_fp32=false"})
            drawn = lines["fp16-rn bn_fp32=true"]
            self.assertEqual(list(drawn.get_xdata()), list(range(1, BN_LAYERS + 1)))
            np.testing.assert_array_equal(drawn.get_ydata(), trace(res, "bn_scale_std", 1)[1])

            page_path = roundoff.report.write(res, os.path.join(folder, "report.html"))
            page = open(page_path, encoding="utf-8").read()
            n = len(rp.figures(res))
            self.assertEqual((page.count("<img "), page.count("data:image/png;base64,")), (n, n))
            self.assertIn("run: " + example + ":run", page)
            self.assertIn("bn_scale_unchanged", page)


if __name__ == "__main__":
    unittest.main()
