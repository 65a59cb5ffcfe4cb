"""roundoff.torch: a PyTorch model (CPU, torch 1.13) on roundoff's emulated units.

    import torch, roundoff.torch as rt
    y, flags = rt.round(torch.randn(4), "fp16", "sr", seed=7)      # (tensor, Flags)
    y = rt.quantize(x, "fp8-e4m3", grad_format="fp8-e5m2")            # autograd
    model = rt.emulate(model, unit="h100", act_format="fp16", grad_format="fp16",
                       fp_exceptions="count")                         # same model, same parameters
    loss(model(x)).backward()
    rt.exception_table(model)                                         # pandas DataFrame

What is emulated. emulate() makes every nn.Linear and nn.Conv2d (any stride, padding,
dilation and groups, depthwise included; padding_mode "zeros") compute its three GEMMs
through the unit, bit for bit as roundoff.matmul computes them:
    Linear   forward          x (M x in) @ weight.T (in x out), C = bias
             backward.input   grad (M x out) @ weight (out x in)
             backward.weight  grad.T (out x M) @ x (M x in)
    Conv2d   forward          weight.reshape(out_channels, -1) (A) @ unfold(x) (B), C = bias
             backward.input   weight.reshape(out_channels, -1).T @ grad, then fold
             backward.weight  grad @ unfold(x).T
where M is every leading dimension of x flattened, and a convolution's k runs as torch's
unfold orders it: input channel, then kernel row, then kernel column (the order decides
a tensor core's bits). A convolution's GEMM takes the whole batch at once: its columns
are (image, output position) and the backward.weight's k is (image, output position).
With groups > 1 each group is its own GEMM. The operands are rounded into the unit's
input format with rne (a block format: A's rows and B's columns quantised along k, nvfp4
with one tensor scale per matrix, as roundoff.matmul quantises them), the bias into its
output format. grad_in_format gives the gradient operand of the backward GEMMs its own
format (mixed inputs; FP8 training's hybrid recipe: e4m3 forward, e5m2 gradients):
    rt.emulate(model, unit="mi300x", in_format="fp8-e4m3fnuz", grad_in_format="fp8-e5m2fnuz")
runs backward.input and backward.weight with the gradient in fp8-e5m2fnuz and the
weight or activation in fp8-e4m3fnuz (in_format "fp8-e5m2fnuz:fp8-e4m3fnuz" where the
gradient is A, as in every GEMM above but Conv2d's backward.input).

Stays in the tensor's dtype (float32): the bias gradient (a sum over the batch),
fold's sum of overlapping windows in backward.input (added in float64, rounded once to
the tensor's dtype), and every operation that is not a Linear or Conv2d: batch norm,
layer norm, softmax, GeLU/ReLU, pooling, residual adds, attention's own matmuls
(nn.MultiheadAttention calls its projections without their forward: emulate refuses it
unless keep_float32 names it). round_output(model, module...) rounds any module's
output into act_format (and the gradient arriving there into grad_format), so that a
transformer block can be rounded after every operation.

Rounding between layers: each emulated module's output is rounded into act_format
(act_rounding), and the gradient it passes back (at its input) into grad_format
(grad_rounding); fp32 on a float32 model adds no rounding.

Seeds. Every stream of random bits (the unit's stochastic rounding, act and grad
rounding) has the seed layer_seed(seed, scope, op, call): the first 8 bytes (little
endian) of BLAKE2b of "seed/scope/op/call", with scope the module's qualified name, op
one of forward, backward.input, backward.weight, round.forward, round.backward (".g"
appended for group g > 0 of a grouped convolution) and call the module's count of
forward calls since emulate (from 0; backward takes its forward's). The same model,
data and seed give the same bits in every run.

Exceptions. fp_exceptions="count" counts OFLO, DIV0 and INV (NaN from NANOO
included) per (scope, op, unit operation, flag) with the first element (the GEMM's
[row, column]; the tensor's flat index for round) and its operands; exception_table
gives them. "trap" raises roundoff.FloatingPointTrap at the first one (scope: the
module, op: the GEMM's role or round).

Optimizers and loss scaling, with the train experiment's semantics and parameter names:
SGD (momentum, weight_decay) and Adam keep the weights in weight_format and update them
by one of the rules fp16-rn, fp16-sr, fp16-kahan, fp32-master (or fp32); LossScaler is a
static or dynamic loss scale (ls_init, ls_backoff, ls_growth, ls_interval; a step with an
inf/NaN gradient is skipped). fastai's schedule is
LossScaler("dynamic", ls_init=2**24, ls_interval=500). help(SGD), help(LossScaler).
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as error:
    raise ImportError("roundoff.torch needs PyTorch: scripts/setup --torch installs Debian's python3-torch "
                      "and python3-torchvision") from error

from ._tensor import quantize, round  # noqa: E402
from ._emulate import emulate, exception_table, layer_seed, round_output  # noqa: E402
from ._optim import SGD, Adam, UPDATE_RULES, sr_seed  # noqa: E402
from ._scaling import LossScaler  # noqa: E402

__all__ = ["round", "quantize", "emulate", "exception_table", "round_output", "layer_seed",
           "SGD", "Adam", "UPDATE_RULES", "sr_seed", "LossScaler"]
