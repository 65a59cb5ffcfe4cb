"""Declaring a Python experiment that `build/sweep` runs (configs/README.md, "Python experiments").

A config names the callable (``experiment: python``, ``run: model.py:run``); the module
declares what the callable takes and returns, so that ``sweep --describe CONFIG``,
``--dry-run``, the grid's validation and the output file's self-description work as for
the built-in experiments::

    from roundoff.experiment import experiment, param, metric, trace, Result

    @experiment(
        description="a tiny model trained in float32",
        params=[param("lr", float, 0.1, "learning rate", min=0),
                param("steps", int, 20, "optimizer steps", min=1)],
        metrics=[metric("final_loss", "training loss after the last step")],
        traces=[trace("loss", "training loss", x_name="step")],
        headline="final_loss")
    def run(params, replica, seed):
        g = torch.Generator().manual_seed(seed)
        ...
        return Result(metrics={"final_loss": loss}, traces={"loss": (steps, losses)})

The callable gets ``params`` (a dict, every declared parameter typed as declared: int,
float, str, bool), ``replica`` (int) and ``seed``: a 64-bit integer drawn from the run's own
random stream (seed, point, replica, lane 0), the same for any -j, shard or rank, so that
``torch.Generator().manual_seed(seed)`` and roundoff's ``seed=`` give reproducible runs.
"""

import math as _math
import numbers as _numbers
import re as _re

_TYPES = {int: "int", float: "float", str: "str", bool: "bool"}
_NAME = _re.compile(r"[a-z][a-z0-9_]*\Z")


def _check_name(kind, name):
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{kind} name {name!r} must be lower_snake_case (a-z, 0-9, _; a letter first)")


class param:
    """A parameter: name, type (int, float, str or bool), default, meaning; for numbers
    optional inclusive bounds ``min``/``max``, for strings optional ``allowed`` spellings."""

    def __init__(self, name, type, default, meaning, *, min=None, max=None, allowed=None):
        _check_name("parameter", name)
        if type not in _TYPES:
            raise ValueError(f"parameter {name!r}: type must be int, float, str or bool, not {type!r}")
        if (min is not None or max is not None) and type not in (int, float):
            raise ValueError(f"parameter {name!r}: min and max are for int and float parameters")
        if allowed is not None and type is not str:
            raise ValueError(f"parameter {name!r}: allowed is for str parameters")
        self.name, self.type, self.meaning = name, type, str(meaning)
        self.min, self.max = min, max
        self.allowed = [str(a) for a in allowed] if allowed is not None else []
        self.default = self.convert(default, "default")

    def convert(self, value, what):
        """`value` as this parameter's type; ValueError where it is not one or out of bounds."""
        t = self.type
        ok = (isinstance(value, bool) if t is bool else
              isinstance(value, str) if t is str else
              isinstance(value, _numbers.Integral) and not isinstance(value, bool) if t is int else
              isinstance(value, _numbers.Real) and not isinstance(value, bool))
        if not ok:
            raise ValueError(f"parameter {self.name!r}: {what} {value!r} is not {_TYPES[t]}")
        value = t(value)
        if self.min is not None and not value >= self.min:
            raise ValueError(f"parameter {self.name!r}: {what} {value!r} is below min {self.min}")
        if self.max is not None and not value <= self.max:
            raise ValueError(f"parameter {self.name!r}: {what} {value!r} is above max {self.max}")
        if self.allowed and value not in self.allowed:
            raise ValueError(f"parameter {self.name!r}: {what} {value!r} is not one of {self.allowed}")
        return value


class metric:
    """A scalar metric the callable returns for every run (float; NaN is stored as NaN)."""

    def __init__(self, name, meaning):
        _check_name("metric", name)
        self.name, self.meaning = name, str(meaning)


class trace:
    """A 1-D trace the callable may return: y against x, whose axis is named ``x_name``."""

    def __init__(self, name, meaning, x_name="step"):
        _check_name("trace", name)
        self.name, self.meaning, self.x_name = name, str(meaning), str(x_name)


