"""`python3 -m roundoff.sweep` refuses, by design: sweeps have one runner, build/sweep.

The C++ runner owns the plan, the threads (-j), --resume, --shard, `sweep merge`, MPI and
the HDF5 file, Python experiments (experiment: python) included, so every guarantee holds
in one place; a second runner in Python would have to repeat all of it. From Python,
roundoff.sweep(config) (the package's function) runs build/sweep. This module exists only
to say so: run as a program it exits 2 with that message, and importing it is refused
(an imported roundoff.sweep module would hide that function).
"""
import sys

MESSAGE = ("roundoff.sweep: sweeps run with build/sweep CONFIG.yaml [-j N] [--resume] [--shard K/N] "
           "(Python experiments too: experiment: python); from Python, roundoff.sweep(config) runs it")

if __name__ == "__main__":
    print(MESSAGE, file=sys.stderr)
    sys.exit(2)
raise ImportError(MESSAGE)
