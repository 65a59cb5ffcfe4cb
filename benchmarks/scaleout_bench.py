#!/usr/bin/python3
"""Scale-out: a 64-point training sweep (points of 2 to 16 epochs, 8x apart in cost) on 1
and 2 oneTBB threads and on 1 and 2 MPI ranks of 1 thread each, as wall times and speed-up
ratios measured in the same run (best of two), with the CPU time they took (on a machine
shared with other work, CPU / wall below the threads asked for means the cores were
busy elsewhere and the wall-time ratios say little); then the runner's ceiling (a sweep of 4,000
training points of one step each: points per second through scheduling, MPI messages and
the single writer) and `sweep merge` (8 shards of that sweep): the numbers behind the
README's paragraph on large sweeps. Never fails on speed.

Needs $SWEEP (build/sweep); $MPIRUN (mpirun) when sweep was built with -Dmpi=enabled,
otherwise the MPI rows say so."""
import os
import resource
import subprocess
import sys
import tempfile
import time

SWEEP = os.environ["SWEEP"]
MPIRUN = os.environ.get("MPIRUN")

TRAINING = """experiment: train
seed: 1
replicas: 1
output: train.h5
grid:
  update: [fp32, fp16-rn, fp16-sr, fp32-master]
  loss_scale: [none, 128, 1024, dynamic]
  epochs: [2, 4, 8, 16]
  samples: 800
  features: 16
  width1: 16
  batch: 32
"""

# 4,000 points of one optimiser step each: what a point costs beyond its arithmetic.
TINY = """experiment: train
seed: 1
replicas: 1
output: tiny.h5
grid:
  lr: [%s]
  samples: 40
  features: 4
  width1: 4
  classes: 2
  epochs: 1
  batch: 32
""" % ", ".join(str(0.001 * (k + 1)) for k in range(4000))


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # mpirun's ranks included
    return usage.ru_utime + usage.ru_stime


def wall(command, folder, repeats=2):
    """Best wall time of `repeats` runs and the CPU time of that run."""
    best = None
    for _ in range(repeats):
        cpu = cpu_seconds()
        start = time.perf_counter()
        subprocess.run(command, cwd=folder, check=True, stdout=subprocess.DEVNULL)
        elapsed = time.perf_counter() - start
        if best is None or elapsed < best[0]:
            best = (elapsed, cpu_seconds() - cpu)
    return best


def row(label, measured):
    elapsed, cpu = measured
    print("  %-24s %7.2f s wall %7.2f s CPU (%.2f cores)" % (label, elapsed, cpu, cpu / elapsed))
    return elapsed


def mpi(ranks, args):
    return [MPIRUN, "-n", str(ranks), "--oversubscribe", SWEEP] + args


def main():
    with tempfile.TemporaryDirectory() as folder:
        for name, text in (("train.yaml", TRAINING), ("tiny.yaml", TINY)):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        run = ["train.yaml", "--force", "--quiet"]
        print("64-point training sweep (sweep train.yaml; wall time, best of 2; load average %.1f on %d cores)"
              % (os.getloadavg()[0], os.cpu_count()))
        tbb1 = row("oneTBB 1 thread", wall([SWEEP] + run + ["-j", "1"], folder))
        tbb2 = row("oneTBB 2 threads", wall([SWEEP] + run + ["-j", "2"], folder))
        print("    speed-up of 2 threads over 1: %.2f (%.0f ms wall per point on 1 thread)" % (tbb1 / tbb2, 1000 * tbb1 / 64))
        if MPIRUN:
            mpi1 = row("MPI 1 rank x 1 thread", wall(mpi(1, run + ["-j", "1"]), folder))
            mpi2 = row("MPI 2 ranks x 1 thread", wall(mpi(2, run + ["-j", "1"]), folder))
            print("    speed-up of 2 ranks over 1: %.2f; 1 rank against 1 thread: %.2f; 2 ranks against 2 threads: %.2f"
                  % (mpi1 / mpi2, tbb1 / mpi1, tbb2 / mpi2))
        else:
            print("  MPI: not built (meson setup -Dmpi=enabled, or scripts/setup --mpi)")

        tiny = ["tiny.yaml", "--force", "--quiet"]
        print("runner ceiling: 4,000 training points of one step each")
        tiny1 = row("oneTBB 1 thread", wall([SWEEP] + tiny + ["-j", "1"], folder))
        size = os.path.getsize(os.path.join(folder, "tiny.h5"))
        print("    %.0f points/s; output %.1f KiB per point" % (4000 / tiny1, size / 4000 / 1024))
        if MPIRUN:
            tiny_mpi = row("MPI 2 ranks x 1 thread", wall(mpi(2, tiny + ["-j", "1"]), folder))
            print("    %.0f points/s" % (4000 / tiny_mpi))
        for k in range(8):
            subprocess.run([SWEEP, "tiny.yaml", "--shard", "%d/8" % k, "--quiet", "-j", "2"], cwd=folder, check=True,
                           stdout=subprocess.DEVNULL)
        shards = ["tiny.shard-%d-of-8.h5" % k for k in range(8)]
        merge = row("sweep merge, 8 shards", wall([SWEEP, "merge", "merged.h5", "--force", "--quiet"] + shards, folder))
        print("    %.0f points/s" % (4000 / merge))
    return 0


if __name__ == "__main__":
    sys.exit(main())
