#!/usr/bin/python3
"""scripts/roundoff_h5.py against a fresh swamping sweep: read() gives the stored arrays
(checked against h5py directly), table() one row per (point, replica), and the script
prints the table. scripts/plot.py on sweeps whose results overflow (honest inf finals):
it marks and reports them instead of dropping them. Needs $SWEEP (the sweep program) and
$ROUNDOFF_SCRIPTS."""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.environ["ROUNDOFF_SCRIPTS"])
import roundoff_h5  # noqa: E402

CONFIG = """experiment: swamping
seed: 1
replicas: 3
output: out.h5
grid:
  format: [fp16, "bf16"]
  rounding: [rne, sr]
  steps: 500
  trace_every: 50
  subnormals: false
"""


def main():
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "r.yaml"), "w") as f:
            f.write(CONFIG)
        subprocess.run([os.environ["SWEEP"], "r.yaml", "--quiet"], cwd=folder, check=True, stdout=subprocess.DEVNULL)
        path = os.path.join(folder, "out.h5")

        result = roundoff_h5.read(path)
        assert result.attrs["status"] == "complete", result.attrs
        assert result.attrs["experiment"] == "swamping"
        assert result.attrs["config"] == CONFIG
        assert list(result.points["format"]) == ["fp16", "fp16", "bf16", "bf16"]
        assert list(result.points["rounding"]) == ["rne", "sr", "rne", "sr"]
        assert result.points["subnormals"].dtype == bool and not result.points["subnormals"].any()
        assert result.points["steps"].dtype == np.int64
        assert result.done.all() and result.done.shape == (4,)
        with h5py.File(path, "r") as f:
            for name, values in result.metrics.items():
                assert values.shape == (4, 3)
                assert np.array_equal(values, f["metrics"][name][...], equal_nan=True), name
            x, y = result.traces["x"]
            assert x.shape == (4, 11) and y.shape == (4, 3, 11)
            assert np.array_equal(x[0], np.arange(0, 501, 50))
            assert f["traces/x"].attrs["x"] == "x_x"
        assert set(result.flags) == set(roundoff_h5.FLAGS)

        tidy = roundoff_h5.table(path)
        columns = dict(tidy) if not isinstance(tidy, dict) else tidy
        assert len(columns["point"]) == 12
        assert list(columns["point"][:4]) == [0, 0, 0, 1] and list(columns["replica"][:4]) == [0, 1, 2, 0]
        assert list(columns["format"][::3]) == ["fp16", "fp16", "bf16", "bf16"]
        assert np.array_equal(np.asarray(columns["final"]), result.metrics["final"].reshape(-1))

        printed = subprocess.run([sys.executable, os.path.join(os.environ["ROUNDOFF_SCRIPTS"], "roundoff_h5.py"), path],
                                 check=True, capture_output=True, text=True).stdout
        assert "stagnation_step" in printed and len(printed.splitlines()) == 1 + 1 + 12, printed

        # A shard's file: the table has a row for each run it holds, the same as the whole
        # sweep's rows for those runs (shard 1/3 of 12 runs: 4, splitting a point).
        subprocess.run([os.environ["SWEEP"], "r.yaml", "--quiet", "--shard", "1/3"], cwd=folder, check=True,
                       stdout=subprocess.DEVNULL)
        shard = roundoff_h5.read(os.path.join(folder, "out.shard-1-of-3.h5"))
        assert shard.done_replicas.sum() == 4 and shard.done.sum() < 2, shard.done_replicas
        part = roundoff_h5.table(shard)
        part = dict(part) if not isinstance(part, dict) else part
        assert len(part["point"]) == 4
        for p, r, final in zip(part["point"], part["replica"], part["final"]):
            assert shard.done_replicas[p, r] and final == result.metrics["final"][p, r], (p, r)
        assert result.done_replicas.all()
        printed = subprocess.run([sys.executable, os.path.join(os.environ["ROUNDOFF_SCRIPTS"], "roundoff_h5.py"),
                                  os.path.join(folder, "out.shard-1-of-3.h5")], check=True, capture_output=True,
                                 text=True).stdout
        assert printed.startswith("# swamping: 4 points x 3 replicas, shard 1/3, complete"), printed
    check_plot_reports_nonfinite()
    print("ok")


# fp16 overflows past 65504: 200,000 uniform [0,1) terms sum to about 10^5, 1,000 do not;
# 100 steps of 1000 reach 10^5 too.
OVERFLOWING = {
    "summation": """experiment: summation
seed: 4
replicas: 2
output: sum.h5
grid:
  series: uniform01
  format: fp16
  rounding: [rne, sr]
  n: [1000, 200000]
""",
    "swamping": """experiment: swamping
replicas: 3
output: swamp.h5
grid:
  format: fp16
  addend: [1.0e-4, 1000]
  steps: 100
  trace_every: 10
""",
}


def check_plot_reports_nonfinite():
    scripts = os.environ["ROUNDOFF_SCRIPTS"]
    with tempfile.TemporaryDirectory() as folder:
        for experiment, config in OVERFLOWING.items():
            with open(os.path.join(folder, experiment + ".yaml"), "w") as f:
                f.write(config)
            subprocess.run([os.environ["SWEEP"], experiment + ".yaml", "--quiet"], cwd=folder, check=True,
                           stdout=subprocess.DEVNULL)
            path = os.path.join(folder, "sum.h5" if experiment == "summation" else "swamp.h5")
            result = roundoff_h5.read(path)
            metric = "rel_error" if experiment == "summation" else "final"
            overflowed = [p for p in range(len(result.done)) if not np.isfinite(result.metrics[metric][p]).all()]
            # Some did overflow (sr; rne stagnates at 2048 in the summation), and only where the
            # exact sum is past fp16's largest value 65504.
            big = result.metrics["exact"].max(axis=1) > 65504
            assert overflowed and all(big[p] for p in overflowed), (experiment, overflowed, big)

            run = subprocess.run([sys.executable, os.path.join(scripts, "plot.py"), path, "--out", folder],
                                 capture_output=True, text=True)
            assert run.returncode == 0, run.stderr
            for png in run.stdout.split():
                assert os.path.getsize(png) > 0, png
            report = run.stderr
            assert "%d of %d points have non-finite %s" % (len(overflowed), len(result.done), metric) in report, report
            listed = [int(line.split()[1]) for line in report.splitlines() if line.startswith("  point ")]
            assert listed == overflowed, (listed, overflowed, report)
            if experiment == "summation":
                assert "n=200000" in report and "n=1000 " not in report and "n=1000)" not in report, report
            else:
                assert "addend=1000" in report and "3 inf, 0 NaN of 3 replicas" in report, report


if __name__ == "__main__":
    main()
