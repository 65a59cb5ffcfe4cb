#!/usr/bin/python3
"""scripts/roundoff_h5.py against a fresh swamping sweep: read() gives the stored arrays
(checked against h5py directly), table() one row per (point, replica), and the script
prints the table; counts_table() and traps_table() give the counted and trapped
floating-point exceptions as tidy tables (against numpy's float16 as the oracle). scripts/plot.py on sweeps whose results overflow (honest inf finals):
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


def run_sweep(folder, name, config, output):
    """Writes the config as folder/name, runs $SWEEP on it there, returns its output's path."""
    with open(os.path.join(folder, name), "w") as f:
        f.write(config)
    subprocess.run([os.environ["SWEEP"], name, "--quiet"], cwd=folder, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(folder, output)


def main():
    with tempfile.TemporaryDirectory() as folder:
        path = run_sweep(folder, "r.yaml", CONFIG, "out.h5")

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
    check_fp_exception_tables()
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
            path = run_sweep(folder, experiment + ".yaml", config, "sum.h5" if experiment == "summation" else "swamp.h5")
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


FP_CONFIG = """experiment: swamping
replicas: 2
output: fp.h5
grid:
  addend: [1.0e-4, 1000, 2000]
  steps: 100
  fp_exceptions: [count, trap]
"""


def first_fp16_overflow(addend, steps):
    """The first step at which x <- fp16(x + addend) from 0 overflows, and x before it
    (numpy's float16: the sum of two float16 values is exact in float32, then rounded once)."""
    x = np.float16(0)
    with np.errstate(over="ignore"):
        for k in range(1, steps + 1):
            nxt = np.float16(np.float32(x) + np.float32(np.float16(addend)))
            if np.isinf(nxt):
                return k, float(x)
            x = nxt
    return None


def columns_of(tidy):
    return {name: list(tidy[name]) for name in tidy} if not isinstance(tidy, dict) else \
        {name: list(values) for name, values in tidy.items()}


def check_fp_exception_tables():
    scripts = os.environ["ROUNDOFF_SCRIPTS"]
    with tempfile.TemporaryDirectory() as folder:
        path = run_sweep(folder, "fp.yaml", FP_CONFIG, "fp.h5")
        result = roundoff_h5.read(path)
        # Points: (1e-4, count), (1e-4, trap), (1000, count), (1000, trap), (2000, count), (2000, trap).
        assert result.fp_counts["count"].shape == (6, 2, 1), result.fp_counts["count"].shape
        assert result.fp_counts["first_operands"].shape == (6, 2, 1, 2)
        assert result.traps["trapped"].shape == (6, 2)
        with h5py.File(path, "r") as f:
            for group, columns in (("fp_counts", result.fp_counts), ("traps", result.traps)):
                assert set(columns) == set(f[group]), (group, set(columns))
                for name, values in columns.items():
                    stored = f[group][name]
                    if values.dtype == object:
                        assert list(values.reshape(-1)) == list(stored.asstr()[...].reshape(-1)), name
                    else:
                        assert np.array_equal(values, stored[...], equal_nan=True), name

        overflow = {addend: first_fp16_overflow(addend, 100) for addend in (1000, 2000)}
        assert all(overflow.values()), overflow
        counts = columns_of(roundoff_h5.counts_table(path))
        assert counts["point"] == [2, 2, 4, 4] and counts["replica"] == [0, 1, 0, 1], counts
        assert counts["addend"] == [1000, 1000, 2000, 2000] and counts["fp_exceptions"] == ["count"] * 4
        assert counts["scope"] == ["sum"] * 4 and counts["op"] == ["add"] * 4 and counts["flag"] == ["OFLO"] * 4
        assert counts["count"] == [1] * 4
        assert counts["first_element"] == [overflow[1000][0]] * 2 + [overflow[2000][0]] * 2, counts
        assert counts["first_index"] == [()] * 4
        assert counts["first_operands"] == [(overflow[1000][1], 1000.0)] * 2 + [(overflow[2000][1], 2000.0)] * 2
        assert all(np.isinf(counts["first_result"]))

        traps = columns_of(roundoff_h5.traps_table(path))
        assert traps["point"] == [3, 3, 5, 5] and traps["replica"] == [0, 1, 0, 1], traps
        assert traps["flag"] == ["OFLO"] * 4 and traps["fp_sts"] == [4] * 4
        assert traps["element"] == [overflow[1000][0]] * 2 + [overflow[2000][0]] * 2
        assert traps["operands"] == [(overflow[1000][1], 1000.0)] * 2 + [(overflow[2000][1], 2000.0)] * 2
        step, before = overflow[1000]
        assert traps["report"][0] == "floating-point trap: OFLO in sum: add(%d, 1000) at element #%d = inf" % (before, step)
        # The trapped runs' metrics are NaN in the run table.
        runs = columns_of(roundoff_h5.table(path))
        trapped_rows = [i for i in range(len(runs["point"])) if runs["point"][i] in (3, 5)]
        assert trapped_rows and all(np.isnan(runs["final"][i]) for i in trapped_rows)

        script = os.path.join(scripts, "roundoff_h5.py")
        printed = subprocess.run([sys.executable, script, path, "--traps"], check=True, capture_output=True, text=True).stdout
        assert len(printed.splitlines()) == 1 + 1 + 4 and "floating-point trap: OFLO in sum" in printed, printed
        printed = subprocess.run([sys.executable, script, "--counts", path], check=True, capture_output=True, text=True).stdout
        assert len(printed.splitlines()) == 1 + 1 + 4 and "first_operands" in printed, printed
        bad = subprocess.run([sys.executable, script, path, "--counts", "--traps"], capture_output=True, text=True)
        assert bad.returncode == 2 and "usage" in bad.stderr, bad
    # A sweep that counted nothing: empty tables with the documented columns.
    with tempfile.TemporaryDirectory() as folder:
        path = run_sweep(folder, "off.yaml", "experiment: swamping\noutput: off.h5\ngrid:\n  steps: 10\n", "off.h5")
        for function, first in ((roundoff_h5.counts_table, "scope"), (roundoff_h5.traps_table, "flag")):
            tidy = columns_of(function(path))
            assert len(tidy["point"]) == 0 and first in tidy, tidy


if __name__ == "__main__":
    main()
