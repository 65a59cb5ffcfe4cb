"""roundoff.plot: the figures of a sweep's output, laid out along its grid.

    import roundoff
    res = roundoff.results.open("results/matmul_accum.h5")
    for suffix, fig in roundoff.plot.figures(res):   # matplotlib Figures, no pyplot state
        ...
    roundoff.plot.save(res, "plots/")               # <stem>_<suffix>.png; returns the paths

From a shell (prints the paths; the folder defaults to that of RESULTS.h5):

    /usr/bin/python3 -m roundoff.plot RESULTS.h5 [--out DIR]

How a metric is drawn (`metric_figure`): the parameters that vary over the grid are its
axes. A `zip` (parameters varied together) is one axis; parameters whose values are equal
at every point (weight_format = act_format = grad_format) are named once. The x axis is
the numeric axis with the most values (K, n, steps, scale, lr; at least three of them),
log-scaled when it spans two decades or more (base 2 when every value is a power of two),
else the categorical axis with the most values (dodged markers; rows instead of columns
when the labels are long). Of the other axes, one becomes the lines' colour and one their
style; the rest become small multiples (columns, then rows). Replicas: the line is their
median, the band (error bar on a categorical x) their range. The y axis is logarithmic
when the values are positive and span two decades, symmetric-logarithmic when some are
exactly 0 (drawn at 0, not dropped). Parameters that the config fixes are in the title.

Non-finite results (inf or NaN in some replica: an fp16 sum past 65504, a trapped run)
are never dropped silently: the point is drawn as an "x" on the panel's top (right)
edge, and the figure lists the points (`fig.roundoff_nonfinite`; `save` and the command
line print them on stderr). Each figure also carries `fig.roundoff_caption`, a sentence
saying what it shows (the HTML report, roundoff.report, prints it under the figure).

Per experiment, besides the metrics not drawn otherwise:
  swamping       trace (running x per format and rounding, the exact sum dashed), finals
                 (histogram of the final values over replicas)
  summation      rel_error against n per series and format, with n u and sqrt(n) u;
                 trace of the running sum against the exact sum (trace_every > 0)
  matmul_accum   error_vs_K: mean and max relative error against K per unit, with K u and
                 sqrt(K) u of each unit's output format
  updates        error (mean |w - w_fp64| per step), drift and lost updates per strategy
  grad_underflow lost (underflow, overflow, subnormal fractions against the loss scale),
                 hist (log2 histogram of the gradient magnitudes with each format's least
                 subnormal, least normal and largest value, and the share lost to zero)
  train          loss (against step per update strategy), loss_scale (dynamic scaling),
                 hist (log2 histogram of each layer's gradients, grad_format's range
                 marked), hist_<layer> (heat map of that histogram over the steps), and
                 the final metrics in groups (accuracy, loss, updates, overflow, ...)
  norm_stats     each metric against the mean, per algorithm and length, a panel per
                 accumulation and spread
  block_quant    sqnr, saturated, flushed (per format and scale rule, elements rne),
                 bias (the other element roundings)
  overflow_hunt  oflo (operations that raised OFLO, INV per op and configuration),
                 max_abs (largest |output| per op, the format's max marked)
"""
import argparse
import math
import os
import re
import sys
import textwrap
import warnings

import numpy as np
from matplotlib import colormaps
from matplotlib import colors as mcolors
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from . import results as _results

DPI = 150

# Parameters whose values say what they are (fp16, sr, a100, fp16-kahan): shown bare in
# labels; every other parameter as name=value.
SELF_EVIDENT = {"format", "rounding", "unit", "update", "algorithm", "series", "distribution", "model", "optimizer",
                "accumulation", "scale_rule"}

# Short axis labels for the numeric parameters experiments sweep (the rest: their name).
AXIS_LABELS = {
    "K": "K (products per result)", "n": "n (terms)", "steps": "steps", "scale": "loss scale S",
    "lr": "learning rate", "mean": "mean of the values", "spread": "spread", "length": "vector length",
    "addend": "addend", "step": "step", "k": "k (terms summed)", "bn_layer": "batch-norm layer",
}

LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
# The label of the markers for non-finite results (each panel's lines carry labels too:
# their colour's and style's levels, or the reference they draw).
NONFINITE_LABEL = "inf/NaN"


# ---------------------------------------------------------------------------------------
# Values and labels

def _number(value):
    """A parameter or metric value as text: integers without a point, others %g."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else "%g" % v
    return str(value)


def _value_text(name, value):
    """How a parameter's value reads in a label: fp16, lr=0.05, bn_fp32=true,
    unscale_format=auto."""
    if isinstance(value, str) and (name in SELF_EVIDENT or name.endswith("_format")
                                   and value not in ("auto", "default", "compute", "")):
        return value
    return "%s=%s" % (name, _number(value))


def _is_numeric(values):
    return values.dtype.kind in "iuf"


def _point_text(results, point, names=None):
    """The point's varying parameters as name=value (for messages)."""
    names = results.varying() if names is None else names
    return " ".join("%s=%s" % (n, _number(results.points[n][point])) for n in names) or "point %d" % point


def _configured(results):
    """Parameter names the config mentions (grid or zip keys)."""
    text = results.attrs.get("config", "")
    return {name for name in results.points if re.search(r"^\s*%s\s*:" % re.escape(name), text, re.M)}


def _constants_text(results, points, shown):
    """The parameters the config sets that take one value over `points`: 'steps=10000, ...'."""
    configured = _configured(results)
    parts = []
    for name, values in results.points.items():
        if name in shown or name not in configured:
            continue
        distinct = set(values[points].tolist())
        if len(distinct) == 1:
            parts.append("%s=%s" % (name, _number(values[points[0]])))
    return ", ".join(parts)


def _log_ticks_base2(values):
    v = np.asarray(sorted(set(values)), dtype=float)
    if not len(v) or (v <= 0).any():
        return False
    e = np.log2(v)
    return bool(np.all(np.abs(e - np.round(e)) < 1e-9))


def _spans_decades(values, decades=2):
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return len(v) > 0 and v.max() / v.min() >= 10 ** decades


def _set_numeric_x(ax, values, name):
    """Numeric grid values on x: log when they span two decades (base 2 for powers of two),
    ticks at the grid's values where there are few of them."""
    v = sorted(set(float(x) for x in values))
    if min(v) > 0 and _spans_decades(v):
        if _log_ticks_base2(v):
            ax.set_xscale("log", base=2)
            # At most about nine ticks, none closer than a tenth of the axis to the last.
            exponents = [math.log2(t) for t in v]
            gap = max(1.0, (exponents[-1] - exponents[0]) / 9)
            ticks = [v[0]]
            for t, e in zip(v[1:], exponents[1:]):
                if e - math.log2(ticks[-1]) >= gap - 1e-9:
                    ticks.append(t)
            ax.set_xticks(ticks)
            ax.set_xticklabels(["$2^{%d}$" % round(math.log2(t)) for t in ticks])
            ax.xaxis.set_minor_locator(ticker.NullLocator())
        else:
            ax.set_xscale("log")
    elif len(v) <= 8:
        ax.set_xticks(v)
        ax.set_xticklabels([_number(t) for t in v])
    ax.set_xlabel(AXIS_LABELS.get(name, name))


def _value_scale(values, decades=2):
    """('log' | 'symlog' | 'linear', linthresh) for these values (their finite ones): log
    where they are positive and span `decades`, symlog where some are exactly 0."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v) or (v < 0).any() or not _spans_decades(v, decades):
        return "linear", None
    if (v == 0).any():
        smallest = v[v > 0].min()
        return "symlog", 10 ** math.floor(math.log10(smallest))
    return "log", None


def _apply_value_scale(ax, scale, which="y"):
    kind, linthresh = scale
    setter = ax.set_yscale if which == "y" else ax.set_xscale
    if kind == "symlog":
        setter("symlog", linthresh=linthresh, linscale=0.5)
        # At most nine labelled decades (matplotlib's default is 15: crowded on a panel).
        (ax.yaxis if which == "y" else ax.xaxis).get_major_locator().set_params(numticks=9)
    elif kind == "log":
        setter("log")
    elif kind == "log2":  # powers of two (loss scales) labelled as such
        setter("log", base=2)
        axis = ax.yaxis if which == "y" else ax.xaxis
        axis.set_major_formatter(ticker.LogFormatterMathtext(base=2))
        axis.set_minor_locator(ticker.NullLocator())


def _edge_marks(ax, positions, horizontal, color, slot=0):
    """Markers for non-finite results on the panel's far edge (top, or right when the values
    run along x), at their grid positions; each line's `slot` a little further in, so that
    lines failing at the same position all show."""
    positions = list(positions)
    if not positions:
        return
    edge = np.full(len(positions), 0.97 - 0.05 * slot)
    if horizontal:
        ax.plot(edge, positions, "x", color=color, ms=7, mew=1.6, ls="none",
                transform=ax.get_yaxis_transform(), clip_on=False, zorder=5, label=NONFINITE_LABEL)
    else:
        ax.plot(positions, edge, "x", color=color, ms=7, mew=1.6, ls="none",
                transform=ax.get_xaxis_transform(), clip_on=False, zorder=5, label=NONFINITE_LABEL)


def _wrap(text, width=110):
    return "\n".join(textwrap.wrap(text, width)) if text else text


def _finish(fig, caption, nonfinite=()):
    """Attaches the report's caption and the non-finite notes to a figure."""
    fig.roundoff_caption = caption
    fig.roundoff_nonfinite = list(nonfinite)
    return fig


