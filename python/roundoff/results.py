"""roundoff.results: a sweep's HDF5 output (layout in results/README.md) in Python.

    import roundoff
    res = roundoff.results.open("results/swamping.h5")
    df = roundoff.results.table(res)          # one row per (point, replica): params, metrics
    ds = roundoff.results.dataset(res)        # xarray: dimensions are the grid's parameters

`open` reads every dataset into a Results object (the arrays as stored). The tables are
pandas DataFrames: `table` (runs), `trace_table` (one trace, long form), `counts_table`
and `traps_table` (the floating-point exceptions a sweep with `fp_exceptions: count` or
`trap` recorded). `dataset` is an xarray Dataset whose dimensions are the parameters
that vary over the grid, plus `replica` (and a trace's x axis for its traces).
Every function takes a path or a Results (`load` turns either into a Results); the
figures are roundoff.plot's, which imports this module (never the other way). From a
shell:

    /usr/bin/python3 -m roundoff.results results/swamping.h5 [--counts | --traps | --failures]
"""
import sys

import h5py
import numpy as np
import pandas

FLAGS = ("OFLO", "DIV0", "INV", "UFLO", "INEXACT")


class Results:
    """One sweep output in memory.

    path:    the file it was read from
    attrs:   dict of the root attributes (strings as str, numbers as Python ints)
    points:  dict param -> [P] array (int64, float64, bool, or str objects)
    metrics: dict metric -> [P, R] float64 (NaN where not computed)
    traces:  dict trace -> (x [P, T], y [P, R, T]) float64, NaN-padded
    meanings: dict name -> the `meaning` attribute of each parameter, metric and trace
    trace_x: dict trace -> what its x counts (the x_name attribute: step, log2_bin, ...)
    flags:   dict FLAG -> [P, R] bool (sticky FP status at the end of each run)
    done:    [P] bool: points whose replicas are all written
    done_replicas: [P, R] bool: runs written (a shard's file holds some runs of a point)
    fp_counts: dict column -> [P, R, K] (first_index [P, R, K, 4], first_operands
             [P, R, K, M]); text columns as str objects; rows with count 0 are unused
    traps:   dict column -> [P, R] (index [P, R, 4], operands [P, R, M]); trapped says
             which runs ended in a trap
    (fp_counts and traps are empty dicts for files written before they existed)
    """

    def __init__(self, path, attrs, points, metrics, traces, meanings, trace_x, flags, done, done_replicas,
                 fp_counts, traps):
        self.path, self.attrs, self.points, self.metrics = path, attrs, points, metrics
        self.traces, self.meanings, self.trace_x = traces, meanings, trace_x
        self.flags, self.done, self.done_replicas = flags, done, done_replicas
        self.fp_counts, self.traps = fp_counts, traps

    @property
    def experiment(self):
        return self.attrs.get("experiment")

    @property
    def replicas(self):
        return self.done_replicas.shape[1]

    def written_points(self):
        """The points with at least one written run, in file order (ints)."""
        return [int(p) for p in np.flatnonzero(self.done_replicas.any(axis=1))]

    def varying(self):
        """The parameters that take more than one value over the written points, in file order."""
        written = self.written_points()
        return [name for name, values in self.points.items() if len(set(values[written].tolist())) > 1]

    def __repr__(self):
        return "Results(%r: experiment=%r, points=%d, replicas=%d, status=%r)" % (
            self.path, self.experiment, len(self.done), self.replicas, self.attrs.get("status"))


