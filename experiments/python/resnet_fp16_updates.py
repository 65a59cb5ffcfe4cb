"""A ResNet on Fashion-MNIST with fp16 weights and updates (configs/resnet_fp16_updates.yaml).

The ResNet of He et al. (2016) for small images, depth 6N + 2 (N = 1: ResNet-8, N = 3:
ResNet-20) with 16/32/64 channels, written here in torch for 28x28 greyscale images: a 3x3
convolution and batch norm, three stages of N basic blocks (3x3 conv, BN, ReLU, 3x3 conv,
BN, plus the shortcut, ReLU; the second and third stages halve the resolution, their first
shortcut a 1x1 convolution with stride 2 and BN), global average pooling and a linear
classifier.

The weights are stored in fp16 and updated by roundoff.torch.SGD (momentum 0.9) under one
of its update rules: fp16-rn (w - delta rounded to nearest: an update below half an ulp
of w is lost, swamping), fp16-sr (rounded stochastically), fp32-master (an fp32 master
copy, rounded to fp16 after each step) or fp32 (everything fp32). The learning rate
decays (cosine to 0, or step: x0.1 at half and at three quarters of the steps), so the
updates shrink as training goes on, which is where swamping bites. Forward and backward
run in torch float32 on the stored fp16 values: only storage and update are low
precision, so the rows differ in nothing else. The question: when does the
round-to-nearest run stop improving? last_improvement_step is the step at which the
training loss, averaged over the last `smooth` steps, was last at a new minimum.

resnet_bn_fp16.py asks fastai's batch-norm question of the same model and loop.
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


class BasicBlock(nn.Module):
    def __init__(self, channels_in, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or channels_in != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """Depth 6 blocks + 2 for 1 x 28 x 28 images, 10 classes."""

    def __init__(self, blocks, width):
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        stages, channels_in = [], width
        for stage in range(3):
            channels = width << stage
            for b in range(blocks):
                stages.append(BasicBlock(channels_in, channels, 2 if stage and not b else 1))
                channels_in = channels
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(channels_in, 10)

    def forward(self, x):
        out = self.stages(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


PARAMS = [
    param("update", str, "fp16-rn", "how weights are stored and updated (roundoff.torch.SGD's update rule)",
          allowed=list(rt.UPDATE_RULES)),
    param("blocks", int, 3, "basic blocks per stage N (depth 6N + 2: 3 = ResNet-20)", min=1),
    param("width", int, 16, "channels of the first stage (doubled per stage)", min=1),
    param("train_samples", int, 2048, "the first N Fashion-MNIST training images (0: all 60,000)", min=0,
          max=60000),
    param("test_samples", int, 2000, "the first N test images (0: all 10,000)", min=0, max=10000),
    param("epochs", int, 4, "passes over the training images", min=1),
    param("batch", int, 32, "images per step", min=1),
    param("lr", float, 0.1, "peak learning rate", min=0.0),
    param("momentum", float, 0.9, "SGD momentum", min=0.0, max=1.0),
    param("schedule", str, "cosine", "learning-rate decay over the steps: cosine to 0, step (x0.1 at 1/2 and 3/4) "
          "or constant", allowed=["cosine", "step", "constant"]),
    param("smooth", int, 32, "steps in the moving average of the loss that last_improvement_step reads", min=1),
]


def learning_rate(lr, schedule, step, steps):
    if schedule == "cosine":
        return lr * 0.5 * (1 + math.cos(math.pi * step / steps))
    if schedule == "step":
        return lr * (0.1 if step >= steps // 2 else 1.0) * (0.1 if step >= 3 * steps // 4 else 1.0)
    return lr


def stored(optimizer, p):
    """The value the update rule keeps for p: its fp32 master copy, else p itself."""
    return optimizer.state[p].get("master", p)


class Training:
    """One training run: the model, its optimizers (batch norm's own with bn_fp32) and what
    the steps recorded."""

    def __init__(self, params, seed, bn_fp32=False):
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # the model's initial weights
        self.model = ResNet(params["blocks"], params["width"])
        self.params = params
        x, y, self.x_test, self.y_test = fashion_mnist.load(params["train_samples"], params["test_samples"])
        bn = [p for m in self.model.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()]
        others = [p for p in self.model.parameters() if all(p is not q for q in bn)]
        options = dict(lr=params["lr"], momentum=params["momentum"], seed=seed)
        self.optimizers = ([rt.SGD(others, update=params["update"], **options),
                            rt.SGD(bn, update="fp32", **options)] if bn_fp32 else
                           [rt.SGD(self.model.parameters(), update=params["update"], **options)])
        self.owner = {p: o for o in self.optimizers for group in o.param_groups for p in group["params"]}
        steps_per_epoch = len(x) // params["batch"]
        self.steps = steps_per_epoch * params["epochs"]
        self.losses, self.lrs, self.lost = [], [], []
        self.model.train()
        for step in range(self.steps):
            if step % steps_per_epoch == 0:
                order = torch.randperm(len(x), generator=g)
            batch = order[(step % steps_per_epoch) * params["batch"]:][:params["batch"]]
            lr = learning_rate(params["lr"], params["schedule"], step, self.steps)
            for o in self.optimizers:
                o.zero_grad()
                for group in o.param_groups:
                    group["lr"] = lr
            loss = F.cross_entropy(self.model(x[batch]), y[batch])
            loss.backward()
            before = [stored(self.owner[p], p).clone() for p in self.model.parameters()]
            for o in self.optimizers:
                o.step()
            moved = nonzero = 0
            for p, old in zip(self.model.parameters(), before):
                pushed = p.grad != 0
                nonzero += int(pushed.sum())
                moved += int((pushed & (stored(self.owner[p], p) != old)).sum())
            self.losses.append(loss.item())
            self.lrs.append(lr)
            self.lost.append(1 - moved / nonzero if nonzero else math.nan)

    def smoothed_losses(self):
        window, out, total = self.params["smooth"], [], 0.0
        for i, loss in enumerate(self.losses):
            total += loss - (self.losses[i - window] if i >= window else 0.0)
            out.append(total / min(i + 1, window))
        return out

    def last_improvement_step(self):
        """The step at which the smoothed loss (from its first full window on) was last at
        a new minimum."""
        smoothed = self.smoothed_losses()
        start = min(self.params["smooth"], len(smoothed)) - 1
        return min(range(start, len(smoothed)), key=lambda i: (smoothed[i], i))

    def evaluate(self):
        """(test loss, test accuracy) in float32 with batch norm's running statistics."""
        self.model.eval()
        with torch.no_grad():
            logits = torch.cat([self.model(xb) for xb in self.x_test.split(500)])
        self.model.train()
        return F.cross_entropy(logits, self.y_test).item(), (logits.argmax(1) == self.y_test).double().mean().item()

    def final_train_loss(self):
        return self.smoothed_losses()[-1]

    def frac_lost_updates(self):
        finite = [v for v in self.lost if not math.isnan(v)]
        return sum(finite) / len(finite) if finite else math.nan


@experiment(
    description="ResNet (6N+2) on Fashion-MNIST with fp16 weights: fp16-rn against fp16-sr against fp32 master "
                "weights under a decaying learning rate; when does round to nearest stop improving?",
    params=PARAMS,
    metrics=[metric("last_improvement_step", "the step at which the training loss averaged over the last `smooth` "
                                             "steps was last at a new minimum (from the first full window on)"),
             metric("steps", "optimizer steps taken"),
             metric("final_train_loss", "training loss averaged over the last `smooth` steps"),
             metric("final_test_loss", "test cross-entropy of the final weights (float32 arithmetic)"),
             metric("final_test_acc", "test accuracy of the final weights (float32 arithmetic)"),
             metric("frac_lost_updates", "per step, the fraction of values with a non-zero gradient whose stored "
                                         "state (the master copy under fp32-master) the step left unchanged, "
                                         "averaged over the steps: swamping")],
    traces=[trace("loss", "training loss per step"),
            trace("smoothed_loss", "training loss averaged over the last `smooth` steps"),
            trace("lr", "learning rate per step"),
            trace("lost_updates", "per step, the fraction of values with a non-zero gradient left unchanged")],
    headline="last_improvement_step")
def run(params, replica, seed):
    t = Training(params, seed)
    test_loss, test_acc = t.evaluate()
    steps = list(range(t.steps))
    return Result(metrics={"last_improvement_step": t.last_improvement_step(), "steps": t.steps,
                           "final_train_loss": t.final_train_loss(), "final_test_loss": test_loss,
                           "final_test_acc": test_acc, "frac_lost_updates": t.frac_lost_updates()},
                  traces={"loss": (steps, t.losses), "smoothed_loss": (steps, t.smoothed_losses()),
                          "lr": (steps, t.lrs), "lost_updates": (steps, t.lost)})
