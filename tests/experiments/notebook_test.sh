#!/bin/bash
# The swamping notebook and plots run on a freshly swept file:
#   notebook_test.sh SWEEP_EXE SOURCE_ROOT
# 1. sweep configs/swamping.yaml into a temp dir (-o), 2. `python3 -m roundoff.plot` makes its PNGs,
# 3. jupyter-nbconvert --execute runs scripts/notebooks/swamping.ipynb on that file
# (ROUNDOFF_H5). Exit 77 (meson: skipped) when jupyter-nbconvert or ipykernel is missing,
# after steps 1 and 2 have been checked.
set -euo pipefail

sweep=${1:?usage: notebook_test.sh SWEEP_EXE SOURCE_ROOT}
root=${2:?usage: notebook_test.sh SWEEP_EXE SOURCE_ROOT}
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

h5="$work/swamping.h5"
"$sweep" "$root/configs/swamping.yaml" -o "$h5" --quiet -j 2 >"$work/sweep.log" || {
  cat "$work/sweep.log"
  echo "FAIL: sweep of configs/swamping.yaml"
  exit 1
}

# The file holds what the notebook reads: fp16 rne finals exactly 0.25, and a trace.
"$python" - "$h5" <<'EOF'
import sys
import numpy as np
import roundoff
r = roundoff.results.open(sys.argv[1])
assert r.attrs["status"] == "complete" and r.done.all(), "sweep output not complete"
fp16_rne = (r.points["format"] == "fp16") & (r.points["rounding"] == "rne")
assert fp16_rne.sum() == 1 and (r.metrics["final"][fp16_rne] == 0.25).all(), "fp16 rne finals are not all 0.25"
assert "x" in r.traces, "no trace x"
EOF

"$python" -m roundoff.plot "$h5" --out "$work/plots" >"$work/plots.txt"
for png in swamping_trace.png swamping_finals.png; do
  [ -s "$work/plots/$png" ] || { echo "FAIL: roundoff.plot wrote no $png"; exit 1; }
done
echo "roundoff.plot: $(tr '\n' ' ' <"$work/plots.txt")"

bash "$root/tests/experiments/execute_notebook.sh" "$root" swamping "$h5" "$work/executed" || exit $?
# Its summary cell printed the fp16 rne line from this very file.
grep -q "fp16  rne  mean 0.250000" "$work/executed/swamping.ipynb" || {
  echo "FAIL: the executed notebook lacks the fp16 rne summary"
  exit 1
}
echo "notebook executed on the fresh sweep"