def _new_figure(rows, cols, panel_w, panel_h, sharex=False, sharey=False, extra_w=0.0):
    """A constrained-layout figure of rows x cols panels; extra_w inches more for what
    sits beside them (long tick labels)."""
    fig = Figure(figsize=(panel_w * cols + 0.6 + extra_w, panel_h * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=sharex, sharey=sharey)
    return fig, axes


# ---------------------------------------------------------------------------------------
# The grid's axes

class Axis:
    """One axis of the grid: a parameter, or parameters varied together (a zip).

    names:  groups of parameter names; the names of a group have equal values everywhere
    levels: the distinct value tuples (one value per group) in order (ascending for a
            numeric axis, else as the points first take them)
    level_of: dict point -> index into levels
    """

    def __init__(self, results, names, points, labeler=None):
        self.groups, self.labeler = names, labeler
        first = [g[0] for g in names]
        tuples = [tuple(results.points[n][p] for n in first) for p in points]
        self.numeric = len(first) == 1 and _is_numeric(results.points[first[0]]) \
            and results.points[first[0]].dtype != bool
        levels = list(dict.fromkeys(tuples))
        if self.numeric:
            levels.sort()
        self.levels = levels
        index = {level: i for i, level in enumerate(levels)}
        self.level_of = {p: index[t] for p, t in zip(points, tuples)}

    @property
    def name(self):
        return self.groups[0][0]

    def params(self):
        return [n for g in self.groups for n in g]

    def title(self):
        if self.labeler is not None and getattr(self.labeler, "title", None):
            return self.labeler.title(self.groups) or self._title()
        return self._title()

    def _title(self):
        return ", ".join(" = ".join(g) for g in self.groups)

    def label(self, i, full=False):
        """Level i as text (full: merged parameters named, as a panel's title wants)."""
        if self.labeler is not None:
            text = self.labeler(self.groups, self.levels[i])
            if text is not None:
                return text
        if full and len(self.groups) == 1 and len(self.groups[0]) > 1:
            return "%s = %s" % (" = ".join(self.groups[0]), _number(self.levels[i][0]))
        return " ".join(_value_text(g[0], v) for g, v in zip(self.groups, self.levels[i]))

    def value(self, i):
        return self.levels[i][0]

    def __len__(self):
        return len(self.levels)


def _merge_equal_columns(results, names, points):
    """Groups parameters whose values are equal at every point (as text)."""
    groups = []
    for name in names:
        column = [str(v) for v in results.points[name][points]]
        for g in groups:
            if [str(v) for v in results.points[g[0]][points]] == column:
                g.append(name)
                break
        else:
            groups.append([name])
    return groups


def grid_axes(results, points, explicit=(), labeler=None):
    """The axes of the grid over `points`: each parameter named in `explicit` (a name or a
    tuple of names, one axis each), then every other parameter that varies over them: one
    axis per parameter crossed with all the others (a `grid` key), and one for the
    parameters that are not (the `zip`)."""
    points = list(points)
    used = set()
    axes = []
    for spec in explicit:
        names = [spec] if isinstance(spec, str) else list(spec)
        names = [n for n in names if len(set(results.points[n][points].tolist())) > 1]
        used.update(names)
        if names:
            axes.append(Axis(results, _merge_equal_columns(results, names, points), points, labeler))
    varying = [n for n, v in results.points.items()
               if n not in used and len(set(v[points].tolist())) > 1]

    def distinct(names):
        return len(set(zip(*(results.points[n][points].tolist() for n in names)))) if names else 1

    total = distinct(varying)
    crossed = [n for n in varying if distinct([n]) * distinct([m for m in varying if m != n]) == total]
    zipped = [n for n in varying if n not in crossed]
    for n in varying:
        if n in crossed:
            axes.append(Axis(results, [[n]], points, labeler))
        elif n == zipped[0]:
            axes.append(Axis(results, _merge_equal_columns(results, zipped, points), points, labeler))
    return axes


class Layout:
    """Which axis goes where: x, colour (hue), line style, panel columns and rows.

    roles: dict with optional keys x, hue, style, cols, rows naming a parameter (or a
    tuple of them; one that does not vary over the points leaves its place free); the
    rest is chosen: x the numeric axis with most values (at least
    three), else the categorical axis with most values; hue the largest remaining axis of
    at most 10 values; style the next of at most 4; then columns, then rows (several
    axes left for rows are crossed into one)."""

    def __init__(self, results, points, roles=None, x_is_trace=False, labeler=None):
        roles = dict(roles or {})
        explicit = [roles[k] for k in ("x", "hue", "style", "cols", "rows") if roles.get(k) is not None]
        axes = grid_axes(results, points, explicit, labeler)
        by_spec = {}
        for spec in explicit:
            first = spec if isinstance(spec, str) else spec[0]
            found = [a for a in axes if first in a.params()]
            by_spec[spec if isinstance(spec, str) else tuple(spec)] = found[0] if found else None

        def take(key):
            spec = roles.get(key)
            if spec is None:
                return None
            axis = by_spec.get(spec if isinstance(spec, str) else tuple(spec))
            if axis in rest:
                rest.remove(axis)
            return axis

        rest = list(axes)
        self.x = None if x_is_trace else take("x")
        self.hue, self.style = take("hue"), take("style")
        self.cols, self.rows = take("cols"), take("rows")
        if not x_is_trace and self.x is None:
            numeric = [a for a in rest if a.numeric and len(a) >= 3]
            pick = max(numeric, key=len) if numeric else (max(rest, key=len) if rest else None)
            if pick is not None:
                rest.remove(pick)
                self.x = pick
        rest.sort(key=len, reverse=True)
        if self.hue is None:
            self.hue = next((a for a in rest if len(a) <= 10), None)
            if self.hue is not None:
                rest.remove(self.hue)
        if self.style is None:
            self.style = next((a for a in rest if len(a) <= 4), None)
            if self.style is not None:
                rest.remove(self.style)
        if self.cols is None and rest:
            self.cols = min(rest, key=len) if len(rest) > 1 else rest[0]
            rest.remove(self.cols)
        self.extra_rows = rest  # crossed into the rows
        if self.rows is not None:
            self.extra_rows = [self.rows] + rest
        self.points = list(points)
        self._row_keys = list(dict.fromkeys(self.row_key(p) for p in self.points))
        # Columns alone, more than three: wrapped into a near-square grid.
        self.wrap = None
        if self.cols is not None and not self.extra_rows and len(self.cols) > 3:
            self.wrap = max(2, math.ceil(math.sqrt(len(self.cols))))
        self._col_keys = list(range(len(self.cols))) if self.cols is not None else [0]

    def shown(self):
        """Every parameter this layout places somewhere."""
        names = set()
        for a in [self.x, self.hue, self.style, self.cols] + self.extra_rows:
            if a is not None:
                names.update(a.params())
        return names

    def row_key(self, p):
        return tuple(a.level_of[p] for a in self.extra_rows)

    def panel_of(self, p):
        if self.wrap:
            return divmod(self.cols.level_of[p], self.wrap)
        r = self._row_keys.index(self.row_key(p))
        c = self.cols.level_of[p] if self.cols is not None else 0
        return r, c

    def shape(self):
        if self.wrap:
            return math.ceil(len(self.cols) / self.wrap), self.wrap
        return len(self._row_keys), len(self._col_keys)

    def panel_title(self, r, c):
        if self.wrap:
            return self.cols.label(r * self.wrap + c, full=True)
        parts = []
        key = self._row_keys[r]
        for axis, level in zip(self.extra_rows, key):
            parts.append(axis.label(level, full=True))
        if self.cols is not None:
            parts.append(self.cols.label(self._col_keys[c], full=True))
        return ", ".join(parts)

    def line_label(self, key):
        """The levels a line stands for: 'sr', 'sr kahan', or '' with neither colour nor style."""
        parts = [axis.label(level) for axis, level in ((self.hue, key[0]), (self.style, key[1])) if axis is not None]
        return " ".join(parts)

    def line_key(self, p):
        return (self.hue.level_of[p] if self.hue is not None else 0,
                self.style.level_of[p] if self.style is not None else 0)

    def color(self, key):
        n = len(self.hue) if self.hue is not None else 1
        if n <= 10:
            return "C%d" % key[0]
        return mcolors.to_hex(colormaps["viridis"](key[0] / max(1, n - 1)))

    def linestyle(self, key):
        return LINESTYLES[key[1] % len(LINESTYLES)]

    def marker(self, key):
        return MARKERS[key[1] % len(MARKERS)]

    def legend(self, fig, extra=(), markers=True):
        """One legend right of the panels: the colours (hue), the styles, then `extra`."""
        handles, labels = [], []
        blank = Line2D([], [], ls="none")
        if self.hue is not None:
            if self.style is not None:
                handles.append(blank)
                labels.append(r"$\bf{%s}$" % _mathtext_escape(self.hue.title()))
            for i in range(len(self.hue)):
                handles.append(Line2D([], [], color=self.color((i, 0)), marker="o" if markers else None, ms=4))
                labels.append(self.hue.label(i))
        if self.style is not None:
            handles.append(blank)
            labels.append(r"$\bf{%s}$" % _mathtext_escape(self.style.title()))
            for i in range(len(self.style)):
                handles.append(Line2D([], [], color="0.3", ls=self.linestyle((0, i)),
                                      marker=self.marker((0, i)) if markers else None, ms=4))
                labels.append(self.style.label(i))
        for handle, label in extra:
            handles.append(handle)
            labels.append(label)
        if not handles:
            return
        title = self.hue.title() if self.hue is not None and self.style is None else None
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8,
                   title=title, title_fontsize=8)


def _mathtext_escape(text):
    return text.replace("\\", "\\\\").replace("_", r"\_").replace(" ", r"\ ").replace("$", r"\$") \
        .replace("=", r"\!=\!").replace("%", r"\%").replace("{", r"\{").replace("}", r"\}")


# ---------------------------------------------------------------------------------------
# Metrics

def _replica_values(results, metric, p):
    """The written replicas' values of a metric at point p."""
    return results.metrics[metric][p][results.done_replicas[p]]


class _Summary:
    """Median and range over the written replicas of one metric at each point;
    nonfinite where some replica is inf or NaN."""

    def __init__(self, results, metric, points):
        self.median, self.low, self.high, self.nonfinite = {}, {}, {}, {}
        for p in points:
            v = _replica_values(results, metric, p)
            bad = not np.isfinite(v).all() or not len(v)
            self.nonfinite[p] = bad
            if not bad:
                self.median[p] = float(np.median(v))
                self.low[p], self.high[p] = float(v.min()), float(v.max())

    def finite_values(self):
        return list(self.low.values()) + list(self.high.values())

    def bad_points(self):
        return [p for p, bad in self.nonfinite.items() if bad]


