"""roundoff.report: one self-contained HTML page per sweep output.

    import roundoff
    roundoff.report.write("results/matmul_accum.h5")            # -> results/matmul_accum.html
    roundoff.report.write(res, "matmul.html")                    # a Results works too

From a shell (prints the path written):

    /usr/bin/python3 -m roundoff.report RESULTS.h5 [-o OUT.html]

The page holds every figure of roundoff.plot (PNG, embedded as data: URLs) with its
caption and the points whose results are inf or NaN; per point a summary of each metric
over the replicas (mean, min and max; the non-finite replicas counted apart); the sticky
flags; the counted and trapped floating-point exceptions; the provenance (the file's
root attributes: experiment, status, build, version, seed, replicas, creation time);
and the config as it was run. It loads nothing from elsewhere: one file to mail or
archive.
"""
import argparse
import base64
import html
import io
import os
import sys

import numpy as np

from . import plot as _plot
from . import results as _results

METRICS_PER_TABLE = 6

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; vertical-align: top; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
.range { color: #777; font-size: 0.85em; white-space: nowrap; }
.bad { color: #b00; font-weight: bold; }
.scroll { overflow-x: auto; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.9em; margin-top: 0.4em; } figcaption pre { font-size: 0.85em; white-space: pre-wrap; }
pre.config { background: #f7f7f7; padding: 0.8em; font-size: 0.85em; overflow-x: auto; }
details { margin: 0.4em 0; } summary { cursor: pointer; }
"""

PROVENANCE = ("experiment", "description", "status", "created", "roundoff_version", "git_commit", "seed", "replicas",
              "n_points", "headline_metric", "config_sha256", "shard_index", "shard_count", "config_path")


def _e(text):
    return html.escape(str(text), quote=True)


def _num(value):
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return "%.4g" % v
    return _plot._number(value)


def _figure_html(index, suffix, fig):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_plot.DPI, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    caption = _e(getattr(fig, "roundoff_caption", ""))
    notes = []
    for header, lines, how in getattr(fig, "roundoff_nonfinite", []):
        notes.append("<details><summary class='bad'>%s (%s)</summary><pre>%s</pre></details>"
                     % (_e(header), _e(how), _e("\n".join(lines))))
    return ("<figure id='fig-%s'><img alt='%s' src='data:image/png;base64,%s'>"
            "<figcaption><b>Figure %d (%s).</b> %s%s</figcaption></figure>"
            % (_e(suffix), _e(suffix), data, index, _e(suffix), caption, "".join(notes)))


def _cell(values):
    """A metric over the written replicas of a point: mean, then min .. max; inf and NaN
    counted apart."""
    finite = values[np.isfinite(values)]
    parts = []
    if len(finite):
        parts.append(_num(finite.mean()))
        if len(values) > 1 and finite.min() != finite.max():
            parts.append("<span class='range'>%s … %s</span>" % (_num(finite.min()), _num(finite.max())))
    bad = []
    for name, count in (("inf", int(np.isposinf(values).sum())), ("-inf", int(np.isneginf(values).sum())),
                        ("NaN", int(np.isnan(values).sum()))):
        if count:
            bad.append("%d %s" % (count, name))
    if bad:
        parts.append("<span class='bad'>%s</span>" % ", ".join(bad))
    return "<br>".join(parts) or "–"


def _point_columns(results, points):
    varying = results.varying()
    head = "<th>point</th>" + "".join("<th class='text'>%s</th>" % _e(n) for n in varying)
    rows = {p: "<td>%d</td>" % p + "".join("<td class='text'>%s</td>" % _e(_plot._number(results.points[n][p]))
                                          for n in varying) for p in points}
    return head, rows


def _summary_tables(results, points):
    """Tables of the metrics per point, METRICS_PER_TABLE metrics each, and the metrics that
    are NaN everywhere or one value everywhere, named apart."""
    all_nan, constant, shown = _plot.metric_kinds(results, points)
    values = {m: {p: _plot._replica_values(results, m, p) for p in points} for m in shown}
    head, rows = _point_columns(results, points)
    out = []
    for start in range(0, len(shown), METRICS_PER_TABLE):
        chunk = shown[start:start + METRICS_PER_TABLE]
        table = ["<div class='scroll'><table><tr>%s%s</tr>" % (
            head, "".join("<th title='%s'>%s</th>" % (_e(results.meanings.get(m, "")), _e(m)) for m in chunk))]
        for p in points:
            table.append("<tr>%s%s</tr>" % (rows[p], "".join("<td>%s</td>" % _cell(values[m][p]) for m in chunk)))
        table.append("</table></div>")
        out.append("<details%s><summary>%s</summary>%s</details>" % (
            " open" if start == 0 else "", _e(", ".join(chunk)), "".join(table)))
    if constant:
        out.append("<p>The same at every point and replica: %s.</p>" % ", ".join(
            "%s = %s" % (_e(m), _e(_num(v))) for m, v in constant))
    if all_nan:
        out.append("<p>NaN at every point (not defined for this sweep): %s.</p>" % _e(", ".join(all_nan)))
    glossary = "".join("<tr><td class='text'>%s</td><td class='text'>%s</td></tr>"
                       % (_e(m), _e(results.meanings.get(m, ""))) for m in results.metrics)
    out.append("<details><summary>What each metric means</summary><table>%s</table></details>" % glossary)
    return "".join(out)


def _flags_table(results, points):
    flags = [f for f in _results.FLAGS if f in results.flags]
    if not flags:
        return "<p>No flags recorded.</p>"
    head, rows = _point_columns(results, points)
    lines = ["<div class='scroll'><table><tr>%s%s</tr>" % (head, "".join("<th>%s</th>" % f for f in flags))]
    for p in points:
        written = results.done_replicas[p]
        cells = "".join("<td>%d / %d</td>" % (int(results.flags[f][p][written].sum()), int(written.sum()))
                        for f in flags)
        lines.append("<tr>%s%s</tr>" % (rows[p], cells))
    lines.append("</table></div>")
    return ("<p>Runs that ended with each sticky flag raised, of the point's written runs.</p>"
            "<details><summary>Flags per point</summary>%s</details>" % "".join(lines))


def _exceptions(results):
    parts = []
    counts = _results.counts_table(results)
    if len(counts):
        grouped = counts.groupby(["point", "scope", "op", "flag"], sort=False).agg(
            runs=("replica", "nunique"), count=("count", "sum"), first_element=("first_element", "first"),
            first_operands=("first_operands", "first"), first_result=("first_result", "first")).reset_index()
        rows = ["<tr><th>point</th><th class='text'>parameters</th><th class='text'>scope</th><th class='text'>op</th>"
                "<th class='text'>flag</th><th>runs</th><th>operations</th><th>first element</th>"
                "<th class='text'>its operands</th><th>its result</th></tr>"]
        for row in grouped.itertuples(index=False):
            rows.append("<tr><td>%d</td><td class='text'>%s</td><td class='text'>%s</td><td class='text'>%s</td>"
                        "<td class='text'>%s</td><td>%d</td><td>%d</td><td>%d</td><td class='text'>%s</td>"
                        "<td>%s</td></tr>" % (
                            row.point, _e(_plot._point_text(results, row.point)), _e(row.scope), _e(row.op),
                            _e(row.flag), row.runs, row.count, row.first_element,
                            _e(", ".join(_num(v) for v in row.first_operands)), _e(_num(row.first_result))))
        parts.append("<p>Counted floating-point exceptions (fp_exceptions: count), summed over the replicas; the "
                     "first element, operands and result are the first replica's.</p><details><summary>%d rows"
                     "</summary><div class='scroll'><table>%s</table></div></details>" % (len(grouped), "".join(rows)))
    traps = _results.traps_table(results)
    if len(traps):
        rows = ["<tr><th>point</th><th>replica</th><th class='text'>parameters</th><th class='text'>report</th></tr>"]
        for row in traps.itertuples(index=False):
            rows.append("<tr><td>%d</td><td>%d</td><td class='text'>%s</td><td class='text'>%s</td></tr>" % (
                row.point, row.replica, _e(_plot._point_text(results, row.point)), _e(row.report)))
        parts.append("<p>Runs that ended in a trap (fp_exceptions: trap; their metrics are NaN).</p><details>"
                     "<summary>%d trapped runs</summary><div class='scroll'><table>%s</table></div></details>"
                     % (len(traps), "".join(rows)))
    return "".join(parts) or "<p>None counted or trapped.</p>"


def _provenance(results, points):
    attrs = results.attrs
    rows = ["<tr><th class='text'>%s</th><td class='text'>%s</td></tr>" % (_e(k), _e(attrs[k]))
            for k in PROVENANCE if k in attrs]
    rows += ["<tr><th class='text'>%s</th><td class='text'>%s</td></tr>" % (_e(k), _e(v))
             for k, v in attrs.items() if k not in PROVENANCE and k != "config"]
    written = results.done_replicas
    rows.append("<tr><th class='text'>written</th><td class='text'>%d of %d points complete, %d of %d runs</td></tr>"
                % (int(results.done.sum()), len(results.done), int(written.sum()), written.size))
    rows.append("<tr><th class='text'>file</th><td class='text'>%s</td></tr>" % _e(os.path.abspath(results.path)))
    return "<table>%s</table>" % "".join(rows)


def html_page(source):
    """The report of a sweep output (a path or a Results) as one HTML string."""
    results = _results.load(source)
    points = results.written_points()
    if not points:
        raise ValueError("%s: no finished points to report" % results.path)
    figures = _plot.figures(results)
    name = os.path.basename(results.path)
    title = "%s: %s" % (results.experiment, name)
    body = ["<h1>%s</h1>" % _e(title)]
    if results.attrs.get("description"):
        body.append("<p>%s</p>" % _e(results.attrs["description"]))
    status = results.attrs.get("status", "")
    body.append("<p>%d points × %d replicas, status <b>%s</b>%s. Contents: <a href='#figures'>figures</a>, "
                "<a href='#summary'>summary</a>, <a href='#flags'>flags</a>, <a href='#exceptions'>exceptions</a>, "
                "<a href='#provenance'>provenance</a>, <a href='#config'>config</a>.</p>"
                % (len(results.done), results.replicas, _e(status),
                   "" if status == "complete" else " (only the written runs are shown)"))
    body.append("<h2 id='figures'>Figures</h2>")
    body += [_figure_html(i + 1, suffix, fig) for i, (suffix, fig) in enumerate(figures)]
    body.append("<h2 id='summary'>Summary per point</h2><p>Each cell: the mean over the point's written replicas, "
                "below it their smallest and largest value; inf and NaN replicas are counted, not averaged.</p>")
    body.append(_summary_tables(results, points))
    body.append("<h2 id='flags'>Flags</h2>" + _flags_table(results, points))
    body.append("<h2 id='exceptions'>Floating-point exceptions</h2>" + _exceptions(results))
    body.append("<h2 id='provenance'>Provenance</h2>" + _provenance(results, points))
    body.append("<h2 id='config'>Config</h2><pre class='config'>%s</pre>" % _e(results.attrs.get("config", "")))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>%s</title><style>%s</style></head>"
            "<body>%s</body></html>\n" % (_e("roundoff report: " + title), STYLE, "\n".join(body)))


def write(source, out=None):
    """Writes the report of a sweep output (a path or a Results) to `out` (default: the
    results file with .html); returns the path. ValueError: not a sweep output, or no
    finished points."""
    results = _results.load(source)
    out = out or os.path.splitext(results.path)[0] + ".html"
    page = html_page(results)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    return out


def main(argv):
    parser = argparse.ArgumentParser(prog="python3 -m roundoff.report",
                                     description="One self-contained HTML report of a roundoff sweep output.")
    parser.add_argument("results", help="a sweep output (.h5)")
    parser.add_argument("-o", "--out", help="the HTML file (default: RESULTS with .html)")
    args = parser.parse_args(argv[1:])
    try:
        print(write(args.results, args.out))
    except (ValueError, OSError) as error:
        print("roundoff.report: %s" % error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
