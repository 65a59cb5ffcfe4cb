"""roundoff.results against sweeps run here: open() gives the stored arrays (checked against
h5py directly), table() one row per (point, replica), trace_table() a trace in long form,
dataset() the grid as xarray dimensions, counts_table() and traps_table() the counted and
trapped floating-point exceptions (against numpy's float16 as the oracle), a shard's file,
and `python3 -m roundoff.results` printing the tables."""
import ast
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import roundoff
from roundoff import results as rr

SWEEP = roundoff._core.sweep_path

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


def run_sweep(folder, name, config, output, *extra):
    """Writes the config as folder/name, runs the sweep program on it there, returns its output's path."""
    with open(os.path.join(folder, name), "w") as f:
        f.write(config)
    subprocess.run([SWEEP, name, "--quiet", *extra], cwd=folder, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(folder, output)


def module(*args):
    return subprocess.run([sys.executable, "-m", "roundoff.results", *args], capture_output=True, text=True)


def test_open_table_and_shard(tmp_path):
    folder = str(tmp_path)
    path = run_sweep(folder, "r.yaml", CONFIG, "out.h5")

    result = rr.open(path)
    assert rr.load(result) is result and rr.load(path).done_replicas.shape == (4, 3)
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
    assert set(result.flags) == set(rr.FLAGS)

    tidy = rr.table(path)
    columns = dict(tidy) if not isinstance(tidy, dict) else tidy
    assert len(columns["point"]) == 12
    assert list(columns["point"][:4]) == [0, 0, 0, 1] and list(columns["replica"][:4]) == [0, 1, 2, 0]
    assert list(columns["format"][::3]) == ["fp16", "fp16", "bf16", "bf16"]
    assert np.array_equal(np.asarray(columns["final"]), result.metrics["final"].reshape(-1))

    printed = module(path).stdout
    assert "stagnation_step" in printed and len(printed.splitlines()) == 1 + 1 + 12, printed

    # A shard's file: the table has a row for each run it holds, the same as the whole
    # sweep's rows for those runs (shard 1/3 of 12 runs: 4, splitting a point).
    run_sweep(folder, "r.yaml", CONFIG, "out.h5", "--shard", "1/3")
    shard = rr.open(os.path.join(folder, "out.shard-1-of-3.h5"))
    assert shard.done_replicas.sum() == 4 and shard.done.sum() < 2, shard.done_replicas
    part = rr.table(shard)
    part = dict(part) if not isinstance(part, dict) else part
    assert len(part["point"]) == 4
    for p, r, final in zip(part["point"], part["replica"], part["final"]):
        assert shard.done_replicas[p, r] and final == result.metrics["final"][p, r], (p, r)
    assert result.done_replicas.all()
    printed = module(os.path.join(folder, "out.shard-1-of-3.h5")).stdout
    assert printed.startswith("# swamping: 4 points x 3 replicas, shard 1/3, complete"), printed


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


def test_fp_exception_tables(tmp_path):
    folder = str(tmp_path)
    path = run_sweep(folder, "fp.yaml", FP_CONFIG, "fp.h5")
    result = rr.open(path)
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
    counts = columns_of(rr.counts_table(path))
    assert counts["point"] == [2, 2, 4, 4] and counts["replica"] == [0, 1, 0, 1], counts
    assert counts["addend"] == [1000, 1000, 2000, 2000] and counts["fp_exceptions"] == ["count"] * 4
    assert counts["scope"] == ["sum"] * 4 and counts["op"] == ["add"] * 4 and counts["flag"] == ["OFLO"] * 4
    assert counts["count"] == [1] * 4
    assert counts["first_element"] == [overflow[1000][0]] * 2 + [overflow[2000][0]] * 2, counts
    assert counts["first_index"] == [()] * 4
    assert counts["first_operands"] == [(overflow[1000][1], 1000.0)] * 2 + [(overflow[2000][1], 2000.0)] * 2
    assert all(np.isinf(counts["first_result"]))

    traps = columns_of(rr.traps_table(path))
    assert traps["point"] == [3, 3, 5, 5] and traps["replica"] == [0, 1, 0, 1], traps
    assert traps["flag"] == ["OFLO"] * 4 and traps["fp_sts"] == [4] * 4
    assert traps["element"] == [overflow[1000][0]] * 2 + [overflow[2000][0]] * 2
    assert traps["operands"] == [(overflow[1000][1], 1000.0)] * 2 + [(overflow[2000][1], 2000.0)] * 2
    step, before = overflow[1000]
    assert traps["report"][0] == "floating-point trap: OFLO in sum: add(%d, 1000) at element #%d = inf" % (before, step)
    # The trapped runs' metrics are NaN in the run table.
    runs = columns_of(rr.table(path))
    trapped_rows = [i for i in range(len(runs["point"])) if runs["point"][i] in (3, 5)]
    assert trapped_rows and all(np.isnan(runs["final"][i]) for i in trapped_rows)

    printed = module(path, "--traps").stdout
    assert len(printed.splitlines()) == 1 + 1 + 4 and "floating-point trap: OFLO in sum" in printed, printed
    printed = module("--counts", path).stdout
    assert len(printed.splitlines()) == 1 + 1 + 4 and "first_operands" in printed, printed
    bad = module(path, "--counts", "--traps")
    assert bad.returncode == 2 and "usage" in bad.stderr, bad
    # A sweep that counted nothing: empty tables with the documented columns.
    path = run_sweep(folder, "off.yaml", "experiment: swamping\noutput: off.h5\ngrid:\n  steps: 10\n", "off.h5")
    for function, first in ((rr.counts_table, "scope"), (rr.traps_table, "flag")):
        tidy = columns_of(function(path))
        assert len(tidy["point"]) == 0 and first in tidy, tidy


def test_trace_table_and_dataset(tmp_path):
    path = run_sweep(str(tmp_path), "r.yaml", CONFIG, "out.h5")
    result = rr.open(path)
    x, y = result.traces["x"]
    x_name = result.trace_x["x"]
    long = rr.trace_table(result, "x")
    assert len(long) == 4 * 3 * 11 and list(long.columns[:4]) == ["point", "replica", "format", "rounding"]
    assert list(long[x_name][:11]) == list(range(0, 501, 50))
    row = long.iloc[3 * 11 + 5]  # point 1, replica 0, sample 5
    assert (row["point"], row["replica"], row["rounding"]) == (1, 0, "sr") and row["x"] == y[1, 0, 5]
    with pytest.raises(KeyError, match="no trace 'nope'"):
        rr.trace_table(result, "nope")

    ds = rr.dataset(path)
    assert ds["final"].dims == ("format", "rounding", "replica")
    assert list(ds["format"].values) == ["fp16", "bf16"] and list(ds["rounding"].values) == ["rne", "sr"]
    assert int(ds["steps"]) == 500 and bool(ds["subnormals"]) is False  # constants: scalar coordinates
    for p in range(4):
        cell = ds["final"].sel(format=result.points["format"][p], rounding=result.points["rounding"][p])
        np.testing.assert_array_equal(cell.values, result.metrics["final"][p])
        np.testing.assert_array_equal(ds["x"].sel(format=result.points["format"][p],
                                                  rounding=result.points["rounding"][p]).values, y[p])
    assert ds["x"].dims == ("format", "rounding", "replica", x_name)
    np.testing.assert_array_equal(ds[x_name].values, x[0])
    assert ds.attrs["experiment"] == "swamping" and ds["written"].all()
    assert ds["final"].attrs["meaning"] == result.meanings["final"] != ""


ZIPPED = """experiment: swamping
replicas: 2
output: zip.h5
grid:
  format: fp16
  trace_every: 50
zip:
  addend: [1.0e-4, 1.0e-3, 1.0e-2]
  steps: [100, 200, 300]
"""


def test_dataset_of_a_zip_and_traces_of_unequal_length(tmp_path):
    path = run_sweep(str(tmp_path), "z.yaml", ZIPPED, "zip.h5")
    result = rr.open(path)
    ds = rr.dataset(result)
    assert ds["final"].dims == ("addend", "steps", "replica")
    # Three points on a 3 x 3 product: the diagonal is filled, the rest is NaN and not written.
    assert int(ds["written"].sum()) == 3 * 2 and int(np.isfinite(ds["final"]).sum()) == 3 * 2
    for p in range(3):
        cell = ds["final"].sel(addend=result.points["addend"][p], steps=result.points["steps"][p])
        np.testing.assert_array_equal(cell.values, result.metrics["final"][p])
    # Step 0, every 50th and the last: each point's x is a prefix of the longest.
    x_name = result.trace_x["x"]
    np.testing.assert_array_equal(ds[x_name].values, np.arange(0, 301, 50))
    assert len(rr.trace_table(result, "x")) == (3 + 5 + 7) * 2


def test_bad_files_are_value_errors_and_exit_2(tmp_path):
    bad = tmp_path / "not.h5"
    bad.write_text("not hdf5")
    with pytest.raises(ValueError, match="not.h5: not a readable sweep output"):
        rr.open(bad)
    run = module(str(bad))
    assert run.returncode == 2 and "not a readable sweep output" in run.stderr and run.stderr.count("\n") == 1, run
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = 1
    with pytest.raises(ValueError, match="other.h5"):
        rr.open(tmp_path / "other.h5")
    assert module("--help").returncode == 2


def test_imports_run_report_plot_results():
    # No import circle, not even a deferred one inside a function: results imports
    # neither plot nor report, plot imports results but not report.
    def package_imports(module):
        with open(module.__file__, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import x, from .x import y
                found |= {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
        return found
    from roundoff import plot, report
    assert not package_imports(rr) & {"plot", "report"}
    assert "results" in package_imports(plot) and "report" not in package_imports(plot)
    assert {"plot", "results"} <= package_imports(report)