def nonfinite_lines(results, what, values_of, points):
    """The stderr lines for `what` (a metric or trace) at the points with inf/NaN runs:
    a header, then '  point p (params): a inf, b NaN of R replicas'."""
    trapped = results.traps.get("trapped") if results.traps else None
    lines = []
    for p in points:
        v = values_of(p)
        written = results.done_replicas[p]
        extra = ""
        if trapped is not None and trapped[p][written].any():
            extra = " (%d trapped)" % int(trapped[p][written].sum())
        lines.append("  point %d (%s): %d inf, %d NaN%s of %d replicas"
                     % (p, _point_text(results, p), int(np.isinf(v).sum()), int(np.isnan(v).sum()), extra,
                        int(written.sum())))
    return lines


def _metric_nonfinite(results, metric, summary, points):
    bad = summary.bad_points()
    if not bad:
        return []
    header = "%d of %d points have non-finite %s (inf or NaN in some replica; e.g. overflow)" % (
        len(bad), len(points), metric)
    return [(header, nonfinite_lines(results, metric, lambda p: _replica_values(results, metric, p), bad))]


def metric_figure(results, metrics, points=None, roles=None, references=None, title=None, value_label=None,
                  value_scale=None, caption=None, labeler=None):
    """One figure of one or several metrics over the grid (a panel column per metric when
    there are several and no other columns). roles: as Layout takes them; references(ax,
    metric, panel_points) draws reference lines (returning legend entries) without
    changing the value axis' limits; labeler(names, values) -> text names an axis' level
    (and labeler.title(names) the axis) where the default would not read well; names are
    the axis' groups of parameters with equal values, one value per group."""
    if isinstance(metrics, str):
        metrics = [metrics]
    points = results.written_points() if points is None else list(points)
    layout = Layout(results, points, roles, labeler=labeler)
    per_metric_columns = len(metrics) > 1
    if per_metric_columns and layout.cols is not None:
        raise ValueError("metric_figure: several metrics need a layout without panel columns")
    rows, cols = layout.shape()
    if per_metric_columns:
        cols = len(metrics)
    horizontal = layout.x is not None and not layout.x.numeric and (
        len(layout.x) > 8 or max(len(layout.x.label(i)) for i in range(len(layout.x))) > 10)
    n_lines = (len(layout.hue) if layout.hue else 1) * (len(layout.style) if layout.style else 1)
    extra_w = 0.0
    if horizontal:
        panel_w, panel_h = 3.6, max(2.4, 0.22 * len(layout.x) * (1 + 0.15 * (n_lines - 1)) + 0.8)
        # Room for the category labels left of the first column (7.5 pt: about 0.065 in a character).
        extra_w = 0.065 * max(len(layout.x.label(i)) for i in range(len(layout.x)))
    else:
        panel_w, panel_h = 4.3, 3.1
    fig, axes = _new_figure(rows, cols, panel_w, panel_h, sharey=horizontal, extra_w=extra_w)
    notes, extra_legend = [], {}
    replicas = int(results.done_replicas[points].sum(axis=1).max()) if points else 0
    for m_index, metric in enumerate(metrics):
        summary = _Summary(results, metric, points)
        notes += _metric_nonfinite(results, metric, summary, points)
        scale = value_scale or _value_scale(summary.finite_values())
        for (r, c), ax in np.ndenumerate(axes):
            panel = [p for p in points if layout.panel_of(p) == (r, 0 if per_metric_columns else c)]
            if per_metric_columns and c != m_index:
                continue
            if not panel:
                ax.set_axis_off()
                continue
            _draw_metric_panel(ax, layout, summary, panel, horizontal, scale, extra_legend)
            _value_limits(ax, metric, summary, scale, horizontal)
            label = value_label(metric) if value_label else metric
            if horizontal:
                ax.set_xlabel(label)
            else:
                ax.set_ylabel(label)
            ptitle = layout.panel_title(r, c if not per_metric_columns else 0)
            if per_metric_columns:
                ptitle = metric + (" (%s)" % ptitle if ptitle else "")
            ax.set_title(_wrap(ptitle, 60), fontsize=9)
            if references is not None:
                _keeping_limits(ax, lambda: [extra_legend.setdefault(lbl, h)
                                             for h, lbl in references(ax, metric, panel) or ()])
            ax.grid(True, which="major", alpha=0.3)
    layout.legend(fig, [(h, lbl) for lbl, h in extra_legend.items()])
    what = "median and range over %d replicas" % replicas if replicas > 1 else "one replica"
    name = ", ".join(metrics)
    fig.suptitle(_wrap(title or "%s: %s (%s)" % (results.experiment, name, what)), fontsize=10)
    constants = _constants_text(results, points, layout.shown())
    if constants:
        fig.text(0.5, -0.01, _wrap("fixed: " + constants, 140), ha="center", va="top", fontsize=7.5, color="0.3")
    meaning = "; ".join("%s: %s" % (m, results.meanings.get(m, "")) for m in metrics)
    return _finish(fig, caption or "%s. %s, %s." % (meaning, _where_text(layout, horizontal), what),
                   [(h, lines, "drawn as x on the panel's %s edge" % ("right" if horizontal else "top"))
                    for h, lines in notes])


def _value_limits(ax, metric, summary, scale, horizontal):
    """Fractions on a linear axis that reach a quarter span [0, 1] in every panel (smaller
    ones keep a scale they can be read on); a symmetric-log axis of values >= 0 starts at 0."""
    values = summary.finite_values()
    get, set_ = (ax.get_xlim, ax.set_xlim) if horizontal else (ax.get_ylim, ax.set_ylim)
    if scale[0] == "linear" and metric.startswith("frac") and values and min(values) >= 0 \
            and 0.25 <= max(values) <= 1:
        set_(-0.04, 1.04)
    elif scale[0] == "symlog" and values and min(values) >= 0:
        set_(0, get()[1])


def _where_text(layout, horizontal):
    parts = []
    if layout.x is not None:
        parts.append("%s on the %s axis" % (layout.x.title(), "vertical" if horizontal else "horizontal"))
    if layout.hue is not None:
        parts.append("colour: %s" % layout.hue.title())
    if layout.style is not None:
        parts.append("line style: %s" % layout.style.title())
    if layout.cols is not None or layout.extra_rows:
        parts.append("panels: %s" % ", ".join(a.title() for a in ([layout.cols] if layout.cols else [])
                                               + layout.extra_rows))
    text = "; ".join(parts)
    return text[0].upper() + text[1:] if text else "All points"


def _keeping_limits(ax, draw):
    """Draws reference lines without letting them stretch the axes."""
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    draw()
    ax.set_xlim(xlim)
    ax.set_ylim(ylim)


def _draw_metric_panel(ax, layout, summary, panel, horizontal, scale, legend):
    lines = {}
    for p in panel:
        lines.setdefault(layout.line_key(p), []).append(p)
    n_lines = max(1, (len(layout.hue) if layout.hue else 1) * (len(layout.style) if layout.style else 1))
    for key, pts in sorted(lines.items()):
        color = layout.color(key)
        slot = key[0] * (len(layout.style) if layout.style else 1) + key[1]
        if layout.x is not None and layout.x.numeric:
            pts = sorted(pts, key=lambda p: layout.x.level_of[p])
            x = np.array([float(layout.x.value(layout.x.level_of[p])) for p in pts])
            ok = np.array([not summary.nonfinite[p] for p in pts])
            y = np.array([summary.median[p] if not summary.nonfinite[p] else np.nan for p in pts])
            low = np.array([summary.low.get(p, np.nan) for p in pts])
            high = np.array([summary.high.get(p, np.nan) for p in pts])
            ax.plot(x, y, color=color, ls=layout.linestyle(key), marker=layout.marker(key), ms=3.5, lw=1.4,
                    label=layout.line_label(key))
            if (ok & (high > low)).any():
                ax.fill_between(x, np.where(ok, low, np.nan), np.where(ok, high, np.nan), color=color, alpha=0.18,
                                lw=0)
            _edge_marks(ax, x[~ok], False, color, slot)
            if (~ok).any():
                legend.setdefault("inf/NaN in some replica", _nonfinite_handle())
        else:
            offset = (slot - (n_lines - 1) / 2) * (0.7 / n_lines) if n_lines > 1 else 0.0
            pos = np.array([(layout.x.level_of[p] if layout.x is not None else 0) + offset for p in pts], float)
            ok = np.array([not summary.nonfinite[p] for p in pts])
            y = np.array([summary.median.get(p, np.nan) for p in pts])
            low = np.array([summary.low.get(p, np.nan) for p in pts])
            high = np.array([summary.high.get(p, np.nan) for p in pts])
            err = [np.maximum(y - low, 0)[ok], np.maximum(high - y, 0)[ok]]
            if horizontal:
                ax.errorbar(y[ok], pos[ok], xerr=err, fmt=layout.marker(key), color=color, ms=4, capsize=2, lw=1,
                            label=layout.line_label(key))
            else:
                ax.errorbar(pos[ok], y[ok], yerr=err, fmt=layout.marker(key), color=color, ms=4, capsize=2, lw=1,
                            label=layout.line_label(key))
            _edge_marks(ax, pos[~ok], horizontal, color)
            if (~ok).any():
                legend.setdefault("inf/NaN in some replica", _nonfinite_handle())
    _apply_value_scale(ax, scale, "x" if horizontal else "y")
    if layout.x is None:
        ax.set_xticks([])
    elif layout.x.numeric:
        _set_numeric_x(ax, [layout.x.value(i) for i in range(len(layout.x))], layout.x.name)
    else:
        ticks = range(len(layout.x))
        labels = [layout.x.label(i) for i in ticks]
        if horizontal:
            ax.set_yticks(list(ticks))
            ax.set_yticklabels(labels, fontsize=7.5)
            ax.set_ylim(len(layout.x) - 0.5, -0.5)
            if ax.get_subplotspec().is_first_col():
                ax.set_ylabel(_wrap(layout.x.title(), 50))
        else:
            ax.set_xticks(list(ticks))
            ax.set_xticklabels(labels, fontsize=8, rotation=30 if max(map(len, labels)) > 5 else 0,
                               ha="right" if max(map(len, labels)) > 5 else "center")
            ax.set_xlim(-0.5, len(layout.x) - 0.5)
            ax.set_xlabel(layout.x.title())