class Result:
    """What the callable returns.

    metrics: {name: float} for every declared metric; traces: {name: (x, y)} (1-D arrays
    of equal length) for any declared traces; fp_counts: roundoff.torch's exception table
    (a pandas DataFrame) or rows (dicts) with scope, op, flag, count and optionally element
    (flat index, -1 none) and operands (a list of floats): they go to /fp_counts.
    """

    def __init__(self, metrics, traces=None, fp_counts=None):
        self.metrics = dict(metrics)
        self.traces = dict(traces or {})
        self.fp_counts = fp_counts


class Declaration:
    """What @experiment attaches to the callable (as ``__roundoff_experiment__``)."""

    def __init__(self, description, params, metrics, traces, headline):
        self.description = str(description)
        self.params, self.metrics, self.traces = list(params), list(metrics), list(traces)
        for kind, cls, items in (("parameter", param, self.params), ("metric", metric, self.metrics),
                                 ("trace", trace, self.traces)):
            names = [item.name for item in items]
            for item in items:
                if not isinstance(item, cls):
                    raise TypeError(f"{kind}s are declared with roundoff.experiment.{cls.__name__}(), got {item!r}")
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"{kind} {duplicates[0]!r} is declared twice")
        if not self.metrics:
            raise ValueError("declare at least one metric")
        if headline not in [m.name for m in self.metrics]:
            raise ValueError(f"headline {headline!r} is not a declared metric")
        self.headline = headline


def experiment(*, description, params, metrics, headline, traces=()):
    """Declares the decorated function as a sweep experiment (see the module's help)."""

    def declare(function):
        function.__roundoff_experiment__ = Declaration(description, params, metrics, traces, headline)
        return function

    return declare


# The most trace samples one run records, all its traces together: the sweep's limit
# (experiments/sweep/config.hpp, kMaxTraceSamplesPerRun), which a built-in experiment
# declares before it runs and a Python experiment's result is checked against.
MAX_TRACE_SAMPLES_PER_RUN = 10_000_000


def check_result(declaration, result):
    """The result's metrics, traces and fp_counts rows checked against the declaration;
    ValueError naming what is wrong (that run fails with it)."""
    if not isinstance(result, Result):
        raise ValueError(f"the callable returned {type(result).__name__}, not roundoff.experiment.Result")
    declared = [m.name for m in declaration.metrics]
    for name in result.metrics:
        if name not in declared:
            raise ValueError(f"metric {name!r} is not declared (declared: {', '.join(declared)})")
    metrics = {}
    for name in declared:
        if name not in result.metrics:
            raise ValueError(f"metric {name!r} is declared but was not returned")
        value = result.metrics[name]
        if not isinstance(value, _numbers.Real) and not hasattr(value, "__float__"):
            raise ValueError(f"metric {name!r} is {type(value).__name__}, not a number")
        metrics[name] = float(value)
    declared_traces = [t.name for t in declaration.traces]
    traces = {}
    samples = 0
    for name, xy in result.traces.items():
        if name not in declared_traces:
            raise ValueError(f"trace {name!r} is not declared (declared: {', '.join(declared_traces) or 'none'})")
        x, y = ([float(v) for v in _flat(a)] for a in xy)
        if len(x) != len(y):
            raise ValueError(f"trace {name!r}: x has {len(x)} values and y {len(y)}")
        samples += len(y)
        if samples > MAX_TRACE_SAMPLES_PER_RUN:
            raise ValueError(f"the traces hold more than {MAX_TRACE_SAMPLES_PER_RUN} samples, the limit per run "
                             f"(configs/README.md); trace {name!r} has {len(y)}")
        traces[name] = (x, y)
    return metrics, traces, _count_rows(result.fp_counts)


def _flat(values):
    return values.reshape(-1).tolist() if hasattr(values, "reshape") else list(values)


def _count_rows(table):
    if table is None:
        return []
    rows = table.to_dict("records") if hasattr(table, "to_dict") else list(table)
    out = []
    for row in rows:
        element = row.get("element", -1)
        element = -1 if element is None or (isinstance(element, float) and _math.isnan(element)) else int(element)
        operands = row.get("operands")
        operands = [] if operands is None or isinstance(operands, float) else [float(v) for v in operands]
        out.append((str(row["scope"]), str(row["op"]), str(row["flag"]), int(row["count"]), element, operands))
    return out
