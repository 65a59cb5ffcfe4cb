#!/usr/bin/python3
"""PNG plots of a roundoff sweep output, chosen by the file's `experiment` attribute.

    scripts/plot.py results/swamping.h5 [--out DIR]

swamping:  <stem>_trace.png (running value x per format and rounding: median and the
           range over replicas, with the exact sum) and <stem>_finals.png (distribution
           of the final values over replicas).
summation: <stem>_rel_error.png (mean relative error over replicas against n, log-log,
           one panel per series and format, one line per rounding and algorithm).
block_quant: <stem>_sqnr.png (SQNR per format and scale rule, elements rne, one panel
           per distribution) and <stem>_bias.png (rel_bias of the other element roundings).
other experiments: <stem>_<metric>.png per metric (mean and range over replicas per point).

Non-finite results (inf or NaN: e.g. an fp16 sum of 10^6 uniform terms overflows past
65504, an honest result) are never dropped silently: they are drawn as "x" markers at the
top edge of their panel (summation: also exact results, error 0, as "v" at the bottom
edge of the log axis), and stderr lists the points they come from.

DIR defaults to the folder of RESULTS.h5. Prints the paths written (stdout).
"""
import argparse
import os
import sys
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roundoff import results as roundoff_h5  # noqa: E402 (PYTHONPATH=build/python)


def varying(result, exclude=()):
    """Parameters that take more than one value over the finished points, in file order."""
    names = []
    for name, values in result.points.items():
        if name in exclude:
            continue
        if len(set(values[result.done].tolist())) > 1:
            names.append(name)
    return names


def label(result, point, names):
    return " ".join("%s=%s" % (n, result.points[n][point]) if n not in ("format", "rounding", "algorithm", "series")
                    else str(result.points[n][point]) for n in names) or "all"


def point_text(result, point):
    """Every parameter that varies over the finished points, as name=value."""
    return " ".join("%s=%s" % (n, result.points[n][point]) for n in varying(result)) or "point %d" % point


def report_nonfinite(result, metric, points, how_drawn):
    """Says on stderr which finished points hold inf or NaN in `metric` (any replica)."""
    values = result.metrics[metric]
    bad = [p for p in points if not np.isfinite(values[p]).all()]
    if not bad:
        return
    print("plot.py: %s: %d of %d points have non-finite %s (inf or NaN in some replica; e.g. overflow), %s:"
          % (result.attrs.get("experiment"), len(bad), len(points), metric, how_drawn), file=sys.stderr)
    for p in bad:
        v = values[p]
        print("  point %d (%s): %d inf, %d NaN of %d replicas"
              % (p, point_text(result, p), np.isinf(v).sum(), np.isnan(v).sum(), v.size), file=sys.stderr)


def mark_edge(ax, x, where, marker, color, label=None):
    """Markers at x (data) on the top (where=1) or bottom (where=0) edge of the panel."""
    if len(x):
        ax.plot(x, np.full(len(x), 0.97 if where else 0.03), marker, color=color, ms=7, mew=1.5, ls="none",
                transform=ax.get_xaxis_transform(), clip_on=False, label=label)


def groups(result, key):
    """Finished point indices grouped by the value of parameter `key` (in order of appearance)."""
    out = {}
    for p in np.flatnonzero(result.done):
        value = result.points[key][p] if key in result.points else ""
        out.setdefault(value, []).append(p)
    return out


def panel_grid(n_panels, width=5.5, height=4.0):
    fig, axes = plt.subplots(1, n_panels, figsize=(width * n_panels, height), squeeze=False)
    return fig, axes[0]


