"""roundoff.torch's speed (issue 20), as ratios to references measured in the same run,
one thread, thread CPU time, best of N after a warm-up call:
  - an emulated nn.Linear's forward and backward (its three GEMMs with their operand
    reads, roundings and the result tensors) against the unit's own C++ gemm on the
    same operands already in its input format (the three GEMMs' times added up);
    target: within 1.2x;
  - an optimizer step on a ResNet-18's parameters (11.2M, random gradients) per
    optimizer and update rule against torch.optim's float32 step of the same optimizer
    on the same parameters (the ratio is the emulated time over torch's);
  - a torchvision ResNet-18 training step (weights=None, first convolution taking one
    channel: 1 x 28 x 28 images, ten classes; batch 32; SGD) per unit, as a ratio of
    speeds to the same step in torch float32 (the ratio is torch's time over the
    emulated one: 0.05x means twenty times slower).
Run: meson test -C build --benchmark --verbose torch   (or with PYTHONPATH=build/python;
`--units h100,ipu-amp` picks the ResNet's units, `--steps N` its repeats, `--rules` the
update rules timed)
"""
import argparse
import sys

import numpy as np

try:
    import torch
except ImportError:
    print("skipped: roundoff.torch needs python3-torch (scripts/setup --torch)")
    sys.exit(0)
from torch import nn
from torch.nn import functional as F

import roundoff
import roundoff.torch as rt
from roundoff import _core

from python_bench import best_time  # beside this script: the same timing as the other benchmarks


def fp16(t):
    return roundoff.round(t.detach().numpy().astype(np.float64), "fp16")[0].astype(np.float64)


def linear_layer(units, batch, features, repeats):
    print(f"nn.Linear({features}, {features}) on a batch of {batch}: forward + backward (three GEMMs)"
          f" against the unit's C++ gemm on the same fp16 operands (thread CPU time, best of {repeats})")
    torch.manual_seed(0)
    failed = []
    for unit in units:
        layer = nn.Linear(features, features, bias=False)
        x = torch.randn(batch, features).half().float().requires_grad_()
        grad = torch.randn(batch, features).half().float()
        with torch.no_grad():
            layer.weight.copy_(layer.weight.half().float())
        rt.emulate(layer, unit=unit)

        def step():
            x.grad = layer.weight.grad = None
            layer(x).backward(grad)

        emulated = best_time(step, repeats)
        w, xv, g = fp16(layer.weight), fp16(x), fp16(grad)
        operands = [(xv, np.ascontiguousarray(w.T)), (g, w), (np.ascontiguousarray(g.T), xv)]
        reference = sum(_core.time_unit_gemm(A, B, unit, repeats) for A, B in operands)
        ratio = emulated / reference
        print(f"  {unit:13s} emulated {emulated * 1e3:8.2f} ms, unit gemms {reference * 1e3:8.2f} ms: {ratio:5.3f}x")
        if ratio > 1.2:
            failed.append(f"{unit} Linear {ratio:.3f}x the unit's gemms (target <= 1.2x)")
    return failed


def resnet18():
    import torchvision
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)  # grey images
    return model


def optimizer_steps(rules, repeats):
    torch.manual_seed(0)
    model = resnet18()
    parameters = list(model.parameters())
    count = sum(p.numel() for p in parameters)
    gradients = [torch.randn_like(p) * 1e-2 for p in parameters]
    print(f"Optimizer step on a ResNet-18's {count / 1e6:.1f}M parameters against torch.optim's float32 step"
          f" (thread CPU time, best of {repeats}; weights fp16)")
    optimizers = {"SGD": (torch.optim.SGD, rt.SGD, dict(lr=0.01, momentum=0.9)),
                  "Adam": (torch.optim.Adam, rt.Adam, dict(lr=1e-3, eps=1e-4))}
    for name, (reference_class, emulated_class, hyper) in optimizers.items():
        def timed(make):
            with torch.no_grad():
                values = [p.detach().clone() for p in parameters]
            optimizer = make(parameters)
            for p, g in zip(parameters, gradients):
                p.grad = g.clone()
            seconds = best_time(optimizer.step, repeats)
            with torch.no_grad():
                for p, v in zip(parameters, values):
                    p.copy_(v)
            return seconds

        reference = timed(lambda ps: reference_class(ps, **hyper))
        print(f"  {name:5s} torch float32 {reference * 1e3:8.1f} ms ({reference / count * 1e9:6.2f} ns per parameter)")
        for rule in rules:
            seconds = timed(lambda ps: emulated_class(ps, **hyper, update=rule, weight_format="fp16"))
            print(f"  {name:5s} {rule:11s}   {seconds * 1e3:8.1f} ms ({seconds / count * 1e9:6.2f} ns per parameter):"
                  f" {seconds / reference:6.1f}x torch's")


def resnet_step(units, steps):
    torch.manual_seed(0)
    x, labels = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))

    def timed(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            optimizer.zero_grad()
            F.cross_entropy(model(x), labels).backward()
            optimizer.step()
        return best_time(step, steps)

    reference = timed(resnet18())
    print(f"ResNet-18 training step, batch 32 of 1 x 28 x 28 (thread CPU time, best of {steps}):"
          f" torch float32 {reference * 1e3:.1f} ms")
    for unit in units:
        seconds = timed(rt.emulate(resnet18(), unit=unit))
        print(f"  {unit:13s} {seconds:8.2f} s: {reference / seconds:7.4f}x torch float32's speed")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--units", default="h100,ipu-amp,fp32-seq")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--rules", default=",".join(rt.UPDATE_RULES))
    args = parser.parse_args()
    torch.set_num_threads(1)  # the emulated GEMMs run on one thread: compare like with like
    roundoff.set_num_threads(1)
    failed = linear_layer(["h100", "a100", "ipu-amp", "ipu-amp-half", "exact", "fp32-seq"], 128, 512, 3)
    optimizer_steps(args.rules.split(","), 3)
    resnet_step(args.units.split(","), args.steps)
    for f in failed:
        print("slower than the target:", f)


if __name__ == "__main__":
    main()
