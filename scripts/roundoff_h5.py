#!/usr/bin/python3
"""Read a roundoff sweep output (HDF5; layout in results/README.md).

In a notebook, three lines give a tidy table (one row per point and replica):

    import sys; sys.path.insert(0, "scripts")
    import roundoff_h5
    df = roundoff_h5.table("results/swamping.h5")

`table` returns a pandas DataFrame when pandas imports, else a dict of 1-D numpy arrays
(column name -> values). `counts_table` and `traps_table` do the same for the
floating-point exceptions a sweep with `fp_exceptions: count` or `trap` recorded (one row
per counted (scope, op, flag) of a run; one row per trapped run). `read` gives the arrays
as stored. From a shell:

    scripts/roundoff_h5.py results/swamping.h5 [--counts | --traps]
"""
import sys

import h5py
import numpy as np

FLAGS = ("OFLO", "DIV0", "INV", "UFLO", "INEXACT")


class SweepResult:
    """One sweep output in memory.

    attrs:   dict of the root attributes (strings as str, numbers as Python ints)
    points:  dict param -> [P] array (int64, float64, bool, or str objects)
    metrics: dict metric -> [P, R] float64 (NaN where not computed)
    traces:  dict trace -> (x [P, T], y [P, R, T]) float64, NaN-padded
    flags:   dict FLAG -> [P, R] bool (sticky FP status at the end of each run)
    done:    [P] bool: points whose replicas are all written
    done_replicas: [P, R] bool: runs written (a shard's file holds some runs of a point)
    fp_counts: dict column -> [P, R, K] (first_index [P, R, K, 4], first_operands
             [P, R, K, M]); text columns as str objects; rows with count 0 are unused
    traps:   dict column -> [P, R] (index [P, R, 4], operands [P, R, M]); trapped says
             which runs ended in a trap
    (fp_counts and traps are empty dicts for files written before they existed)
    """

    def __init__(self, attrs, points, metrics, traces, flags, done, done_replicas, fp_counts=None, traps=None):
        self.attrs, self.points, self.metrics = attrs, points, metrics
        self.traces, self.flags, self.done = traces, flags, done
        self.done_replicas = done_replicas
        self.fp_counts, self.traps = fp_counts or {}, traps or {}

    def __repr__(self):
        return "SweepResult(experiment=%r, points=%d, replicas=%d, status=%r)" % (
            self.attrs.get("experiment"), len(self.done), self.attrs.get("replicas", 0), self.attrs.get("status"))


