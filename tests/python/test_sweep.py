"""roundoff.sweep: runs a config (a dict or a path) with build/sweep and returns the
results object; the file it writes is checked with h5py."""
import h5py
import numpy as np
import pytest

import roundoff

CONFIG = {"experiment": "swamping", "seed": 7, "replicas": 2,
          "grid": {"format": ["fp16"], "rounding": ["rne", "sr"], "addend": 1.0e-4, "steps": 3000,
                   "trace_every": 1000}}


def test_sweep_runs_a_dict_config(tmp_path):
    out = tmp_path / "swamping.h5"
    path = roundoff._run_sweep(CONFIG, jobs=1, output=out)
    assert path == str(out)
    with h5py.File(out) as f:
        assert f.attrs["experiment"] == "swamping"
        assert f["points/rounding"].asstr()[:].tolist() == ["rne", "sr"]
        final = f["metrics/final"][:]
        # rne stalls at 0.25 (0.0001 is below half an ulp from there); sr goes on.
        np.testing.assert_array_equal(final[0], [0.25, 0.25])
        assert (final[1] > 0.28).all()


def test_sweep_output_from_the_config_and_threads_do_not_matter(tmp_path):
    config = dict(CONFIG, output=str(tmp_path / "a.h5"))
    assert roundoff._run_sweep(config, jobs=2) == str(tmp_path / "a.h5")
    roundoff._run_sweep(CONFIG, jobs=1, output=tmp_path / "b.h5")
    with h5py.File(tmp_path / "a.h5") as a, h5py.File(tmp_path / "b.h5") as b:
        np.testing.assert_array_equal(a["metrics/final"][:], b["metrics/final"][:])


def test_sweep_errors_are_value_errors_with_sweeps_message(tmp_path):
    with pytest.raises(ValueError, match="experiment"):
        roundoff._run_sweep(dict(CONFIG, experiment="no_such_experiment"), output=tmp_path / "x.h5")
    with pytest.raises(ValueError, match="output"):
        roundoff._run_sweep(CONFIG)
    with pytest.raises(TypeError):
        roundoff.sweep(42)


def test_sweep_returns_the_results_object(tmp_path):
    results = roundoff.sweep(CONFIG, output=tmp_path / "r.h5")
    assert isinstance(results, roundoff.results.Results) and results.path == str(tmp_path / "r.h5")
    assert results.experiment == "swamping" and results.done.all()
    with h5py.File(tmp_path / "r.h5") as f:
        np.testing.assert_array_equal(results.metrics["final"], f["metrics/final"][:])


def test_python_m_roundoff_sweep_refuses_and_names_build_sweep():
    import importlib
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "roundoff.sweep", "configs/swamping.yaml"], capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "roundoff.sweep: sweeps run with build/sweep CONFIG.yaml [-j N] [--resume] [--shard K/N] "
        "(Python experiments too: experiment: python); from Python, roundoff.sweep(config) runs it"]
    with pytest.raises(ImportError, match="build/sweep"):
        importlib.import_module("roundoff.sweep")
    assert callable(roundoff.sweep)