def _nonfinite_handle():
    return Line2D([], [], color="0.2", marker="x", ls="none", ms=7, mew=1.6)


def metric_kinds(results, points):
    """The metrics over the written replicas of `points`, in three lists: NaN everywhere
    (names), one value everywhere ((name, value) pairs), and the rest, worth showing."""
    all_nan, constant, shown = [], [], []
    for name in results.metrics:
        v = np.concatenate([_replica_values(results, name, p) for p in points]) if points else np.array([])
        if not len(v) or np.isnan(v).all():
            all_nan.append(name)
        elif np.isfinite(v).all() and (v == v[0]).all():
            constant.append((name, v[0]))
        else:
            shown.append(name)
    return all_nan, constant, shown


def _drawable_metrics(results, points, exclude=()):
    """Metrics worth a figure: not NaN everywhere, not one value everywhere."""
    return [name for name in metric_kinds(results, points)[2] if name not in exclude]


# ---------------------------------------------------------------------------------------
# Traces

def _trace_rows(results, trace, p):
    """x [T'] and the written replicas' y [R', T'] of point p's trace, padding cut."""
    x, y = results.traces[trace]
    keep = ~np.isnan(x[p])
    return x[p][keep], y[p][results.done_replicas[p]][:, keep]


def trace_figure(results, trace, points=None, roles=None, references=None, title=None, y_label=None,
                 value_scale=None, caption=None, x_label=None, smooth=False, labeler=None, drawstyle="default"):
    """A trace against its x axis (step, k, bn_layer), median and range over replicas, the
    grid's axes as colours, styles and panels. references(ax, panel_points) draws
    reference lines and returns legend entries. smooth: a noisy trace (a batch loss) is
    drawn as its running mean over 1/50 of its length (said in the title); drawstyle
    "steps-post" for a value that holds until the next sample (a loss scale)."""
    points = [p for p in (results.written_points() if points is None else points)
              if len(_trace_rows(results, trace, p)[0])]
    if not points:
        return None
    layout = Layout(results, points, roles, x_is_trace=True, labeler=labeler)
    window = max(1, max(len(_trace_rows(results, trace, p)[0]) for p in points) // 50) if smooth else 1
    rows, cols = layout.shape()
    fig, axes = _new_figure(rows, cols, 4.3, 3.1)
    x_name = results.trace_x[trace]
    extra_legend, bad = {}, {}
    all_values = []
    for p in points:
        _, y = _trace_rows(results, trace, p)
        all_values.append(y[np.isfinite(y)])
    # Traces are running values (a sum, a loss): linear unless they span four decades.
    scale = value_scale or _value_scale(np.concatenate(all_values), decades=4)
    if scale[0] == "symlog" and trace_zero_only_at_start(results, trace, points):
        scale = ("log", None)
    for (r, c), ax in np.ndenumerate(axes):
        panel = [p for p in points if layout.panel_of(p) == (r, c)]
        if not panel:
            ax.set_axis_off()
            continue
        for p in panel:
            key = layout.line_key(p)
            color = layout.color(key)
            x, y = _trace_rows(results, trace, p)
            finite_runs = np.isfinite(y).all(axis=0)
            if not finite_runs.all():
                first = x[np.argmin(finite_runs)]
                _edge_marks(ax, [first], False, color, key[0] * (len(layout.style) if layout.style else 1) + key[1])
                extra_legend.setdefault("first inf/NaN (some replica)", _nonfinite_handle())
                bad[p] = first
            if window > 1 and len(x) >= window:
                x, y = _running_mean(x, window), np.array([_running_mean(row, window) for row in y])
                finite_runs = np.isfinite(y).all(axis=0)
            med = np.where(finite_runs, np.median(np.where(np.isfinite(y), y, 0), axis=0), np.nan)
            if scale[0] == "log":
                med = np.where(med > 0, med, np.nan)
            ax.plot(x, med, color=color, ls=layout.linestyle(key), lw=1.3, label=layout.line_label(key),
                    drawstyle=drawstyle)
            if y.shape[0] > 1:
                low = np.where(finite_runs, np.min(np.where(np.isfinite(y), y, 0), axis=0), np.nan)
                high = np.where(finite_runs, np.max(np.where(np.isfinite(y), y, 0), axis=0), np.nan)
                if scale[0] == "log":
                    low = np.where(low > 0, low, np.nan)
                ax.fill_between(x, low, high, color=color, alpha=0.18, lw=0,
                                step="post" if drawstyle == "steps-post" else None)
        _apply_value_scale(ax, scale, "y")
        ax.set_xlabel(x_label or AXIS_LABELS.get(x_name, x_name))
        ax.set_ylabel(y_label or trace)
        ax.set_title(_wrap(layout.panel_title(r, c), 60), fontsize=9)
        if references is not None:
            _keeping_limits(ax, lambda: [extra_legend.setdefault(lbl, h) for h, lbl in references(ax, panel) or ()])
        ax.grid(True, alpha=0.3)
    layout.legend(fig, [(h, lbl) for lbl, h in extra_legend.items()], markers=False)
    replicas = int(results.done_replicas[points].sum(axis=1).max())
    what = "median and range over %d replicas" % replicas if replicas > 1 else "one replica"
    if window > 1:
        what += ", running mean over %d %ss" % (window, x_name)
    fig.suptitle(_wrap(title or "%s: %s (%s)" % (results.experiment, trace, what)), fontsize=10)
    constants = _constants_text(results, points, layout.shown())
    if constants:
        fig.text(0.5, -0.01, _wrap("fixed: " + constants, 140), ha="center", va="top", fontsize=7.5, color="0.3")
    notes = []
    if bad:
        header = "%d of %d points have a non-finite %s trace (inf or NaN in some replica)" % (len(bad), len(points),
                                                                                            trace)
        lines = ["  point %d (%s): first at %s %s" % (p, _point_text(results, p), x_name, _number(first))
                 for p, first in bad.items()]
        notes.append((header, lines, "the line stops there, x on the top edge"))
    if scale[0] == "log":
        extra = " Zeros (the trace's start) are not drawn on the log axis."
    else:
        extra = ""
    meaning = results.meanings.get(trace, "")
    return _finish(fig, caption or "%s: %s. %s, %s.%s" % (trace, meaning, _where_text(layout, False), what, extra),
                   notes)


def _running_mean(values, window):
    """Mean of each `window` consecutive values (len - window + 1 of them)."""
    return np.convolve(values, np.ones(window) / window, mode="valid")


def trace_zero_only_at_start(results, trace, points):
    """True when a trace's only zeros are at its first sample (an error trace from 0)."""
    for p in points:
        _, y = _trace_rows(results, trace, p)
        if (y[:, 1:] == 0).any():
            return False
    return True


# ---------------------------------------------------------------------------------------
# Format properties for reference lines

def _format_info(name):
    """roundoff.info(name) or None (block formats, unknown names)."""
    from . import info
    try:
        return info(str(name))
    except (ValueError, TypeError):
        return None


def _ref_handle(color, ls):
    return Line2D([], [], color=color, ls=ls, lw=1.1)


# ---------------------------------------------------------------------------------------
# Per experiment

def _swamping(results):
    out = []
    points = results.written_points()
    exact = {p: float(np.nanmean(_replica_values(results, "exact", p))) for p in points}

    def exact_running(ax, panel):
        # x_k = initial + k * addend exactly: a straight line to the exact final value.
        drawn = set()
        for p in panel:
            x, y = _trace_rows(results, "x", p)
            key = (x[0], x[-1], float(np.median(y[:, 0])), exact[p])
            if np.isfinite(exact[p]) and key not in drawn:
                drawn.add(key)
                start = key[2]
                running = start + (exact[p] - start) * (x - x[0]) / max(x[-1] - x[0], 1)
                if ax.get_yscale() != "linear":
                    running = np.where(running > 0, running, np.nan)
                ax.plot(x, running, color="k", ls="--", lw=0.9, label="exact sum")
        return [(_ref_handle("k", "--"), "exact sum")]

    if "x" in results.traces:
        fig = trace_figure(results, "x", points, roles={"cols": "format", "hue": "rounding"}, references=exact_running,
                           y_label="x (running value)",
                           caption="The running value x after each step (median over replicas, band: their range), "
                                   "a panel per format; dashed: the exact sum of the rounded addend.")
        if fig is not None:
            out.append(("trace", fig))
    out.append(("finals", _swamping_finals(results, points, exact)))
    # stagnation_step (-1: never stagnated) is a number per point, left to the tables.
    for metric in _drawable_metrics(results, points, exclude=("final", "exact", "abs_error", "stagnation_step")):
        out.append((metric, metric_figure(results, metric, points)))
    return out


def _swamping_finals(results, points, exact):
    layout = Layout(results, points, {"cols": "format", "hue": "rounding"}, x_is_trace=True)
    rows, cols = layout.shape()
    fig, axes = _new_figure(rows, cols, 4.3, 3.1)
    notes_points = []
    for (r, c), ax in np.ndenumerate(axes):
        panel = [p for p in points if layout.panel_of(p) == (r, c)]
        if not panel:
            ax.set_axis_off()
            continue
        values = np.concatenate([_replica_values(results, "final", p) for p in panel])
        finite = values[np.isfinite(values)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
        pad = max(hi - lo, abs(hi) * 1e-6, 1e-12) * 0.05
        bins = np.linspace(lo - pad, hi + pad, 41)
        n_bad = 0
        for p in panel:
            v = _replica_values(results, "final", p)
            key = layout.line_key(p)
            ax.hist(v[np.isfinite(v)], bins=bins, color=layout.color(key), alpha=0.55,
                    histtype="stepfilled", edgecolor=layout.color(key), linestyle=layout.linestyle(key))
            if not np.isfinite(v).all():
                notes_points.append(p)
                n_bad += int((~np.isfinite(v)).sum())
        for value in sorted(set(exact[p] for p in panel if np.isfinite(exact[p]))):
            ax.axvline(value, color="k", ls="--", lw=0.9, label="exact sum")
        ax.set_title(layout.panel_title(r, c) + (" (%d non-finite, not binned)" % n_bad if n_bad else ""), fontsize=9)
        ax.set_xlabel("final x")
        ax.set_ylabel("replicas")
        ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        ax.xaxis.set_major_formatter(ticker.ScalarFormatter(useOffset=False))
        ax.tick_params(axis="x", labelsize=7.5)
        ax.grid(True, alpha=0.3)
    layout.legend(fig, [(_ref_handle("k", "--"), "exact sum")], markers=False)
    replicas = int(results.done_replicas[points].sum(axis=1).max())
    fig.suptitle("swamping: final x over %d replicas" % replicas, fontsize=10)
    notes = []
    if notes_points:
        header = "%d of %d points have non-finite final (inf or NaN in some replica; e.g. overflow)" % (
            len(notes_points), len(points))
        notes.append((header, nonfinite_lines(results, "final", lambda p: _replica_values(results, "final", p),
                                              notes_points), "counted in the panel title, not binned"))
    return _finish(fig, "Histogram of the final x over the replicas, a panel per format; dashed: the exact sum. "
                        "Inf and NaN finals cannot be binned: the panel title counts them.", notes)


def _bound_lines(ax, n_values, u, label_suffix=""):
    """n u and sqrt(n) u over the panel's n range."""
    n = np.geomspace(min(n_values), max(n_values), 50)
    ax.plot(n, n * u, color="0.35", ls="--", lw=1, label="n·u" + label_suffix)
    ax.plot(n, np.sqrt(n) * u, color="0.35", ls=":", lw=1.2, label="√n·u" + label_suffix)
    return [(_ref_handle("0.35", "--"), "n·u" + label_suffix), (_ref_handle("0.35", ":"), "√n·u" + label_suffix)]


def _summation(results):
    points = results.written_points()
    out = []

    def bounds(ax, metric, panel):
        formats = set(results.points["format"][panel].tolist())
        if len(formats) != 1:
            return []
        info = _format_info(formats.pop())
        if info is None:
            return []
        return _bound_lines(ax, results.points["n"][panel], info["unit_roundoff"])

    roles = {"x": "n", "cols": "format", "rows": "series", "hue": "rounding", "style": "algorithm"}
    if "rel_error" in results.metrics:
        out.append(("rel_error", metric_figure(
            results, "rel_error", points, roles=roles, references=bounds,
            caption="Relative error |computed - exact| / |exact| of the sum against the number of terms n (median "
                    "over replicas, band: their range), a panel per series and format; dashed n·u and dotted √n·u "
                    "with u the format's unit roundoff: the worst-case and the typical growth of recursive "
                    "summation's error (exact results, error 0, sit at the bottom of the symmetric-log axis).")))
    if "sum" in results.traces:
        exact = {p: float(np.nanmean(_replica_values(results, "exact", p))) for p in points}

        def exact_line(ax, panel):
            for value in sorted(set(exact[p] for p in panel if np.isfinite(exact[p]))):
                ax.axhline(value, color="k", ls="--", lw=0.9, label="exact sum")
            return [(_ref_handle("k", "--"), "exact sum")]

        roles_trace = {k: v for k, v in roles.items() if k != "x"}
        fig = trace_figure(results, "sum", points, roles=roles_trace, references=exact_line, y_label="running sum",
                           caption="The running sum after k terms (median over replicas, band: their range); "
                                   "dashed: the exact sum of the rounded terms at the end (the mean over replicas "
                                   "where the terms are random).")
        if fig is not None:
            out.append(("trace", fig))
    for metric in _drawable_metrics(results, points, exclude=("rel_error", "abs_error", "final", "exact", "n",
                                                              "stagnation_step")):
        out.append((metric, metric_figure(results, metric, points, roles=roles)))
    return out


def _matmul_accum(results):
    points = results.written_points()
    roles = {"x": "K"}

    def bounds(ax, metric, panel):
        # bound_det = K u for the point's output format: one pair of lines per distinct u.
        entries = []
        us = {}
        for p in panel:
            k = float(results.points["K"][p])
            u = float(np.nanmedian(_replica_values(results, "bound_det", p))) / k
            us.setdefault(u, []).append(k)
        for i, (u, ks) in enumerate(sorted(us.items())):
            exponent = math.log2(u) if u > 0 else float("nan")
            text = (" (u = $2^{%d}$)" % round(exponent) if abs(exponent - round(exponent)) < 1e-9
                    else " (u = %g)" % u)
            gray = str(0.2 + 0.3 * i)
            k = np.geomspace(min(ks), max(ks), 50)
            ax.plot(k, k * u, color=gray, ls="--", lw=1, label="K·u" + text)
            ax.plot(k, np.sqrt(k) * u, color=gray, ls=":", lw=1.2, label="√K·u" + text)
            entries += [(_ref_handle(gray, "--"), "K·u" + text), (_ref_handle(gray, ":"), "√K·u" + text)]
        return entries

    out = []
    wanted = [m for m in ("mean_rel_error", "max_rel_error") if m in results.metrics]
    if wanted and "K" in results.varying():
        out.append(("error_vs_K", metric_figure(
            results, wanted, points, roles=roles, references=bounds if "bound_det" in results.metrics else None,
            value_label=lambda m: "relative error",
            title="matmul_accum: relative error of C = A B against K per unit (median and range over replicas)",
            caption="Mean (left) and largest (right) relative error of the elements of C = A B against the inner "
                    "dimension K, a line per unit (and rounding); dashed K·u and dotted √K·u with u the unit "
                    "roundoff of each unit's output format (the deterministic and the probabilistic bound). "
                    "Every unit multiplies the same matrices.")))
        covered = set(wanted) | {"bound_det", "bound_prob"}
    else:
        covered = set()
    for metric in _drawable_metrics(results, points, exclude=covered):
        out.append((metric, metric_figure(results, metric, points, roles=roles if "K" in results.varying() else None)))
    return out


def _updates(results):
    points = results.written_points()
    out = []
    if "error" in results.traces:
        fig = trace_figure(results, "error", points, roles={"hue": "update"}, y_label="mean |w - w_fp64|",
                           caption="Mean absolute difference between the weights and the fp64 trajectory after "
                                   "each step, a line per update strategy (median over replicas, band: their "
                                   "range).")
        if fig is not None:
            out.append(("error", fig))
    wanted = [m for m in ("drift", "frac_lost") if m in results.metrics]
    layout_roles = {"hue": "weight_format"} if "weight_format" in results.varying() else None
    if len(wanted) == 2 and _fits_metric_columns(results, points, layout_roles):
        out.append(("drift", metric_figure(
            results, wanted, points, roles=layout_roles,
            caption="drift: sum |w - w_fp64| / sum |w_fp64 - w0| at the end (1: as if no update had happened); "
                    "frac_lost: the share of non-zero updates that left the stored state unchanged.")))
        covered = set(wanted)
    else:
        covered = set()

    def fp64_reference(ax, metric, panel):
        if "final_fp64" not in results.metrics:
            return []
        value = np.nanmedian(np.concatenate([_replica_values(results, "final_fp64", p) for p in panel]))
        if ax.get_xaxis().get_label().get_text() == metric:
            ax.axvline(value, color="k", ls="--", lw=0.9, label="fp64 trajectory")
        else:
            ax.axhline(value, color="k", ls="--", lw=0.9, label="fp64 trajectory")
        return [(_ref_handle("k", "--"), "fp64 trajectory")]

    for metric in _drawable_metrics(results, points, exclude=covered | {"final_fp64"}):
        out.append((metric, metric_figure(results, metric, points, roles=layout_roles,
                                          references=fp64_reference if metric == "final" else None)))
    return out


def _fits_metric_columns(results, points, roles):
    return Layout(results, points, roles).cols is None


def _grad_underflow(results):
    points = results.written_points()
    out = []
    covered = set()
    wanted = [m for m in ("frac_underflow", "frac_overflow", "frac_subnormal") if m in results.metrics]
    if "scale" in results.varying() and _fits_metric_columns(results, points, {"x": "scale", "hue": "format"}):
        covered.update(wanted)
        out.append(("lost", metric_figure(
            results, wanted, points, roles={"x": "scale", "hue": "format"},
            value_label=lambda m: "fraction of non-zero gradients",
            title="grad_underflow: gradients lost to zero, overflowed and subnormal after scaling by S",
            caption="The fractions of the non-zero fp32 gradients that become 0 (underflow), inf or NaN "
                    "(overflow) or subnormal in each format after multiplying by the loss scale S, against S "
                    "(a line per format; 0 is drawn at 0 on the symmetric-log axis).")))
    if "grad_hist" in results.traces:
        out.append(("hist", _grad_underflow_hist(results, points)))
    for metric in _drawable_metrics(results, points, exclude=covered):
        out.append((metric, metric_figure(results, metric, points)))
    return out


def _log2_histogram(x, y):
    """From a grad_hist row (x = -41 zeros, e = -40..15, 16 non-finite) the fractions of
    zeros, per bin e and non-finite."""
    zero = float(y[x == -41].sum())
    nonfinite = float(y[x == 16].sum())
    bins = (x >= -40) & (x <= 15)
    return zero, x[bins], y[bins], nonfinite


RANGE_STYLE = (("min_subnormal", "least subnormal", "C3", "--"), ("min_normal", "least normal", "C1", ":"),
               ("max", "largest", "C4", "-."))


def _format_range_lines(ax, info, lo, hi, shift=0.0):
    """Vertical lines at log2 of the format's least subnormal, least normal and largest
    value (shifted by -log2 S: where they fall on unscaled gradients), within [lo, hi]."""
    entries = []
    for key, name, color, ls in RANGE_STYLE:
        value = info.get(key)
        if not value or (key == "min_subnormal" and not info.get("subnormals", True)):
            continue
        e = math.log2(value) - shift
        if lo <= e <= hi:
            ax.axvline(e, color=color, ls=ls, lw=1.2, label=name)
            entries.append((_ref_handle(color, ls), name))
    return entries


def _grad_underflow_hist(results, points):
    formats = list(dict.fromkeys(results.points["format"][points].tolist()))
    cols = len(formats) if len(formats) <= 3 else math.ceil(len(formats) / 2)
    rows = math.ceil(len(formats) / cols)
    fig, axes = _new_figure(rows, cols, 4.3, 3.1, sharex=True, sharey=True)
    legend = {}
    scales = results.points["scale"]
    histograms = {}
    for fmt in formats:
        # The histogram is of the fp32 gradients, before scaling: the same at every S.
        smallest = min((p for p in points if results.points["format"][p] == fmt), key=lambda p: scales[p])
        x, y = _trace_rows(results, "grad_hist", smallest)
        histograms[fmt] = (smallest, _log2_histogram(x, y.mean(axis=0)))
    nonzero = np.concatenate([e[frac > 0] for _, (_, e, frac, _) in histograms.values()])
    lo, hi = (nonzero.min() - 4, nonzero.max() + 5) if len(nonzero) else (-30, 16)
    infos = {fmt: _format_info(fmt) for fmt in formats}
    for info in infos.values():
        # Widen to the formats' least subnormal and largest value where they fall in the bins.
        if info is not None and info.get("min_subnormal") and math.log2(info["min_subnormal"]) >= -40:
            lo = min(lo, math.floor(math.log2(info["min_subnormal"])) - 3)
        if info is not None and math.log2(info["max"]) <= 16:
            hi = max(hi, math.ceil(math.log2(info["max"])) + 1)
    for ax, fmt in zip(axes.flat, formats):
        smallest, (zero, e, frac, nonfinite) = histograms[fmt]
        ax.bar(e + 0.5, frac, width=1.0, color="C0", alpha=0.7, edgecolor="C0")
        info = infos[fmt]
        outside = []
        if info is not None:
            for handle, label in _format_range_lines(ax, info, lo, hi):
                legend.setdefault(label, handle)
            for key, name, _, _ in RANGE_STYLE:
                value = info.get(key)
                if value and not lo <= math.log2(value) <= hi:
                    outside.append("%s 2^%.3g" % (name, math.log2(value)))
            sub = info.get("min_subnormal") if info.get("subnormals", True) else None
            below = math.log2(sub or info["min_normal"]) - 1
            if below > lo:
                ax.axvspan(lo, below, color="C3", alpha=0.08)
        S = float(scales[smallest])
        lost = np.nanmedian(_replica_values(results, "frac_underflow", smallest)) \
            if "frac_underflow" in results.metrics else np.nan
        text = "S = %s: %.3g%% lost to 0" % (_number(S), 100 * lost)
        if zero:
            text += "\n%.3g%% already 0 in fp32" % (100 * zero)
        if nonfinite:
            text += "\n%.3g%% inf/NaN" % (100 * nonfinite)
        if outside:
            text += "\noff the axis: " + ", ".join(outside)
        ax.text(0.02, 0.97, text, transform=ax.transAxes, va="top", fontsize=7,
                bbox=dict(boxstyle="round", fc="white", ec="0.7", alpha=0.9))
        ax.set_xlim(lo, hi)
        ax.set_title(fmt, fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(formats):]:
        ax.set_axis_off()
    for ax in axes[-1]:
        ax.set_xlabel("log2 |gradient| (fp32, unscaled)")
    for row in axes:
        row[0].set_ylabel("fraction of gradients")
    legend["rounds to 0 unscaled"] = Patch(color="C3", alpha=0.15)
    fig.legend(list(legend.values()), list(legend.keys()), loc="upper left", bbox_to_anchor=(1.0, 1.0),
               frameon=False, fontsize=8)
    fig.suptitle(_wrap("grad_underflow: log2 histogram of the fp32 run's gradient magnitudes, each format's range "
                       "marked (scaling by S = 2^k moves the gradients k bins right)", 90), fontsize=10)
    return _finish(fig, "Histogram of log2 |g| over every gradient of the fp32 training run (bin e holds "
                        "[2^e, 2^(e+1)); the end bins are clamped), with each format's least subnormal, least "
                        "normal and largest value; the shaded part (below half the least subnormal) rounds to 0 "
                        "unscaled. The box gives the share lost to zero at the smallest S of the sweep.")


# ---------------------------------------------------------------------------------------
# train

TRAIN_GROUPS = (
    ("accuracy", ("final_train_acc", "final_test_acc")),
    ("loss_final", ("final_train_loss", "final_test_loss")),
    ("fp64_eval", ("final_train_acc_fp64", "final_test_acc_fp64")),
    ("updates", ("frac_lost_updates", "frac_values_changed")),
    ("overflow", ("skipped_steps", "nonfinite_grad_steps", "final_loss_scale")),
    ("replicas", ("replica_max_ulp_diff", "replica_frac_differ")),
    ("batch_norm", ("bn_scale_unchanged", "bn_shift_unchanged", "bn_scale_std_min")),
)


def _train(results):
    points = results.written_points()
    out = []
    roles = {"hue": "update"} if "update" in results.varying() else None
    if "loss" in results.traces:
        fig = trace_figure(results, "loss", points, roles=roles, y_label="mean batch loss", smooth=True,
                           caption="The mean training loss of each step's batch (as computed, in the model's "
                                   "arithmetic), a line per update strategy: median over replicas of the "
                                   "running mean over 1/50 of the run (band: the replicas' range).")
        if fig is not None:
            out.append(("loss", fig))
    if "loss_scale" in results.traces:
        changing = [p for p in points if _varies_over_steps(results, "loss_scale", p)]
        if changing:
            fig = trace_figure(results, "loss_scale", changing, roles=roles, y_label="loss scale S",
                               value_scale=("log2", None), drawstyle="steps-post",
                               caption="The loss scale of each step where it changed during the run (dynamic "
                                       "loss scaling: halved after a non-finite gradient, doubled after "
                                       "ls_interval good steps).")
            if fig is not None:
                out.append(("loss_scale", fig))
    layers = [t[len("grad_hist_"):] for t in results.traces if t.startswith("grad_hist_")
              and any(len(_trace_rows(results, t, p)[0]) for p in points)]
    if layers:
        out.append(("hist", _train_hist(results, points, layers)))
        for layer in layers:
            out.append(("hist_" + layer, _train_heatmap(results, points, layer)))
    for trace in ("bn_scale_std", "bn_scale_unchanged"):
        if trace in results.traces and any(len(_trace_rows(results, trace, p)[0]) > 1 for p in points):
            fig = trace_figure(results, trace, points, roles=roles)
            if fig is not None:
                out.append((trace, fig))
    drawable = _drawable_metrics(results, points)
    covered = set()
    # A numeric x (at least three values: lr, epochs, ...) with a line per update strategy;
    # else the axis with most values on x (the update strategies, or a zip of setups).
    numeric = [a for a in grid_axes(results, points) if a.numeric and len(a) >= 3]
    roles = roles if numeric else None
    for suffix, group in TRAIN_GROUPS:
        metrics = [m for m in group if m in drawable]
        if not metrics:
            continue
        if len(metrics) > 1 and not _fits_metric_columns(results, points, roles):
            continue
        out.append((suffix, metric_figure(results, metrics, points, roles=roles)))
        covered.update(metrics)
    for metric in drawable:
        if metric not in covered:
            out.append((metric, metric_figure(results, metric, points, roles=roles)))
    return out


def _varies_over_steps(results, trace, p):
    _, y = _trace_rows(results, trace, p)
    finite = y[np.isfinite(y)]
    return len(finite) > 0 and finite.min() != finite.max()


def _train_hist_rows(results, trace, p):
    """steps [S] and the replica-mean fractions [S, 58] of a train gradient histogram."""
    x, y = _trace_rows(results, trace, p)
    records = len(x) // 58
    steps = x[::58][:records]
    return steps, y.mean(axis=0)[:records * 58].reshape(records, 58)


def _grad_format(results, p):
    """The format the point's gradients are computed in (update fp32: every tensor fp32)."""
    if "update" in results.points and results.points["update"][p] == "fp32":
        return "fp32"
    return str(results.points["grad_format"][p]) if "grad_format" in results.points else "fp32"


def _atlas(results, points, panel_w, panel_h):
    """Small multiples with a panel per point. Up to four points: one row, each panel titled
    with its point. Else a facet grid: a row per value of the grid's largest axis (named
    right of the row) and a column per combination of the others (named above the top
    row) when there are at most six of those; beyond that, rows of four titled panels.
    Returns the figure, the panels, point -> (row, col)."""
    axes = sorted(grid_axes(results, points), key=len, reverse=True)
    names = [n for a in axes for n in a.params()]
    facet = None
    if len(points) > 4 and axes:
        row_axis, others = axes[0], axes[1:]
        col_keys = list(dict.fromkeys(tuple(a.level_of[p] for a in others) for p in points))
        if len(col_keys) <= 6:
            facet = (row_axis, others, col_keys)
    if facet is None:
        cols = min(4, len(points))
        rows = math.ceil(len(points) / cols)
        where = {p: divmod(i, cols) for i, p in enumerate(points)}
    else:
        row_axis, others, col_keys = facet
        rows, cols = len(row_axis), len(col_keys)
        where = {p: (row_axis.level_of[p], col_keys.index(tuple(a.level_of[p] for a in others))) for p in points}
    fig, grid = _new_figure(rows, cols, panel_w, panel_h, sharex=True, sharey=True)
    for (r, c), ax in np.ndenumerate(grid):
        if (r, c) not in where.values():
            ax.set_axis_off()
    if facet is None:
        for p in points:
            grid[where[p]].set_title(_wrap(_point_text(results, p, names), 48), fontsize=7)
    else:
        for c, key in enumerate(col_keys):
            grid[0][c].set_title(_wrap(", ".join(a.label(i) for a, i in zip(others, key)), 48), fontsize=7.5)
        for r in range(rows):
            grid[r][-1].annotate(_wrap(row_axis.label(r), 26), xy=(1.04, 0.5), xycoords="axes fraction",
                                 ha="left", va="center", fontsize=7.5)
    return fig, grid, where


def _bottom_legend(fig, legend):
    if legend:
        fig.legend(list(legend.values()), list(legend.keys()), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   frameon=False, fontsize=8, ncol=min(4, len(legend)))


def _train_hist(results, points, layers):
    fig, grid, where = _atlas(results, points, 3.0, 2.0)
    legend = {}
    for p in points:
        ax = grid[where[p]]
        notes = []
        for i, layer in enumerate(layers):
            steps, h = _train_hist_rows(results, "grad_hist_" + layer, p)
            if not len(steps):
                continue
            pooled = h.mean(axis=0)
            ax.stairs(pooled[1:57], np.arange(-40, 17), color="C%d" % i, lw=1.2, label=layer)
            legend.setdefault(layer, Line2D([], [], color="C%d" % i, lw=1.3))
            notes.append("%s %.2g%%" % (layer, 100 * pooled[0])
                         + (" (inf/NaN %.2g%%)" % (100 * pooled[57]) if pooled[57] else ""))
        info = _format_info(_grad_format(results, p))
        if info is not None:
            for handle, label in _format_range_lines(ax, info, -40, 16):
                legend.setdefault(label + " of the gradient format", handle)
        box = ax.text(0.02, 0.96, "%s grads, = 0:\n%s" % (_grad_format(results, p), "\n".join(notes)),
                      transform=ax.transAxes, va="top", fontsize=6,
                      bbox=dict(boxstyle="round", fc="white", ec="0.7", alpha=0.85))
        box.set_in_layout(False)  # inside the panel: constrained layout need not make room for it
        ax.grid(True, alpha=0.3)
    for ax in grid[-1]:
        ax.set_xlabel("log2 |gradient × S|")
    for row in grid:
        row[0].set_ylabel("fraction")
    _set_hist_xlim(grid, results, points, layers)
    _bottom_legend(fig, legend)
    fig.suptitle("train: log2 histogram of the weight gradients (× S) per layer, over the recorded steps and the "
                 "replicas", fontsize=10)
    return _finish(fig, "The fraction of each layer's weight-gradient values (times the loss scale S) per log2 bin "
                        "[2^e, 2^(e+1)), pooled over the recorded steps (hist_every) and the replicas, a panel per "
                        "point; lines at the gradient format's least subnormal, least normal and largest value. "
                        "The box gives each layer's share of exact zeros (underflow or dead units) and of inf/NaN.")


def _set_hist_xlim(grid, results, points, layers):
    nz = []
    for p in points:
        for layer in layers:
            _, h = _train_hist_rows(results, "grad_hist_" + layer, p)
            if len(h):
                e = np.arange(-40, 16)[h[:, 1:57].sum(axis=0) > 0]
                nz += [e.min(), e.max()] if len(e) else []
    if nz:
        grid[0][0].set_xlim(max(-40, min(nz) - 4), min(16, max(nz) + 5))


def _train_heatmap(results, points, layer):
    trace = "grad_hist_" + layer
    points = [p for p in points if len(_trace_rows(results, trace, p)[0])]
    fig, grid, where = _atlas(results, points, 3.0, 2.1)
    positive = [h[h > 0].min() for h in (_train_hist_rows(results, trace, p)[1] for p in points) if (h > 0).any()]
    norm = mcolors.LogNorm(vmin=max(1e-6, min(positive) if positive else 1e-6), vmax=1)
    legend = {}
    image = None
    lo, hi = 16, -41
    for p in points:
        steps, h = _train_hist_rows(results, trace, p)
        e = np.arange(-40, 16)[h[:, 1:57].sum(axis=0) > 0]
        if len(e):
            lo, hi = min(lo, e.min()), max(hi, e.max())
    lo, hi = max(-40, lo - 3), min(16, hi + 4)
    for p in points:
        ax = grid[where[p]]
        steps, h = _train_hist_rows(results, trace, p)
        # Step edges halfway between recorded steps; rows: bins e (log2 |g|) from lo to hi,
        # the zero bin below and the non-finite bin above, each one row apart.
        edges = np.concatenate([[steps[0] - 0.5 * _step_gap(steps)], (steps[1:] + steps[:-1]) / 2,
                                [steps[-1] + 0.5 * _step_gap(steps)]])
        body = h[:, np.arange(lo, hi) + 41].T
        image = ax.pcolormesh(edges, np.arange(lo, hi + 1), np.ma.masked_less_equal(body, 0), norm=norm,
                              cmap="magma_r", shading="flat")
        for column, (y0, y1) in ((0, (lo - 2.5, lo - 1.5)), (57, (hi + 0.5, hi + 1.5))):
            ax.pcolormesh(edges, [y0, y1], np.ma.masked_less_equal(h[:, column:column + 1].T, 0), norm=norm,
                          cmap="magma_r", shading="flat")
            ax.axhspan(y0, y1, color="0.9", zorder=0)
        info = _format_info(_grad_format(results, p))
        if info is not None:
            for key, name, color, ls in RANGE_STYLE:
                value = info.get(key)
                if value and lo <= math.log2(value) <= hi:
                    ax.axhline(math.log2(value), color=color, ls=ls, lw=1.1, label=name)
                    legend.setdefault(name + " of the gradient format", _ref_handle(color, ls))
        ax.text(0.98, 0.04, _grad_format(results, p), transform=ax.transAxes, ha="right", fontsize=6.5, color="0.3")
        ax.set_ylim(lo - 2.5, hi + 1.5)
    # Bins every 5 (none next to the zero and non-finite rows), then those two rows.
    ticks = [lo - 2] + list(range(int(math.ceil((lo + 1) / 5) * 5), hi - 1, 5)) + [hi + 1]
    grid[0][0].set_yticks(ticks)
    grid[0][0].set_yticklabels(["0"] + [str(t) for t in ticks[1:-1]] + ["inf/NaN"])
    for ax in grid[-1]:
        ax.set_xlabel("step")
    for row in grid:
        row[0].set_ylabel("log2 |gradient × S|")
    if image is not None:
        bar = fig.colorbar(image, ax=grid, location="bottom", shrink=0.5, aspect=40, pad=0.02)
        bar.set_label("fraction of the layer's gradients (white: none)")
    _bottom_legend(fig, legend)
    fig.suptitle("train: layer %s's weight gradients (× S) over the steps, log2 histogram (mean over replicas)"
                 % layer, fontsize=10)
    return _finish(fig, "Heat map of layer %s's weight-gradient histogram over the training steps: column = a "
                        "recorded step (hist_every), row = the log2 bin [2^e, 2^(e+1)) of |gradient × S|, colour = "
                        "the fraction of the layer's gradients there (white: none); the bottom row (grey band) "
                        "counts exact zeros, the top row inf/NaN; lines at the gradient format's least subnormal, "
                        "least normal and largest value." % layer)


def _step_gap(steps):
    return float(np.min(np.diff(steps))) if len(steps) > 1 else 1.0


# ---------------------------------------------------------------------------------------
# norm_stats, block_quant, overflow_hunt

def _norm_stats(results):
    points = results.written_points()
    roles = {"x": "mean", "hue": "algorithm", "style": "length", "cols": "spread",
             "rows": ("accumulation", "overflow")}

    def full_error(ax, metric, panel):
        if metric.startswith("var_rel_error") or metric.startswith("mean_rel_error"):
            ax.axhline(1.0, color="k", ls="--", lw=0.9, label="error = 100%")
            return [(_ref_handle("k", "--"), "error = 100%")]
        return []

    return [(metric, metric_figure(results, metric, points, roles=roles, references=full_error))
            for metric in _drawable_metrics(results, points)]


def _block_quant(results):
    points = results.written_points()
    pts = results.points
    rne = [p for p in points if pts["rounding"][p] == "rne"]
    other = [p for p in points if pts["rounding"][p] != "rne"]
    out = []
    rne_roles = {"x": "format", "hue": "scale_rule", "cols": "distribution"}
    for metric, suffix, label in (("sqnr_db", "sqnr", "SQNR (dB), elements rne"),
                                  ("frac_saturated", "saturated", "fraction of elements saturated"),
                                  ("frac_flushed", "flushed", "fraction of non-zero values flushed to 0")):
        if rne and metric in results.metrics:
            out.append((suffix, metric_figure(results, metric, rne, roles=rne_roles, value_label=lambda m: label)))

    def zero(ax, metric, panel):
        ax.axhline(0, color="0.4", lw=0.9)
        return []

    if other and "rel_bias" in results.metrics:
        out.append(("bias", metric_figure(
            results, "rel_bias", other, roles={"x": "format", "hue": ("scale_rule", "rounding", "sr_bits"),
                                               "cols": "distribution"},
            references=zero, value_label=lambda m: "rel_bias (< 0: toward zero)", value_scale=("symlog", 1e-3),
            caption="rel_bias: mean of sign(x)(q - x) over the rms of x (negative: toward zero) of the element "
                    "roundings other than rne, per format (colour: scale rule, rounding and its random bits), a "
                    "panel per distribution; the axis is linear within ±0.001 and logarithmic beyond.")))
    return out


OVERFLOW_OPS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_scores", "attn_mask_add", "attn_softmax",
                "attn_context", "attn_o", "attn_residual_add", "ffn_norm", "ffn_wi_0", "ffn_wi_1", "ffn_gelu",
                "ffn_gate_mul", "ffn_wo", "ffn_residual_add", "final_norm")


# The port's fixes and the value at which each is off: labels name the fixes that are on.
FIXES_OFF = {"mask_scale": 1.0, "gelu_clamp": False, "residual_fp32": False, "wo_scale": 1, "clamp_inf": False}


def _hunt_label(groups, values):
    parts, fixes, has_fixes = [], [], False
    for group, value in zip(groups, values):
        for name in group:
            if name in FIXES_OFF:
                has_fixes = True
                if value != FIXES_OFF[name]:
                    fixes.append(name if isinstance(value, (bool, np.bool_)) else "%s=%s" % (name, _number(value)))
            elif name == "nanoo":
                parts.append("NANOO on" if value else "NANOO off")
            else:
                parts.append(_value_text(name, value))
    if has_fixes:
        parts.append(" + ".join(fixes) if fixes else "no fixes")
    return ", ".join(parts)


_hunt_label.title = lambda groups: "NANOO" if [n for g in groups for n in g] == ["nanoo"] else "configuration"


def _config_labels(results, points):
    axes = grid_axes(results, points, labeler=_hunt_label)
    return {p: ", ".join(a.label(a.level_of[p]) for a in axes) or "point %d" % p for p in points}


def _overflow_hunt(results):
    points = results.written_points()
    labels = _config_labels(results, points)
    out = []
    flags = [f for f in ("oflo", "inv", "div0")
             if any(np.nansum(_replica_values(results, "%s_total" % f, p)) > 0 for p in points
                    if "%s_total" % f in results.metrics)]
    if flags:
        out.append(("oflo", _op_heatmaps(results, points, labels, flags)))
    if any("max_abs_" + op in results.metrics for op in OVERFLOW_OPS):
        out.append(("max_abs", _max_abs_heatmap(results, points, labels)))
    covered = {m for m in results.metrics for prefix in ("oflo_", "inv_", "div0_", "max_abs_", "std_", "first_")
               if m.startswith(prefix)}
    for metric in _drawable_metrics(results, points, exclude=covered):
        out.append((metric, metric_figure(results, metric, points, labeler=_hunt_label)))
    return out


def _compact(value):
    """A magnitude in at most five characters: 0.5, 47, 950, 4.9k, 65.5k, 140k, 1.2M."""
    if not np.isfinite(value):
        return "inf" if np.isinf(value) else "NaN"
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return "%.3g%s" % (value / limit, suffix)
    return "%.2g" % value if abs(value) < 10 else "%d" % round(value)


def _group_separators(ax, results, points):
    """Lines between the rows where nanoo changes (the heat maps' two halves)."""
    if "nanoo" not in results.points:
        return
    values = results.points["nanoo"][points]
    for i in range(1, len(points)):
        if values[i] != values[i - 1]:
            ax.axhline(i - 0.5, color="k", lw=1.5)


def _op_heatmaps(results, points, labels, flags):
    ops = [op for op in OVERFLOW_OPS if "oflo_" + op in results.metrics]
    fig = Figure(figsize=(0.36 * len(ops) * len(flags) + 4.0, 0.27 * len(points) + 2.4), layout="constrained")
    axes = fig.subplots(1, len(flags), squeeze=False, sharey=True)[0]
    counts = {flag: np.array([[np.median(_replica_values(results, "%s_%s" % (flag, op), p)) for op in ops]
                              for p in points]) for flag in flags}
    positive = np.concatenate([c[c > 0] for c in counts.values()])
    norm = mcolors.LogNorm(vmin=positive.min() / 2 if len(positive) else 0.5,
                           vmax=positive.max() if len(positive) else 1)
    image = None
    for ax, flag in zip(axes, flags):
        table = counts[flag]
        image = ax.imshow(np.ma.masked_where(~(table > 0), table), norm=norm, cmap="Reds", aspect="auto")
        for (i, j), value in np.ndenumerate(table):
            if np.isnan(value):
                ax.text(j, i, "off", ha="center", va="center", fontsize=6, color="0.5")
            elif value > 0:
                dark = norm(value) > 0.6
                ax.text(j, i, _compact(value), ha="center", va="center", fontsize=6.5,
                        color="white" if dark else "black")
        ax.set_xticks(range(len(ops)))
        ax.set_xticklabels([op.replace("_", ".", 1) for op in ops], rotation=60, ha="right", rotation_mode="anchor",
                           fontsize=7.5)
        ax.set_yticks(range(len(points)))
        ax.set_yticklabels([labels[p] for p in points], fontsize=7.5)
        ax.set_title("operations that raised %s" % flag.upper(), fontsize=9)
        ax.set_xticks(np.arange(-0.5, len(ops)), minor=True)
        ax.set_yticks(np.arange(-0.5, len(points)), minor=True)
        ax.grid(which="minor", color="0.88", lw=0.5)
        ax.tick_params(which="minor", length=0)
        _group_separators(ax, results, points)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="operations over all blocks (median over replicas)")
    fig.suptitle("overflow_hunt: which op overflows in which configuration (ops in execution order)", fontsize=10)
    return _finish(fig, "For each configuration (row) and op of the encoder in execution order (column), the median "
                        "over replicas of the number of operations, over all blocks, that raised the flag; blank: "
                        "none, 'off': the flag's enable is off. Under NANOO an overflow gives NaN and raises INV "
                        "too, so the first one poisons what follows.")


