"""fastai's batch-norm question on the torch ResNet (configs/resnet_bn_fp16.yaml): do the
batch-norm scales (gamma, starting at exactly 1.0) move when they are stored and updated in
fp16?

fastai reported that fp16 training falls behind fp32, that keeping batch norm in fp32 and
fp32 master weights recover it, and that the batch-norm weights' standard deviation was
exactly 0 in fp16: every scale still at 1.0, where an fp16 update smaller than half an ulp
(2^-11) is lost. The model, data and training loop are resnet_fp16_updates.py's (forward
and backward in torch float32 on the stored values, momentum SGD, decaying learning rate);
the rows differ in how the parameters are stored and updated: update (fp32, fp16-rn,
fp16-sr, fp32-master) and bn_fp32 (batch norm's scales and shifts stored and updated in
fp32 by their own roundoff.torch.SGD, every other parameter by `update`). The metrics and
traces are those of the train experiment's bn_fp16.yaml: per batch-norm layer (the stem's,
then each block's bn1, bn2 and shortcut), the standard deviation of its scales across
channels and the fraction still exactly 1.0, of their stored state (the master copy under
fp32-master).
"""
import os
import sys

from torch import nn

from roundoff.experiment import Result, experiment, metric, param, trace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet_fp16_updates import PARAMS, Training, stored  # noqa: E402


@experiment(
    description="fastai's batch-norm question on a ResNet (6N+2) on Fashion-MNIST: fp16 weights against batch "
                "norm in fp32 against fp32 master weights; do the batch-norm scales move from 1.0?",
    params=PARAMS + [param("bn_fp32", bool, False, "batch norm's scales and shifts stored and updated in fp32")],
    metrics=[metric("final_test_acc", "test accuracy of the final weights (float32 arithmetic)"),
             metric("final_test_loss", "test cross-entropy of the final weights (float32 arithmetic)"),
             metric("final_train_loss", "training loss averaged over the last `smooth` steps"),
             metric("frac_lost_updates", "per step, the fraction of values with a non-zero gradient whose stored "
                                         "state the step left unchanged, averaged over the steps: swamping"),
             metric("bn_scale_std_min", "the smallest, over batch-norm layers, standard deviation of the layer's "
                                        "scales (gamma) across channels at the end, of their stored state; 0 = "
                                        "some layer's scales are all equal (all still 1: never moved)"),
             metric("bn_scale_unchanged", "fraction of all batch-norm scales (they start at 1) whose stored state "
                                          "is still exactly 1 at the end"),
             metric("bn_shift_unchanged", "the same for the batch-norm shifts (beta; they start at 0)"),
             metric("bn_layers_unchanged", "batch-norm layers whose every scale is still exactly 1 at the end")],
    traces=[trace("loss", "training loss per step"),
            trace("bn_scale_std", "per batch-norm layer (the stem's, then each block's bn1, bn2 and "
                                  "shortcut), at the end: the standard deviation of its scales across "
                                  "channels, of their stored state", x_name="bn_layer"),
            trace("bn_scale_unchanged", "per batch-norm layer (as bn_scale_std), at the end: the fraction of "
                                        "its scales still exactly 1", x_name="bn_layer")],
    headline="bn_scale_unchanged")
def run(params, replica, seed):
    t = Training(params, seed, bn_fp32=params["bn_fp32"])
    test_loss, test_acc = t.evaluate()
    stds, unchanged, shifts = [], [], []
    for m in t.model.modules():
        if isinstance(m, nn.BatchNorm2d):
            scale, shift = stored(t.owner[m.weight], m.weight), stored(t.owner[m.bias], m.bias)
            stds.append(scale.double().std(unbiased=False).item())
            unchanged.append((scale == 1).double().mean().item())
            shifts.append(((shift == 0).sum().item(), shift.numel()))
    layers = list(range(1, len(stds) + 1))
    channels = [m.num_features for m in t.model.modules() if isinstance(m, nn.BatchNorm2d)]
    steps = list(range(t.steps))
    return Result(metrics={"final_test_acc": test_acc, "final_test_loss": test_loss,
                           "final_train_loss": t.final_train_loss(), "frac_lost_updates": t.frac_lost_updates(),
                           "bn_scale_std_min": min(stds),
                           "bn_scale_unchanged": sum(u * c for u, c in zip(unchanged, channels)) / sum(channels),
                           "bn_shift_unchanged": sum(s for s, _ in shifts) / sum(n for _, n in shifts),
                           "bn_layers_unchanged": sum(u == 1 for u in unchanged)},
                  traces={"loss": (steps, t.losses), "bn_scale_std": (layers, stds),
                          "bn_scale_unchanged": (layers, unchanged)})
