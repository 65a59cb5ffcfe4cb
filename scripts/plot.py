#!/usr/bin/python3
"""PNG plots of a roundoff sweep output, chosen by the file's `experiment` attribute.

    scripts/plot.py results/swamping.h5 [--out DIR]

swamping:  <stem>_trace.png (running value x per format and rounding: median and the
           range over replicas, with the exact sum) and <stem>_finals.png (distribution
           of the final values over replicas).
summation: <stem>_rel_error.png (mean relative error over replicas against n, log-log,
           one panel per series and format, one line per rounding and algorithm).
other experiments: <stem>_<metric>.png per metric (mean and range over replicas per point).

DIR defaults to the folder of RESULTS.h5. Prints the paths written.
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roundoff_h5  # noqa: E402


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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
            ax.hist(finals[p][np.isfinite(finals[p])], bins=bins, alpha=0.6, label=label(result, p, legend_keys))
        ax.axvline(np.nanmean(result.metrics["exact"][points[0]]), color="k", ls="--", lw=1, label="exact")
        ax.set_title("%s: final x over %d replicas" % (fmt, finals.shape[1]), fontsize=10)
        ax.set_xlabel("final x")
        ax.set_ylabel("replicas")
        ax.legend(fontsize=8)
    paths.append(save(fig, out_dir, stem, "finals"))
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
        for name, points in lines.items():
            points = sorted(points, key=lambda p: result.points["n"][p])
            n = result.points["n"][points]
            mean = rel[points].mean(axis=1)
            # Exact sums (error 0) and runs that overflowed the format (inf or NaN error,
            # e.g. fp16 sums past 65504) have no place on a log axis: drawn as gaps.
            mean = np.where((mean > 0) & np.isfinite(mean), mean, np.nan)
            ax.loglog(n, mean, "o-", ms=3, label=name)
        ax.set_title("%s, %s" % (series, fmt), fontsize=10)
        ax.set_xlabel("n (terms)")
        ax.set_ylabel("mean relative error")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    return [save(fig, out_dir, stem, "rel_error")]


def plot_generic(result, out_dir, stem):
    """Any other experiment: each metric's mean and range over replicas, per point."""
    keys = varying(result)
    done = np.flatnonzero(result.done)
    labels = [label(result, p, keys) for p in done]
    paths = []
    for name, values in result.metrics.items():
        fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(done) + 2), 4))
        v = values[done]
        mean = np.nanmean(v, axis=1)
        # Clipped at 0: the mean of equal values can land an ulp outside their range.
        below = np.maximum(mean - np.nanmin(v, axis=1), 0)
        above = np.maximum(np.nanmax(v, axis=1) - mean, 0)
        ax.errorbar(np.arange(len(done)), mean, yerr=[below, above], fmt="o", capsize=2)
        ax.set_xticks(np.arange(len(done)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(name)
        ax.set_title("%s: %s (mean, range over replicas)" % (result.attrs.get("experiment"), name), fontsize=10)
        paths.append(save(fig, out_dir, stem, name))
    return paths


PLOTTERS = {"swamping": plot_swamping, "summation": plot_summation}


def main(argv):
    parser = argparse.ArgumentParser(description="PNG plots of a roundoff sweep output.")
    parser.add_argument("results", help="a sweep output (.h5)")
    parser.add_argument("--out", help="folder for the PNG files (default: the folder of RESULTS)")
    args = parser.parse_args(argv[1:])
    try:
        result = roundoff_h5.read(args.results)
    except (OSError, KeyError) as error:
        print("plot.py: %s: not a readable sweep output (%s)" % (args.results, error), file=sys.stderr)
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
