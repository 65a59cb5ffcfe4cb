#!/usr/bin/python3
"""scripts/roundoff_h5.py against a fresh swamping sweep: read() gives the stored arrays
(checked against h5py directly), table() one row per (point, replica), and the script
prints the table. Needs $SWEEP (the sweep program) and $ROUNDOFF_SCRIPTS."""
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
    print("ok")


if __name__ == "__main__":
    main()
