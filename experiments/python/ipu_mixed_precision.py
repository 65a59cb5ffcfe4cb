"""The IPU tutorial's convolutional model on Fashion-MNIST in float32 against mixed precision
on emulated AMPs (configs/ipu_mixed_precision.yaml).

The model is the one of Graphcore's float32_parameter_updates.py
(github.com/graphcore/tutorials, tutorials/tensorflow1/half_precision_training/
float32_parameter_updates.py, model_function): a 3x3 convolution with 32 filters, stride
1, SAME padding and no bias, ReLU, a second such convolution (no ReLU after it), and a
dense layer with bias from the flattened 28 x 28 x 32 features to the 10 logits. Written
here in torch (NCHW); the tutorial's settings: images divided by 255, batch 32, Adam with
lr 0.01 and epsilon 1e-4 (1e-8 would underflow in fp16), the loss multiplied by S = 256
and the gradients divided by S before the update, floating-point exceptions on with NANOO
(an overflow gives NaN), stochastic rounding off.

unit float32: the model in torch float32 (the tutorial's "float32"; not emulated). unit
ipu-amp / ipu-amp-half: the tutorial's "mixed": both convolutions and the dense layer run
through roundoff.torch.emulate on the IPU's AMP with fp16 inputs and float partials
(f16v4sisoamp) or half partials (f16v4hihoamp, --use-float16-partials); every GEMM's
output (activations, input and weight gradients) is fp16, the overflow policy NaN, and
OFLO, DIV0 and INV are counted (/fp_counts). The parameters are fp32 master weights, as
its fp32_parameter_getter keeps them: roundoff.torch.Adam with update fp32-master (fp32
Adam arithmetic and state, the weights rounded to fp16 after each step), the gradients
divided by S in fp16. What stays in float32 (roundoff.torch): ReLU, the bias gradient,
the softmax cross-entropy and the loss scaling's product.

The test metrics evaluate the final weights (the fp16 values the AMP multiplies, for the
mixed rows) in torch float32 on the first test_samples test images: the emulated forward
pass of a thousand images on half partials costs minutes.
"""
import math
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

import roundoff.torch as rt
from roundoff.experiment import Result, experiment, metric, param, trace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402


def tutorial_model():
    """float32_parameter_updates.py's model_function, in torch."""
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.ReLU(),
                         nn.Conv2d(32, 32, 3, padding=1, bias=False),
                         nn.Flatten(), nn.Linear(32 * 28 * 28, 10))


@experiment(
    description="the IPU tutorial's float32_parameter_updates.py model on Fashion-MNIST: float32 against mixed "
                "precision (fp16, fp32 master weights, S = 256) on the AMP with float and half partials",
    params=[param("unit", str, "ipu-amp", "float32: torch float32, not emulated; ipu-amp: fp16 inputs, float "
                                          "partials; ipu-amp-half: half partials",
                  allowed=["float32", "ipu-amp", "ipu-amp-half"]),
            param("train_samples", int, 1024, "the first N Fashion-MNIST training images (0: all 60,000)",
                  min=0, max=60000),
            param("test_samples", int, 2000, "the first N test images (0: all 10,000)", min=0, max=10000),
            param("epochs", int, 1, "passes over the training images", min=1),
            param("batch", int, 32, "images per step", min=1),
            param("lr", float, 0.01, "Adam's learning rate", min=0.0),
            param("eps", float, 1.0e-4, "Adam's epsilon", min=0.0),
            param("loss_scale", float, 256.0, "static loss scale S", min=1.0)],
    metrics=[metric("final_test_acc", "test accuracy of the final weights (torch float32 arithmetic)"),
             metric("final_test_loss", "test cross-entropy of the final weights (torch float32 arithmetic)"),
             metric("final_train_loss", "mean training loss (as computed) over the last epoch"),
             metric("nonfinite_steps", "steps whose loss was inf or NaN")],
    traces=[trace("loss", "training loss per step, as computed")],
    headline="final_test_acc")
def run(params, replica, seed):
    x, y, x_test, y_test = fashion_mnist.load(params["train_samples"], params["test_samples"])
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the initial weights
    model = tutorial_model()
    mixed = params["unit"] != "float32"
    if mixed:
        model = rt.emulate(model, unit=params["unit"], out_format="fp16", act_format="fp16", grad_format="fp16",
                           overflow="nan", fp_exceptions="count", seed=seed)
    optimizer = rt.Adam(model.parameters(), lr=params["lr"], eps=params["eps"],
                        update="fp32-master" if mixed else "fp32")
    scaler = rt.LossScaler(params["loss_scale"], unscale_format="fp16" if mixed else "auto")
    steps_per_epoch = len(x) // params["batch"]  # the tutorial drops the remainder
    losses = []
    for epoch in range(params["epochs"]):
        order = torch.randperm(len(x), generator=g)
        for step in range(steps_per_epoch):
            batch = order[step * params["batch"]:(step + 1) * params["batch"]]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[batch]), y[batch])
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
    evaluated = tutorial_model()
    evaluated.load_state_dict(model.state_dict())
    with torch.no_grad():
        logits = torch.cat([evaluated(xb) for xb in x_test.split(500)])
    last_epoch = losses[-steps_per_epoch:]
    return Result(metrics={"final_test_acc": (logits.argmax(1) == y_test).double().mean().item(),
                           "final_test_loss": F.cross_entropy(logits, y_test).item(),
                           "final_train_loss": sum(last_epoch) / len(last_epoch),
                           "nonfinite_steps": sum(not math.isfinite(v) for v in losses)},
                  traces={"loss": (list(range(len(losses))), losses)},
                  fp_counts=rt.exception_table(model) if mixed else None)
