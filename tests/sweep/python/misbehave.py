"""Runs that fail in each documented way, for tests/sweep/test_python.py (no torch needed).

mode ok: value = the replica index; raise: replica 1 raises; nan: value NaN; undeclared:
returns a metric it does not declare; crash: replica 0's worker process exits; trap: replica
1 overflows an fp16 addition under an enabled OFLO trap (roundoff.FloatingPointTrap);
long_trace: replica 1 returns a trace one sample over the limit per run.
"""

import math
import os

import numpy as np

import roundoff
from roundoff.experiment import MAX_TRACE_SAMPLES_PER_RUN, Result, experiment, metric, param, trace


@experiment(
    description="runs that fail in each documented way (a test experiment)",
    params=[param("mode", str, "ok", "what the run does",
                  allowed=["ok", "raise", "nan", "undeclared", "crash", "trap", "long_trace"])],
    metrics=[metric("value", "the replica index, or NaN")],
    traces=[trace("curve", "a trace (long_trace only)", x_name="i")],
    headline="value")
def run(params, replica, seed):
    mode = params["mode"]
    if mode == "raise" and replica == 1:
        raise RuntimeError(f"replica {replica} fails on purpose")
    if mode == "nan":
        return Result(metrics={"value": math.nan})
    if mode == "undeclared":
        return Result(metrics={"value": 1.0, "surprise": 2.0})
    if mode == "crash" and replica == 0:
        os._exit(9)
    if mode == "trap" and replica == 1:
        roundoff.Context(traps="oflo").add("fp16", [1.0, 60000.0], [0.0, 60000.0])
    if mode == "long_trace" and replica == 1:
        n = MAX_TRACE_SAMPLES_PER_RUN + 1
        return Result(metrics={"value": 1.0}, traces={"curve": (np.arange(n), np.zeros(n))})
    return Result(metrics={"value": float(replica)})
