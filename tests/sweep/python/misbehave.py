"""Runs that fail in each documented way, for tests/sweep/test_python.py (no torch needed).

mode ok: value = the replica index; raise: replica 1 raises; nan: value NaN; undeclared:
returns a metric it does not declare; crash: replica 0's worker process exits; trap: replica
1 overflows an fp16 addition under an enabled OFLO trap (roundoff.FloatingPointTrap).
"""

import math
import os

import roundoff
from roundoff.experiment import Result, experiment, metric, param


@experiment(
    description="runs that fail in each documented way (a test experiment)",
    params=[param("mode", str, "ok", "what the run does", allowed=["ok", "raise", "nan", "undeclared", "crash", "trap"])],
    metrics=[metric("value", "the replica index, or NaN")],
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
    return Result(metrics={"value": float(replica)})