def _plain(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def open(path):
    """Reads every dataset of a sweep output into a Results. A file that is not a sweep
    output, or a truncated or damaged one (unreadable, or datasets whose shapes disagree),
    raises ValueError naming it and what is wrong; the file is only read."""
    try:
        with h5py.File(path, "r") as f:
            result = _read(path, f)
    except (OSError, KeyError, ValueError, TypeError, AttributeError, RuntimeError, UnicodeDecodeError) as error:
        raise ValueError("%s: not a readable sweep output (%s: %s)" % (path, type(error).__name__, error)) from None
    problem = _shape_problem(result)
    if problem:
        raise ValueError("%s: not a readable sweep output (damaged: %s)" % (path, problem))
    return result


def _shape_problem(result):
    """What disagrees with /done's [P] and /done_replicas' [P, R], or None."""
    if result.done.ndim != 1 or result.done_replicas.ndim != 2 or len(result.done_replicas) != len(result.done):
        return "/done is %s and /done_replicas %s" % (result.done.shape, result.done_replicas.shape)
    n_points, replicas = result.done_replicas.shape
    for name, values in result.points.items():
        if values.shape != (n_points,):
            return "/points/%s is %s, not (%d,)" % (name, values.shape, n_points)
    for group, datasets in (("metrics", result.metrics), ("flags", result.flags)):
        for name, values in datasets.items():
            if values.shape != (n_points, replicas):
                return "/%s/%s is %s, not (%d, %d)" % (group, name, values.shape, n_points, replicas)
    return None


def _read(path, f):
    attrs = {name: _plain(value) for name, value in f.attrs.items()}
    meanings = {}
    points = {}
    for name, dataset in f["points"].items():
        kind = _plain(dataset.attrs.get("type", ""))
        if kind == "string":
            points[name] = np.array(dataset.asstr()[...], dtype=object)
        elif kind == "bool":
            points[name] = dataset[...].astype(bool)
        else:
            points[name] = dataset[...]
        meanings[name] = _plain(dataset.attrs.get("meaning", ""))
    metrics = {}
    for name, dataset in f["metrics"].items():
        metrics[name] = dataset[...]
        meanings.setdefault(name, _plain(dataset.attrs.get("meaning", "")))
    traces, trace_x = {}, {}
    for name, dataset in f["traces"].items():
        if "x" in dataset.attrs:  # a trace; its x axis is the sibling dataset it names
            traces[name] = (f["traces"][_plain(dataset.attrs["x"])][...], dataset[...])
            trace_x[name] = _plain(dataset.attrs.get("x_name", "x"))
            meanings.setdefault(name, _plain(dataset.attrs.get("meaning", "")))
    flags = {name: f["flags"][name][...].astype(bool) for name in FLAGS if name in f["flags"]}
    done = f["done"][...].astype(bool)
    # Files written before /done_replicas existed mark whole points only.
    replicas = int(attrs.get("replicas", 1))
    done_replicas = (f["done_replicas"][...].astype(bool) if "done_replicas" in f
                     else np.repeat(done[:, None], replicas, axis=1))
    tables = {group: {name: _column(dataset) for name, dataset in f[group].items()}
              for group in ("fp_counts", "traps") if group in f}
    return Results(path, attrs, points, metrics, traces, meanings, trace_x, flags, done, done_replicas,
                   tables.get("fp_counts", {}), tables.get("traps", {}))


def _column(dataset):
    """A dataset's values; variable-length strings as str objects ("" where unwritten)."""
    if h5py.check_string_dtype(dataset.dtype) is not None:
        return np.array(dataset.asstr()[...], dtype=object)
    return dataset[...]


def load(source):
    """A Results from a path (read by `open`) or a Results (returned as it is): what every
    function here, roundoff.plot's and roundoff.report's take."""
    if isinstance(source, Results):
        return source
    return open(source)


def table(source):
    """Tidy table of the written runs: one row per (point, replica), columns point,
    replica, every parameter, every metric (a metric whose name is taken by a parameter
    gets the prefix "metric_")."""
    result = load(source)
    rows, replica = np.nonzero(result.done_replicas)  # row-major: by point, then replica
    columns = {"point": rows, "replica": replica}
    for name, values in result.points.items():
        columns[name] = values[rows]
    for name, values in result.metrics.items():
        column = name if name not in columns else "metric_" + name
        columns[column] = values[rows, replica]
    return pandas.DataFrame(columns)


def trace_table(source, name):
    """One trace in long form: a row per (point, replica, sample) of the written runs,
    columns point, replica, every parameter, x (named by the trace's x_name: step,
    log2_bin, ...; "x_" prefixed where a parameter has that name) and the value (named
    after the trace). NaN padding is left out. KeyError names the traces there are."""
    result = load(source)
    if name not in result.traces:
        raise KeyError("%s: no trace %r (traces: %s)" % (result.path, name, ", ".join(result.traces) or "none"))
    x, y = result.traces[name]
    point, replica, sample = np.nonzero(result.done_replicas[:, :, None] & ~np.isnan(x)[:, None, :])
    x_name = result.trace_x[name]
    if x_name in result.points or x_name in ("point", "replica"):
        x_name = "x_" + x_name
    columns = {x_name: x[point, sample], name: y[point, replica, sample]}
    return pandas.DataFrame(_with_params(result, (point, replica), columns))


def dataset(source):
    """An xarray Dataset of the written runs: every metric as a variable with dimensions
    (the parameters that vary over the grid, in file order) + (replica,); parameters that
    do not vary are scalar coordinates. Cells of the grid's product that no point fills
    (a zip, an unfinished or partial file) are NaN, `written` says which runs are there.
    Flags are variables flag_<FLAG> (bool). Each trace is a variable with one more
    dimension, its x axis, named by its x_name (step, log2_bin, ...) where every trace with
    that x_name has the same x values, else <trace>_<x_name>; a trace whose x values differ
    between points (trace_every varies) gets a <trace>_sample dimension and its x values as
    the variable <trace>_x."""
    import xarray  # lazily: only this function needs it

    result = load(source)
    points = result.written_points()
    dims = [name for name in result.varying() if name not in ("replica",)]
    levels = [list(dict.fromkeys(result.points[name][points].tolist())) for name in dims]
    cell = {}
    for p in points:
        key = tuple(levels[i].index(result.points[name][p]) for i, name in enumerate(dims))
        if key in cell:  # the same parameters twice: no grid to put them on
            raise ValueError("%s: points %d and %d have the same parameters; use table()" % (result.path, cell[key], p))
        cell[key] = p
    shape = [len(level) for level in levels] + [result.replicas]
    index = tuple(np.array(column, dtype=np.intp) for column in zip(*cell)) if dims else ()
    where = np.array(list(cell.values()), dtype=np.intp)

    def gridded(values, fill):  # values [P, R, ...] -> shape + [...]
        out = np.full(shape + list(values.shape[2:]), fill, dtype=values.dtype if fill is not np.nan else float)
        if dims:
            out[index] = values[where]
        elif len(where):
            out[...] = values[where[0]]
        return out

    run_dims = dims + ["replica"]
    variables = {"written": (run_dims, gridded(result.done_replicas, False))}
    for name, values in result.metrics.items():
        values = np.where(result.done_replicas, values, np.nan)
        variables[name if name not in result.points else "metric_" + name] = (
            run_dims, gridded(values, np.nan), {"meaning": result.meanings.get(name, "")})
    for flag, values in result.flags.items():
        variables["flag_" + flag] = (run_dims, gridded(values & result.done_replicas, False))
    coords = {name: level for name, level in zip(dims, levels)}
    coords["replica"] = np.arange(result.replicas)
    for name, values in result.points.items():
        if name not in dims and len(points):
            coords[name] = values[points[0]]
    _add_traces(result, points, run_dims, gridded, variables, coords)
    return xarray.Dataset(variables, coords=coords, attrs={key: value for key, value in result.attrs.items()})


def _trace_axis(x, points):
    """The x values shared by every written point's trace (each a prefix of the longest,
    NaN after), or None when they differ."""
    rows = x[points]
    longest = rows[np.argmax((~np.isnan(rows)).sum(axis=1))] if len(rows) else x[:0].reshape(-1)
    longest = longest[~np.isnan(longest)]
    for row in rows:
        row = row[~np.isnan(row)]
        if not np.array_equal(row, longest[:len(row)]):
            return None
    return longest


def _add_traces(result, points, run_dims, gridded, variables, coords):
    axes = {name: _trace_axis(x, points) for name, (x, _) in result.traces.items()}
    for name, (x, y) in result.traces.items():
        axis = axes[name]
        meaning = {"meaning": result.meanings.get(name, "")}
        if axis is None:
            dim = name + "_sample"
            variables[name + "_x"] = (run_dims[:-1] + [dim], gridded(x[:, None, :], np.nan)[..., 0, :])
            variables[name] = (run_dims + [dim], gridded(y, np.nan), meaning)
            continue
        x_name = result.trace_x[name]
        shared = all(axes[other] is not None and np.array_equal(axes[other], axis)
                     for other in result.traces if result.trace_x[other] == x_name)
        dim = x_name if shared and x_name not in result.points and x_name != "replica" else name + "_" + x_name
        coords[dim] = axis
        variables[name] = (run_dims + [dim], gridded(y[:, :, :len(axis)], np.nan), meaning)


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
    first_result."""
    result = load(source)
    names = ("scope", "op", "flag", "count", "first_element", "first_index", "first_operands", "first_result")
    c = result.fp_counts
    if not c or c["count"].size == 0:
        empty = {name: np.array([], dtype=object) for name in names}
        return pandas.DataFrame(_with_params(result, (np.array([], dtype=np.int64), np.array([], dtype=np.int64)), empty))
    count = c["count"] * result.done_replicas[:, :, None]
    point, replica, row = np.nonzero(count)  # row-major: by point, replica, then order first raised
    columns = {name: c[name][point, replica, row] for name in ("scope", "op", "flag", "count", "first_element")}
    columns["first_index"] = _index_tuples(c["first_index"][point, replica, row])
    columns["first_operands"] = _tuples(c["first_operands"][point, replica, row], c["n_operands"][point, replica, row])
    columns["first_result"] = c["first_result"][point, replica, row]
    return pandas.DataFrame(_with_params(result, (point, replica), {name: columns[name] for name in names}))


def traps_table(source):
    """Tidy table of the runs that ended in a trap (fp_exceptions: trap): one row per
    trapped run of the finished runs, by point then replica. Columns point, replica,
    every parameter, flag, scope, op, element (flat index, -1 if none), index (tuple),
    operands (tuple), result (the would-be result), fp_sts and report (one line of text)."""
    result = load(source)
    names = ("flag", "scope", "op", "element", "index", "operands", "result", "fp_sts", "report")
    t = result.traps
    if not t:
        empty = {name: np.array([], dtype=object) for name in names}
        return pandas.DataFrame(_with_params(result, (np.array([], dtype=np.int64), np.array([], dtype=np.int64)), empty))
    point, replica = np.nonzero(t["trapped"] * result.done_replicas)
    columns = {name: t[name][point, replica] for name in ("flag", "scope", "op", "element", "result", "fp_sts", "report")}
    columns["index"] = _index_tuples(t["index"][point, replica])
    columns["operands"] = _tuples(t["operands"][point, replica], t["n_operands"][point, replica])
    return pandas.DataFrame(_with_params(result, (point, replica), {name: columns[name] for name in names}))


def failures_table(source):
    """Tidy table of the runs whose own code raised (a Python experiment's callable) and are
    not done: one row per run, by point then replica (the file's /failures; empty when it has
    none). Columns point, replica, every parameter, message (the exception, one line) and
    traceback."""
    result = load(source)
    with h5py.File(result.path, "r") as f:
        rows = ({name: _column(f["failures"][name]) for name in ("point", "replica", "message", "traceback")}
                if "failures" in f else {})
    point = rows.get("point", np.array([], dtype=np.int64))
    replica = rows.get("replica", np.array([], dtype=np.int64))
    columns = {name: rows.get(name, np.array([], dtype=object)) for name in ("message", "traceback")}
    return pandas.DataFrame(_with_params(result, (point, replica), columns))


TABLES = {"": table, "--counts": counts_table, "--traps": traps_table, "--failures": failures_table}


def main(argv):
    args = argv[1:]
    which = [a for a in args if a in TABLES]
    files = [a for a in args if a not in TABLES]
    if len(files) != 1 or len(which) > 1 or files[0] in ("-h", "--help") or files[0].startswith("--"):
        print("usage: python3 -m roundoff.results RESULTS.h5 [--counts | --traps | --failures]   (prints the tidy "
              "table: runs, counted floating-point exceptions, trapped runs, or runs that raised)", file=sys.stderr)
        return 2
    try:
        result = open(files[0])
    except ValueError as error:
        print("roundoff.results: %s" % error, file=sys.stderr)
        return 2
    shard = ("shard %d/%d, " % (result.attrs["shard_index"], result.attrs["shard_count"])
             if "shard_index" in result.attrs else "")
    print("# %s: %d points x %d replicas, %s%s" % (result.experiment, len(result.done), result.replicas, shard,
                                                   result.attrs.get("status")))
    with pandas.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200):
        print(TABLES[which[0] if which else ""](result).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
