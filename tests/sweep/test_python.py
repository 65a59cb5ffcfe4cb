"""Python experiments (experiment: python) under the real build/sweep: the runner's guarantees
(-j, SIGINT and --resume, shards and merge, MPI) and each documented failure.

Run by meson with SWEEP (build/sweep), PYTHONPATH (build/python) and, in an MPI build,
MPIRUN. The torch cases use tests/sweep/python/tiny_torch.py and are skipped, saying so,
where torch is missing; the failure cases need no torch. About 30 s on 2 cores, most of it
importing torch in the workers.
"""

import importlib.util
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import h5py
import numpy as np

from roundoff import results

SWEEP = os.environ["SWEEP"]
HERE = os.path.dirname(os.path.abspath(__file__))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = unittest.skipUnless(HAVE_TORCH, "torch is not installed (python3-torch): the tiny torch model cannot run")

TINY = """experiment: python
run: tiny_torch.py:run
seed: 11
replicas: 2
output: {output}
grid:
  lr: [0.05, 0.1]
  optimizer: [sgd, momentum]
  count_exceptions: [false, true]
  pause: {pause}
"""


def datasets(path):
    """Every dataset of a file, by path: (dtype, shape, values as comparable bytes)."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                values = obj.asstr()[...] if h5py.check_string_dtype(obj.dtype) else obj[...]
                out[name] = (str(obj.dtype), obj.shape,
                             values.tobytes() if values.dtype != object else repr(values.tolist()))
        f.visititems(visit)
    return out


class Folder:
    """A temporary folder holding the test modules, so that configs name them relatively."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="sweep-python-")
        for name in ("tiny_torch.py", "misbehave.py"):
            shutil.copy(os.path.join(HERE, "python", name), self.path)

    def config(self, name, text):
        path = os.path.join(self.path, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def sweep(self, *args, cwd=None):
        return subprocess.run([SWEEP, *args], cwd=cwd or self.path, capture_output=True, text=True,
                              timeout=300)

    def remove(self):
        shutil.rmtree(self.path)


class PythonSweepTest(unittest.TestCase):
    def setUp(self):
        self.folder = Folder()
        self.addCleanup(self.folder.remove)

    def assert_ok(self, run):
        self.assertEqual(run.returncode, 0, run.stderr)

    def assert_same_datasets(self, a, b):
        da, db = datasets(a), datasets(b)
        self.assertEqual(sorted(da), sorted(db))
        for name in da:
            self.assertEqual(da[name], db[name], f"dataset {name} differs between {a} and {b}")

    @needs_torch
    def test_jobs_shards_and_mpi_give_identical_datasets(self):
        f = self.folder
        config = f.config("tiny.yaml", TINY.format(output="one.h5", pause=0))
        one, two = os.path.join(f.path, "one.h5"), os.path.join(f.path, "two.h5")
        # From another working directory: run: is relative to the config's folder (the
        # output, as always, to the working directory).
        self.assert_ok(f.sweep(config, "-j1", "-o", one, cwd="/"))
        self.assert_ok(f.sweep(config, "-j2", "-o", "two.h5"))
        self.assert_same_datasets(one, two)
        r = results.open(one)
        self.assertTrue(r.done_replicas.all())
        self.assertEqual(r.metrics["final_loss"].shape, (8, 2))
        self.assertTrue(np.isfinite(r.metrics["final_loss"]).all())
        self.assertEqual(results.counts_table(r)["count"].sum(), 4 * (20 + 21))
        self.assertTrue(r.flags["INEXACT"][1::2].all() and not r.flags["INEXACT"][0::2].any())
        self.assertEqual(len(results.failures_table(r)), 0)
        # Replicas differ (their own seeds); the same seed gives the same numbers.
        self.assertNotEqual(r.metrics["final_loss"][0, 0], r.metrics["final_loss"][0, 1])

        for k in (0, 1):
            self.assert_ok(f.sweep(config, "--shard", f"{k}/2", "-o", f"part{k}.h5"))
        self.assert_ok(f.sweep("merge", "merged.h5", "part0.h5", "part1.h5"))
        self.assert_same_datasets(one, os.path.join(f.path, "merged.h5"))

        mpirun = os.environ.get("MPIRUN")
        if mpirun:
            run = subprocess.run([mpirun, "-n", "2", "--oversubscribe", SWEEP, config, "-j1", "-o", "mpi.h5", "--quiet"],
                                 cwd=f.path, capture_output=True, text=True, timeout=300)
            self.assert_ok(run)
            self.assert_same_datasets(one, os.path.join(f.path, "mpi.h5"))

    @needs_torch
    def test_sigint_then_resume_equals_an_uninterrupted_run(self):
        f = self.folder
        config = f.config("slow.yaml", TINY.format(output="slow.h5", pause=0.4))
        # A terminal on stderr, so that sweep draws its progress: SIGINT once 2 points are in.
        master, slave = pty.openpty()
        child = subprocess.Popen([SWEEP, config, "-j1"], cwd=f.path, stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        screen, deadline = "", time.time() + 120
        while time.time() < deadline and not re.search(r"\s[2-7]/8 points", screen):
            if select.select([master], [], [], 0.2)[0]:
                try:
                    screen += os.read(master, 4096).decode(errors="replace")
                except OSError:
                    break
        child.send_signal(signal.SIGINT)
        while select.select([master], [], [], 1)[0]:
            try:
                if not os.read(master, 4096):
                    break
            except OSError:
                break
        self.assertEqual(child.wait(timeout=60), 130, screen)
        os.close(master)
        partial = results.open(os.path.join(f.path, "slow.h5"))
        self.assertEqual(partial.attrs["status"], "partial")
        self.assertTrue(0 < partial.done.sum() < 8, partial.done)
        self.assert_ok(f.sweep(config, "--resume", "-j2"))
        self.assert_ok(f.sweep(config, "-o", "whole.h5", "-j2"))
        self.assert_same_datasets(os.path.join(f.path, "slow.h5"), os.path.join(f.path, "whole.h5"))

    def misbehave(self, modes, replicas=2, name="bad.yaml"):
        config = self.folder.config(name, f"experiment: python\nrun: misbehave.py:run\nreplicas: {replicas}\n"
                                          f"output: {name[:-5]}.h5\ngrid:\n  mode: [{', '.join(modes)}]\n")
        return config, self.folder.sweep(config), os.path.join(self.folder.path, name[:-5] + ".h5")

    def test_a_run_that_raises_fails_alone_and_resume_reruns_it(self):
        config, run, out = self.misbehave(["ok", "raise"])
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn("sweep: 1 run raised; its traceback is in bad.h5 /failures", run.stderr)
        self.assertEqual(run.stderr.count("\n"), 1, run.stderr)
        r = results.open(out)
        self.assertEqual(r.attrs["status"], "partial")
        np.testing.assert_array_equal(r.done_replicas, [[True, True], [True, False]])
        np.testing.assert_array_equal(r.metrics["value"][:, 0], [0, 0])
        failures = results.failures_table(r)
        self.assertEqual(failures[["point", "replica", "mode"]].values.tolist(), [[1, 1, "raise"]])
        self.assertEqual(failures["message"][0], "RuntimeError: replica 1 fails on purpose")
        self.assertIn("Traceback (most recent call last)", failures["traceback"][0])
        self.assertIn("misbehave.py", failures["traceback"][0])
        # Fixed, --resume reruns that run only; /failures goes away.
        script = os.path.join(self.folder.path, "misbehave.py")
        with open(script) as f:
            text = f.read()
        with open(script, "w") as f:
            f.write(text.replace('mode == "raise" and replica == 1', 'mode == "raise" and replica == 99'))
        resumed = self.folder.sweep(config, "--resume")
        self.assert_ok(resumed)
        r = results.open(out)
        self.assertEqual(r.attrs["status"], "complete")
        np.testing.assert_array_equal(r.metrics["value"], [[0, 1], [0, 1]])
        with h5py.File(out, "r") as h5:
            self.assertNotIn("failures", h5)

    def test_a_floating_point_trap_is_the_runs_trap_outcome(self):
        _, run, out = self.misbehave(["ok", "trap"])
        self.assert_ok(run)
        r = results.open(out)
        self.assertEqual(r.attrs["status"], "complete")
        self.assertTrue(r.done_replicas.all())
        np.testing.assert_array_equal(r.metrics["value"], [[0, 1], [0, np.nan]])
        traps = results.traps_table(r)
        self.assertEqual(traps[["point", "replica", "flag", "scope", "op", "element", "index", "operands"]]
                         .values.tolist(), [[1, 1, "OFLO", "", "add", 1, (1,), (60000.0, 60000.0)]])
        self.assertEqual(traps["result"][0], np.inf)
        self.assertEqual(traps["fp_sts"][0], 4)  # $FP_STS bit 2: OFLO
        np.testing.assert_array_equal(r.flags["OFLO"], [[False, False], [False, True]])
        with h5py.File(out, "r") as h5:
            self.assertNotIn("failures", h5)

    def test_a_nan_metric_is_stored_as_nan(self):
        _, run, out = self.misbehave(["nan"])
        self.assert_ok(run)
        self.assertTrue(np.isnan(results.open(out).metrics["value"]).all())

    def test_an_undeclared_metric_fails_the_run_naming_it(self):
        _, run, out = self.misbehave(["ok", "undeclared"])
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn("sweep: 2 runs raised", run.stderr)
        failures = results.failures_table(out)
        self.assertEqual(failures["point"].tolist(), [1, 1])
        self.assertEqual(set(failures["message"]),
                         {"ValueError: metric 'surprise' is not declared (declared: value)"})

    def test_a_trace_over_the_limit_fails_the_run_naming_it(self):
        _, run, out = self.misbehave(["long_trace"])
        self.assertEqual(run.returncode, 2, run.stderr)
        r = results.open(out)
        np.testing.assert_array_equal(r.done_replicas, [[True, False]])
        self.assertEqual(results.failures_table(r)["message"].tolist(),
                         ["ValueError: the traces hold more than 10000000 samples, the limit per run "
                          "(configs/README.md); trace 'curve' has 10000001"])

    def test_a_worker_that_dies_fails_that_run_only(self):
        _, run, out = self.misbehave(["crash", "ok"], replicas=3)
        self.assertEqual(run.returncode, 2, run.stderr)
        r = results.open(out)
        np.testing.assert_array_equal(r.done_replicas, [[False, True, True], [True, True, True]])
        self.assertEqual(results.failures_table(r)["message"].tolist(),
                         ["the Python worker exited with status 9 during the run (a new one takes the next run)"])

    def test_a_callable_that_cannot_be_imported_exits_2_before_anything_runs(self):
        with open(os.path.join(self.folder.path, "broken.py"), "w") as f:
            f.write("import no_such_module_for_roundoff\n")
        config = self.folder.config("broken.yaml", "experiment: python\nrun: broken.py:run\noutput: broken.h5\n")
        run = self.folder.sweep(config)
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertEqual(run.stderr,
                         f"{config}:2:6: run: cannot load 'broken.py:run': ModuleNotFoundError: "
                         "No module named 'no_such_module_for_roundoff'\n")
        self.assertFalse(os.path.exists(os.path.join(self.folder.path, "broken.h5")))
        missing = self.folder.config("missing.yaml", "experiment: python\nrun: nowhere.py:run\n")
        run = self.folder.sweep(missing, "--dry-run")
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertRegex(run.stderr, r"missing.yaml:2:6: run: cannot load 'nowhere.py:run': FileNotFoundError: no file .*nowhere.py\n")

    def test_an_undeclared_grid_key_is_refused_at_its_place(self):
        config = self.folder.config("typo.yaml", "experiment: python\nrun: misbehave.py:run\noutput: typo.h5\n"
                                                 "grid:\n  mode: [ok]\n  modes: [ok]\n")
        run = self.folder.sweep(config)
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertEqual(run.stderr, f"{config}:6:3: grid.modes: unknown parameter 'modes' of experiment 'python' "
                                     "(did you mean 'mode'?); its parameters: mode\n")
        self.assertFalse(os.path.exists(os.path.join(self.folder.path, "typo.h5")))
        bad_value = self.folder.config("value.yaml", "experiment: python\nrun: misbehave.py:run\noutput: value.h5\n"
                                                    "grid:\n  mode: [oops]\n")
        run = self.folder.sweep(bad_value, "--dry-run")
        self.assertEqual(run.returncode, 2)
        self.assertIn("value.yaml:5:10: grid.mode[0]: unknown mode 'oops'", run.stderr)

    def test_describe_and_dry_run_read_the_declaration(self):
        config, _, _ = self.misbehave(["ok", "nan"], name="plan.yaml")
        described = self.folder.sweep("--describe", config)
        self.assert_ok(described)
        self.assertIn(f"python ({config}): runs that fail in each documented way", described.stdout)
        self.assertIn("mode           string ok         what the run does [one of: ok raise nan undeclared crash trap long_trace]",
                      described.stdout)
        self.assertIn("headline: value", described.stdout)
        planned = self.folder.sweep(config, "--dry-run")
        self.assert_ok(planned)
        self.assertEqual(planned.stdout, "python: 2 points x 2 replicas = 4 runs\noutput: plan.h5\n")
        run = self.folder.sweep(self.folder.config("norun.yaml", "experiment: python\n"), "--dry-run")
        self.assertEqual(run.returncode, 2)
        self.assertIn("norun.yaml:1:1: run: missing: experiment: python needs run:", run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
