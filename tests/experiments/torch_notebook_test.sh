#!/bin/bash
# The roundoff.torch notebook on a small Fashion-MNIST file:
#   torch_notebook_test.sh SOURCE_ROOT
# 1. scripts/make_fashion_mnist_h5.py writes the first 24 training and 32 test images into a
#    temp dir, 2. jupyter-nbconvert --execute runs scripts/notebooks/torch_resnet.ipynb on it
#    with 3 steps of 8 images per configuration and a first loss scale of 2^16 (so that no
#    step is skipped and both fp16 optimizers update), 3. the executed copy must hold every
#    configuration's summary, the loss figure and the overflow hunt's answer: layers.0.linear2
#    (wo) overflows first, counted and trapped.
# Exit 77 (meson: skipped) when python3-torch, python3-torchvision, Debian's
# dataset-fashion-mnist, jupyter-nbconvert or ipykernel is missing.
set -euo pipefail

root=${1:?usage: torch_notebook_test.sh SOURCE_ROOT}
python=/usr/bin/python3
if ! "$python" -c "import torch, torchvision" 2>/dev/null; then
  echo "SKIP: roundoff.torch needs python3-torch and python3-torchvision (scripts/setup --torch)"
  exit 77
fi
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: Debian's dataset-fashion-mnist is not installed (scripts/setup --tests installs it)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

h5="$work/fashion_mnist.h5"
"$python" "$root/scripts/make_fashion_mnist_h5.py" "$h5" --train-samples 24 --test-samples 32 >/dev/null

ROUNDOFF_STEPS=3 ROUNDOFF_BATCH=8 ROUNDOFF_TEST_IMAGES=32 ROUNDOFF_LS_INIT=65536 \
  bash "$root/tests/experiments/execute_notebook.sh" "$root" torch_resnet "$h5" "$work/executed" || exit $?

executed="$work/executed/torch_resnet.ipynb"
expect() {  # TEXT WHAT
  grep -qF -- "$1" "$executed" || { echo "FAIL: the executed notebook lacks $2 ($1)"; exit 1; }
}
expect "float32                  mean loss" "the float32 summary"
expect "h100 fp16, fp32 master   mean loss" "the h100 summary"
expect "ipu-amp fp16, SR         mean loss" "the ipu-amp summary"
[ "$(grep -c "skipped 0 of 3 steps" "$executed")" = 3 ] || {
  echo "FAIL: a configuration skipped a step at loss scale 2^16"
  exit 1
}
expect '"image/png"' "the loss figure"
expect "first overflowing module: layers.0.linear2" "the overflow hunt's answer"
expect "trapped: OFLO in layers.0.linear2 (round)" "the trap in wo"
echo "notebook executed: three configurations trained, wo's overflow found"
