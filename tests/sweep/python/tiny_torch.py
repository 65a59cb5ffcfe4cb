"""A tiny PyTorch model for the Python-experiment tests of build/sweep (tests/sweep/test_python.py).

A linear regression trained by SGD on data drawn from the run's seed: every number depends
on the parameters, the replica and the seed alone, so -j1 and -j2 must give the same bits.
"""

import time

import torch

from roundoff.experiment import Result, experiment, metric, param, trace


@experiment(
    description="linear regression by SGD in float32 (a test model)",
    params=[param("lr", float, 0.05, "learning rate", min=0.0),
            param("steps", int, 20, "SGD steps", min=1, max=1000),
            param("width", int, 8, "input features", min=1),
            param("pause", float, 0.0, "seconds to sleep per run (for the interruption test)", min=0.0),
            param("optimizer", str, "sgd", "the update rule", allowed=["sgd", "momentum"]),
            param("count_exceptions", bool, False, "return an exception-count row")],
    metrics=[metric("final_loss", "training loss after the last step"),
             metric("weight_norm", "2-norm of the learned weights")],
    traces=[trace("loss", "training loss", x_name="step")],
    headline="final_loss")
def run(params, replica, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, params["width"], generator=g)
    true_w = torch.randn(params["width"], 1, generator=g)
    y = x @ true_w + 0.1 * torch.randn(64, 1, generator=g)
    model = torch.nn.Linear(params["width"], 1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    momentum = 0.9 if params["optimizer"] == "momentum" else 0.0
    opt = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=momentum)
    losses = []
    for _ in range(params["steps"]):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    time.sleep(params["pause"])
    rows = None
    if params["count_exceptions"]:
        rows = [{"scope": "fc", "op": "matmul", "flag": "INEXACT", "count": params["steps"] + replica,
                 "element": 3, "operands": [1.5, -2.0]}]
    return Result(metrics={"final_loss": losses[-1], "weight_norm": model.weight.norm().item()},
                  traces={"loss": (list(range(len(losses))), losses)}, fp_counts=rows)