def save(fig, out_dir, stem, name):
    path = os.path.join(out_dir, "%s_%s.png" % (stem, name))
    with warnings.catch_warnings():
        # Long point labels can defeat tight_layout; bbox_inches below keeps them whole.
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_swamping(result, out_dir, stem):
    paths = []
    by_format = groups(result, "format")
    legend_keys = varying(result, exclude=("format",))
    if "x" in result.traces:
        steps_x, x = result.traces["x"]
        fig, axes = panel_grid(len(by_format))
        for ax, (fmt, points) in zip(axes, by_format.items()):
            for p in points:
                valid = ~np.isnan(steps_x[p])
                steps, runs = steps_x[p][valid], x[p][:, valid]
                line, = ax.plot(steps, np.median(runs, axis=0), label=label(result, p, legend_keys))
                ax.fill_between(steps, runs.min(axis=0), runs.max(axis=0), color=line.get_color(), alpha=0.25)
            # The exact running sum: a straight line from the start to the exact final value.
            p = points[0]
            valid = ~np.isnan(steps_x[p])
            start, end = x[p, 0, valid][0], np.nanmean(result.metrics["exact"][p])
            ax.plot([steps_x[p][valid][0], steps_x[p][valid][-1]], [start, end], "k--", lw=1, label="exact")
            ax.set_title("%s: running value x (median, range over replicas)" % fmt, fontsize=10)
            ax.set_xlabel("step")
            ax.set_ylabel("x")
            ax.legend(fontsize=8)
        paths.append(save(fig, out_dir, stem, "trace"))

    finals = result.metrics["final"]
    fig, axes = panel_grid(len(by_format))
    for ax, (fmt, points) in zip(axes, by_format.items()):
        values = finals[points]
        finite = values[np.isfinite(values)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
        pad = max(hi - lo, abs(hi) * 1e-6, 1e-12) * 0.05
        bins = np.linspace(lo - pad, hi + pad, 41)
        for p in points:
            # A histogram has no bin for inf or NaN: those replicas are counted in the legend.
            n_bad = int((~np.isfinite(finals[p])).sum())
            extra = " (%d non-finite, not binned)" % n_bad if n_bad else ""
            ax.hist(finals[p][np.isfinite(finals[p])], bins=bins, alpha=0.6, label=label(result, p, legend_keys) + extra)
        ax.axvline(np.nanmean(result.metrics["exact"][points[0]]), color="k", ls="--", lw=1, label="exact")
        n_bad = int((~np.isfinite(values)).sum())
        ax.set_title("%s: final x over %d replicas%s" % (fmt, finals.shape[1],
                                                         ", %d non-finite" % n_bad if n_bad else ""), fontsize=10)
        ax.set_xlabel("final x")
        ax.set_ylabel("replicas")
        ax.legend(fontsize=8)
    paths.append(save(fig, out_dir, stem, "finals"))
    report_nonfinite(result, "final", list(np.flatnonzero(result.done)),
                     "counted in the legend and title of swamping_finals (not binned)")
    return paths


def plot_summation(result, out_dir, stem):
    all_series, formats = list(groups(result, "series")), list(groups(result, "format"))
    legend_keys = varying(result, exclude=("series", "format", "n"))
    rel = result.metrics["rel_error"]
    fig, axes = plt.subplots(len(all_series), len(formats), figsize=(4.5 * len(formats), 3.6 * len(all_series)),
                             squeeze=False)
    for ax, (series, fmt) in zip(axes.flat, [(s, f) for s in all_series for f in formats]):
        lines = {}
        for p in np.flatnonzero(result.done):
            if result.points["series"][p] == series and result.points["format"][p] == fmt:
                lines.setdefault(label(result, p, legend_keys), []).append(p)
        overflow_labelled = exact_labelled = False
        for name, points in lines.items():
            points = sorted(points, key=lambda p: result.points["n"][p])
            n = result.points["n"][points]
            mean = rel[points].mean(axis=1)
            # Runs that overflowed the format (inf or NaN error, e.g. fp16 sums past 65504)
            # and exact sums (error 0) have no place on a log axis: the line has a gap
            # there and a marker on the panel's edge says which.
            nonfinite, exact = ~np.isfinite(mean), mean == 0
            line, = ax.loglog(n, np.where(nonfinite | exact, np.nan, mean), "o-", ms=3, label=name)
            mark_edge(ax, n[nonfinite], 1, "x", line.get_color(), None if overflow_labelled else "inf/NaN (overflow)")
            mark_edge(ax, n[exact], 0, "v", line.get_color(), None if exact_labelled else "exact (error 0)")
            overflow_labelled |= bool(nonfinite.any())
            exact_labelled |= bool(exact.any())
        ax.set_title("%s, %s" % (series, fmt), fontsize=10)
        ax.set_xlabel("n (terms)")
        ax.set_ylabel("mean relative error")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    path = save(fig, out_dir, stem, "rel_error")
    report_nonfinite(result, "rel_error", list(np.flatnonzero(result.done)),
                     "drawn as x on the top edge of their panels in %s" % os.path.basename(path))
    return [path]


def plot_generic(result, out_dir, stem):
    """Any other experiment: each metric's mean and range over replicas, per point."""
    keys = varying(result)
    done = np.flatnonzero(result.done)
    labels = [label(result, p, keys) for p in done]
    paths = []
    for name, values in result.metrics.items():
        v = values[done]
        if np.isnan(v).all():
            # NaN by definition at every point (e.g. train's metrics of a layer that this
            # sweep's models do not have): nothing to draw, nothing went wrong.
            continue
        fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(done) + 2), 4))
        # Mean and range of the finite replicas; a point with any inf or NaN replica gets
        # an x on the top edge instead of silently losing those replicas.
        nonfinite = ~np.isfinite(v).all(axis=1)
        finite = np.where(np.isfinite(v), v, np.nan)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: nothing to draw
            mean = np.nanmean(finite, axis=1)
            low, high = np.nanmin(finite, axis=1), np.nanmax(finite, axis=1)
            mean = np.where(nonfinite, np.nan, mean)
            # Clipped at 0: the mean of equal values can land an ulp outside their range.
            below = np.maximum(mean - low, 0)
            above = np.maximum(high - mean, 0)
            ax.errorbar(np.arange(len(done)), mean, yerr=[below, above], fmt="o", capsize=2)
        mark_edge(ax, np.flatnonzero(nonfinite), 1, "x", "C3", "inf/NaN in some replica")
        if nonfinite.any():
            ax.legend(fontsize=7)
        ax.set_xticks(np.arange(len(done)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(name)
        ax.set_title("%s: %s (mean, range over replicas)" % (result.attrs.get("experiment"), name), fontsize=10)
        paths.append(save(fig, out_dir, stem, name))
        report_nonfinite(result, name, list(done), "drawn as x on the top edge of %s" % os.path.basename(paths[-1]))
    return paths


def plot_block_quant(result, out_dir, stem):
    """block_quant: <stem>_sqnr.png (signal-to-quantisation-noise ratio in dB, mean over
    replicas, per format and scale rule, elements rne; one panel per distribution) and
    <stem>_bias.png (rel_bias, mean and range over replicas, of the points with another
    element rounding: sr with its random bits, rz). Non-finite values are reported."""
    done = np.flatnonzero(result.done)
    pts = result.points
    rules = ["floor", "ceil", "even", "up", "nearest", "default"]
    paths = []
    for metric, name, select in (("sqnr_db", "sqnr", lambda p: pts["rounding"][p] == "rne"),
                                 ("rel_bias", "bias", lambda p: pts["rounding"][p] != "rne")):
        chosen = [p for p in done if select(p)]
        if not chosen:
            continue
        report_nonfinite(result, metric, chosen, "left out of %s_%s.png" % (stem, name))
        by_distribution = groups(result, "distribution")
        panels = [(d, [p for p in ps if p in chosen]) for d, ps in by_distribution.items()]
        panels = [(d, ps) for d, ps in panels if ps]
        fig, axes = panel_grid(len(panels), width=6.0, height=4.5)
        for ax, (distribution, ps) in zip(axes, panels):
            values = result.metrics[metric]
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                finite = np.where(np.isfinite(values), values, np.nan)
                mean = np.nanmean(finite, axis=1)
                low, high = np.nanmin(finite, axis=1), np.nanmax(finite, axis=1)
            if name == "sqnr":
                formats = list(dict.fromkeys(pts["format"][p] for p in ps))
                for k, rule in enumerate(r for r in rules if any(pts["scale_rule"][p] == r for p in ps)):
                    xs, ys = [], []
                    for p in ps:
                        if pts["scale_rule"][p] == rule:
                            xs.append(formats.index(pts["format"][p]) + 0.1 * (k - 2))
                            ys.append(mean[p])
                    ax.plot(xs, ys, "o", label=rule)
                ax.set_xticks(range(len(formats)))
                ax.set_xticklabels(formats, rotation=45, ha="right", fontsize=8)
                ax.set_ylabel("SQNR (dB), elements rne")
                ax.legend(fontsize=7, title="scale rule", title_fontsize=7)
            else:
                labels = ["%s %s %s%s" % (pts["format"][p], pts["scale_rule"][p], pts["rounding"][p],
                                          " %d bits" % pts["sr_bits"][p] if pts["rounding"][p] == "sr" else "")
                          for p in ps]
                y = np.arange(len(ps))
                m = np.array([mean[p] for p in ps])
                ax.errorbar(m, y, xerr=[np.maximum(m - [low[p] for p in ps], 0), np.maximum([high[p] for p in ps] - m, 0)],
                            fmt="o", capsize=2)
                ax.axvline(0, color="0.6", lw=0.8)
                ax.set_yticks(y)
                ax.set_yticklabels(labels, fontsize=7)
                ax.invert_yaxis()
                ax.set_xlabel("rel_bias: mean sign(x)(q - x) / rms(x); < 0 toward zero")
            ax.set_title("%s: %s" % (result.attrs.get("experiment"), distribution), fontsize=10)
            ax.grid(alpha=0.3)
        paths.append(save(fig, out_dir, stem, name))
    return paths or plot_generic(result, out_dir, stem)


PLOTTERS = {"swamping": plot_swamping, "summation": plot_summation, "block_quant": plot_block_quant}


def main(argv):
    parser = argparse.ArgumentParser(description="PNG plots of a roundoff sweep output.")
    parser.add_argument("results", help="a sweep output (.h5)")
    parser.add_argument("--out", help="folder for the PNG files (default: the folder of RESULTS)")
    args = parser.parse_args(argv[1:])
    try:
        result = roundoff_h5.open(args.results)
    except ValueError as error:
        print("plot.py: %s" % error, file=sys.stderr)
        return 2
    if not result.done.any():
        print("plot.py: %s: no finished points to plot" % args.results, file=sys.stderr)
        return 2
    out_dir = args.out or os.path.dirname(os.path.abspath(args.results))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.results))[0]
    plotter = PLOTTERS.get(result.attrs.get("experiment"), plot_generic)
    for path in plotter(result, out_dir, stem):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
