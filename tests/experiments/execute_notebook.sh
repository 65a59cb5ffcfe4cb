#!/bin/bash
# Executes a shipped notebook on a sweep output, for the notebook tests:
#   execute_notebook.sh SOURCE_ROOT NAME H5 OUT_DIR
# runs scripts/notebooks/NAME.ipynb with ROUNDOFF_H5=H5 and writes the executed copy to
# OUT_DIR/NAME.ipynb (the shipped notebook stays without outputs). Exit 77 (meson:
# skipped) when jupyter-nbconvert or ipykernel is missing; 1, with nbconvert's log, when
# the notebook fails.
set -euo pipefail

root=${1:?usage: execute_notebook.sh SOURCE_ROOT NAME H5 OUT_DIR}
name=${2:?usage: execute_notebook.sh SOURCE_ROOT NAME H5 OUT_DIR}
h5=${3:?usage: execute_notebook.sh SOURCE_ROOT NAME H5 OUT_DIR}
out=${4:?usage: execute_notebook.sh SOURCE_ROOT NAME H5 OUT_DIR}

if ! command -v jupyter-nbconvert >/dev/null 2>&1; then
  echo "SKIP: jupyter-nbconvert not installed"
  exit 77
fi
if ! /usr/bin/python3 -c "import ipykernel" 2>/dev/null; then
  echo "SKIP: python3-ipykernel not installed"
  exit 77
fi
mkdir -p "$out"
# The notebook runs from its own folder, importing roundoff from $PYTHONPATH (build/python).
(cd "$root/scripts/notebooks" &&
  ROUNDOFF_H5="$h5" PYDEVD_DISABLE_FILE_VALIDATION=1 jupyter-nbconvert --to notebook --execute \
    --ExecutePreprocessor.timeout=120 --output-dir "$out" "$name.ipynb") >"$out/nbconvert.log" 2>&1 || {
  cat "$out/nbconvert.log"
  echo "FAIL: the notebook $name.ipynb did not execute"
  exit 1
}
