#!/usr/bin/python3
"""Read a roundoff sweep output (HDF5; layout in results/README.md).

In a notebook, three lines give a tidy table (one row per point and replica):

    import sys; sys.path.insert(0, "scripts")
    import roundoff_h5
    df = roundoff_h5.table("results/swamping.h5")

`table` returns a pandas DataFrame when pandas imports, else a dict of 1-D numpy arrays
(column name -> values). `read` gives the arrays as stored. From a shell:

    scripts/roundoff_h5.py results/swamping.h5
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
    """

    def __init__(self, attrs, points, metrics, traces, flags, done, done_replicas):
        self.attrs, self.points, self.metrics = attrs, points, metrics
        self.traces, self.flags, self.done = traces, flags, done
        self.done_replicas = done_replicas

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
    return SweepResult(attrs, points, metrics, traces, flags, done, done_replicas)


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
    try:
        import pandas
    except ImportError:
        return columns
    return pandas.DataFrame(columns)


def format_table(columns):
    """A dict of equal-length arrays as aligned text."""
    names = list(columns)
    cells = [[name] + [str(v) for v in columns[name]] for name in names]
    widths = [max(len(c) for c in column) for column in cells]
    lines = []
    for i in range(len(cells[0]) if cells else 0):
        lines.append("  ".join(column[i].rjust(width) for column, width in zip(cells, widths)))
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print("usage: roundoff_h5.py RESULTS.h5   (prints the tidy table)", file=sys.stderr)
        return 2
    try:
        result = read(argv[1])
    except (OSError, KeyError) as error:
        print("roundoff_h5.py: %s: not a readable sweep output (%s)" % (argv[1], error), file=sys.stderr)
        return 2
    shard = ("shard %d/%d, " % (result.attrs["shard_index"], result.attrs["shard_count"])
             if "shard_index" in result.attrs else "")
    print("# %s: %d points x %d replicas, %s%s" % (result.attrs.get("experiment"), len(result.done),
                                                   result.attrs.get("replicas", 0), shard, result.attrs.get("status")))
    tidy = table(result)
    print(tidy.to_string(index=False) if hasattr(tidy, "to_string") else format_table(tidy))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