def _plain(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def read(path):
    """Reads every dataset of a sweep output into a SweepResult."""
    with h5py.File(path, "r") as f:
        attrs = {name: _plain(value) for name, value in f.attrs.items()}
        points = {}
        for name, dataset in f["points"].items():
            kind = _plain(dataset.attrs.get("type", ""))
            if kind == "string":
                points[name] = np.array(dataset.asstr()[...], dtype=object)
            elif kind == "bool":
                points[name] = dataset[...].astype(bool)
            else:
                points[name] = dataset[...]
        metrics = {name: dataset[...] for name, dataset in f["metrics"].items()}
        traces = {}
        for name, dataset in f["traces"].items():
            if "x" in dataset.attrs:  # a trace; its x axis is the sibling dataset it names
                traces[name] = (f["traces"][_plain(dataset.attrs["x"])][...], dataset[...])
        flags = {name: f["flags"][name][...].astype(bool) for name in FLAGS if name in f["flags"]}
        done = f["done"][...].astype(bool)
        # Files written before /done_replicas existed mark whole points only.
        replicas = int(attrs.get("replicas", 1))
        done_replicas = (f["done_replicas"][...].astype(bool) if "done_replicas" in f
                         else np.repeat(done[:, None], replicas, axis=1))
        tables = {group: {name: _column(dataset) for name, dataset in f[group].items()}
                  for group in ("fp_counts", "traps") if group in f}
    return SweepResult(attrs, points, metrics, traces, flags, done, done_replicas, tables.get("fp_counts"),
                       tables.get("traps"))


def _column(dataset):
    """A dataset's values; variable-length strings as str objects ("" where unwritten)."""
    if h5py.check_string_dtype(dataset.dtype) is not None:
        return np.array(dataset.asstr()[...], dtype=object)
    return dataset[...]


def table(source):
    """Tidy table of the finished runs: one row per (point, replica) written, columns point,
    replica, every parameter, every metric (a metric whose name is taken by a parameter
    gets the prefix "metric_"). `source` is a path or a SweepResult."""
    result = source if isinstance(source, SweepResult) else read(source)
    rows, replica = np.nonzero(result.done_replicas)  # row-major: by point, then replica
    columns = {"point": rows, "replica": replica}
    for name, values in result.points.items():
        columns[name] = values[rows]
    for name, values in result.metrics.items():
        column = name if name not in columns else "metric_" + name
        columns[column] = values[rows, replica]
    return _frame(columns)


def _frame(columns):
    try:
        import pandas
    except ImportError:
        return columns
    return pandas.DataFrame(columns)


def _with_params(result, point, columns):
    """point, replica columns first, then every parameter of each row's point (prefixed
    "param_" where its name is one of the table's own columns), then `columns`."""
    out = {"point": point[0], "replica": point[1]}
    for name, values in result.points.items():
        out[name if name not in columns and name not in out else "param_" + name] = values[point[0]]
    out.update(columns)
    return out


def _tuples(rows, width):
    """Rows of a 2-D array as tuples of their first width[i] entries (object array)."""
    out = np.empty(len(rows), dtype=object)
    for i, (row, n) in enumerate(zip(rows, width)):
        out[i] = tuple(row[:n].tolist())
    return out


def _index_tuples(rows):
    """Index rows (-1 beyond the rank) as tuples of the set entries."""
    return _tuples(rows, [int((row >= 0).sum()) for row in rows])


def counts_table(source):
    """Tidy table of the counted floating-point exceptions: one row per (point, replica,
    scope, op, flag) of the finished runs, in the order each run first raised them.
    Columns point, replica, every parameter, scope, op, flag, count, first_element (flat
    index, -1 if none), first_index (tuple, () if unknown), first_operands (tuple),
    first_result. `source` is a path or a SweepResult."""
    result = source if isinstance(source, SweepResult) else read(source)
    names = ("scope", "op", "flag", "count", "first_element", "first_index", "first_operands", "first_result")
    c = result.fp_counts
    if not c or c["count"].size == 0:
        empty = {name: np.array([], dtype=object) for name in names}
        return _frame(_with_params(result, (np.array([], dtype=np.int64), np.array([], dtype=np.int64)), empty))
    count = c["count"] * result.done_replicas[:, :, None]
    point, replica, row = np.nonzero(count)  # row-major: by point, replica, then order first raised
    columns = {name: c[name][point, replica, row] for name in ("scope", "op", "flag", "count", "first_element")}
    columns["first_index"] = _index_tuples(c["first_index"][point, replica, row])
    columns["first_operands"] = _tuples(c["first_operands"][point, replica, row], c["n_operands"][point, replica, row])
    columns["first_result"] = c["first_result"][point, replica, row]
    return _frame(_with_params(result, (point, replica), {name: columns[name] for name in names}))


def traps_table(source):
    """Tidy table of the runs that ended in a trap (fp_exceptions: trap): one row per
    trapped run of the finished runs, by point then replica. Columns point, replica,
    every parameter, flag, scope, op, element (flat index, -1 if none), index (tuple),
    operands (tuple), result (the would-be result), fp_sts and report (one line of text).
    `source` is a path or a SweepResult."""
    result = source if isinstance(source, SweepResult) else read(source)
    names = ("flag", "scope", "op", "element", "index", "operands", "result", "fp_sts", "report")
    t = result.traps
    if not t:
        empty = {name: np.array([], dtype=object) for name in names}
        return _frame(_with_params(result, (np.array([], dtype=np.int64), np.array([], dtype=np.int64)), empty))
    point, replica = np.nonzero(t["trapped"] * result.done_replicas)
    columns = {name: t[name][point, replica] for name in ("flag", "scope", "op", "element", "result", "fp_sts", "report")}
    columns["index"] = _index_tuples(t["index"][point, replica])
    columns["operands"] = _tuples(t["operands"][point, replica], t["n_operands"][point, replica])
    return _frame(_with_params(result, (point, replica), {name: columns[name] for name in names}))


def format_table(columns):
    """A dict of equal-length arrays as aligned text."""
    names = list(columns)
    cells = [[name] + [str(v) for v in columns[name]] for name in names]
    widths = [max(len(c) for c in column) for column in cells]
    lines = []
    for i in range(len(cells[0]) if cells else 0):
        lines.append("  ".join(column[i].rjust(width) for column, width in zip(cells, widths)))
    return "\n".join(lines)


TABLES = {"": table, "--counts": counts_table, "--traps": traps_table}


def main(argv):
    args = argv[1:]
    which = [a for a in args if a in TABLES]
    files = [a for a in args if a not in TABLES]
    if len(files) != 1 or len(which) > 1 or files[0] in ("-h", "--help") or files[0].startswith("--"):
        print("usage: roundoff_h5.py RESULTS.h5 [--counts | --traps]   (prints the tidy table: runs, counted "
              "floating-point exceptions, or trapped runs)", file=sys.stderr)
        return 2
    try:
        result = read(files[0])
    except (OSError, KeyError) as error:
        print("roundoff_h5.py: %s: not a readable sweep output (%s)" % (files[0], error), file=sys.stderr)
        return 2
    shard = ("shard %d/%d, " % (result.attrs["shard_index"], result.attrs["shard_count"])
             if "shard_index" in result.attrs else "")
    print("# %s: %d points x %d replicas, %s%s" % (result.attrs.get("experiment"), len(result.done),
                                                   result.attrs.get("replicas", 0), shard, result.attrs.get("status")))
    tidy = TABLES[which[0] if which else ""](result)
    print(tidy.to_string(index=False) if hasattr(tidy, "to_string") else format_table(tidy))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