def _max_abs_heatmap(results, points, labels):
    ops = [op for op in OVERFLOW_OPS if "max_abs_" + op in results.metrics]
    values = np.array([[np.median(_replica_values(results, "max_abs_" + op, p)) for op in ops] for p in points])
    fig = Figure(figsize=(0.4 * len(ops) + 5.0, 0.27 * len(points) + 2.4), layout="constrained")
    ax = fig.subplots()
    finite = values[np.isfinite(values) & (values > 0)]
    norm = mcolors.LogNorm(vmin=finite.min() if len(finite) else 1e-3, vmax=finite.max() if len(finite) else 1)
    image = ax.imshow(np.ma.masked_where(~np.isfinite(values) | (values <= 0), values), norm=norm, cmap="Blues",
                      aspect="auto")
    formats = set(results.points["format"][points].tolist()) if "format" in results.points else set()
    info = _format_info(formats.pop()) if len(formats) == 1 else None
    limit = info["max"] if info else None
    for (i, j), value in np.ndenumerate(values):
        over = limit is not None and (not np.isfinite(value) or value >= limit)
        dark = np.isfinite(value) and value > 0 and norm(value) > 0.6
        ax.text(j, i, _compact(value), ha="center", va="center", fontsize=6.3,
                color="white" if dark else "black", fontweight="bold" if over else "normal")
        if over:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="C3", lw=1.6))
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels([op.replace("_", ".", 1) for op in ops], rotation=60, ha="right", rotation_mode="anchor",
                           fontsize=7.5)
    ax.set_yticks(range(len(points)))
    ax.set_yticklabels([labels[p] for p in points], fontsize=7.5)
    _group_separators(ax, results, points)
    bar = fig.colorbar(image, ax=ax, shrink=0.7, label="largest |output| (median over replicas)")
    if limit is not None and norm.vmin <= limit <= norm.vmax:
        bar.ax.axhline(limit, color="C3", lw=2)
    name = (info or {}).get("name", "the format")
    ax.set_title("red frame: at or beyond %s's largest value%s, or not finite" % (
        name, " (%s, red line on the colour bar)" % _number(limit) if limit is not None else ""), fontsize=9)
    fig.suptitle("overflow_hunt: the largest magnitude each op produced, per configuration", fontsize=10)
    return _finish(fig, "For each configuration (row) and op in execution order (column), the largest |output| "
                        "over all blocks (median over replicas; wo under wo_scale: its unscaled fp32 output; "
                        "residual adds: before the clamp). Framed cells reach the format's largest value: there an "
                        "op computing in that format saturated or overflowed (an fp32 residual stream or wo's "
                        "unscaled output may exceed it without overflowing).")


def _generic(results):
    points = results.written_points()
    out = []
    for trace in results.traces:
        if any(len(_trace_rows(results, trace, p)[0]) > 1 for p in points):
            fig = trace_figure(results, trace, points)
            if fig is not None:
                out.append((trace, fig))
    for metric in _drawable_metrics(results, points):
        out.append((metric, metric_figure(results, metric, points)))
    return out


EXPERIMENTS = {"swamping": _swamping, "summation": _summation, "matmul_accum": _matmul_accum, "updates": _updates,
               "grad_underflow": _grad_underflow, "train": _train, "norm_stats": _norm_stats,
               "block_quant": _block_quant, "overflow_hunt": _overflow_hunt}


def figures(results):
    """The experiment's figures: a list of (suffix, matplotlib Figure), suffix naming the
    file (<stem>_<suffix>.png). Each Figure has roundoff_caption (a sentence for a report)
    and roundoff_nonfinite: (header, point lines, how drawn) for each metric or trace with
    inf or NaN results. ValueError when no run is written."""
    results = _results.load(results)
    if not results.done_replicas.any():
        raise ValueError("%s: no finished points to plot" % results.path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # medians of empty or all-NaN rows
        return EXPERIMENTS.get(results.experiment, _generic)(results)


def nonfinite_report(results, suffix, fig, path=None):
    """The stderr lines saying which points of a figure hold inf or NaN, and how it draws them."""
    lines = []
    where = os.path.basename(path) if path else suffix
    for header, points, how in getattr(fig, "roundoff_nonfinite", []):
        lines.append("roundoff.plot: %s: %s, %s in %s:" % (results.experiment, header, how, where))
        lines += points
    return lines


def save(results, out_dir=None, log=None):
    """Writes every figure as <out_dir>/<stem>_<suffix>.png (out_dir: default the results
    file's folder, created if missing); returns the paths. The points with inf or NaN
    results are listed on `log` (default stderr)."""
    results = _results.load(results)
    out_dir = out_dir or os.path.dirname(os.path.abspath(results.path))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(results.path))[0]
    log = sys.stderr if log is None else log
    paths = []
    for suffix, fig in figures(results):
        path = os.path.join(out_dir, "%s_%s.png" % (stem, suffix))
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
        for line in nonfinite_report(results, suffix, fig, path):
            print(line, file=log)
        paths.append(path)
    return paths


def main(argv):
    parser = argparse.ArgumentParser(prog="python3 -m roundoff.plot",
                                     description="PNG figures of a roundoff sweep output, laid out along its grid.")
    parser.add_argument("results", help="a sweep output (.h5)")
    parser.add_argument("--out", help="folder for the PNG files (default: the folder of RESULTS)")
    args = parser.parse_args(argv[1:])
    try:
        result = _results.open(args.results)
        for path in save(result, args.out):
            print(path)
    except ValueError as error:
        print("roundoff.plot: %s" % error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
