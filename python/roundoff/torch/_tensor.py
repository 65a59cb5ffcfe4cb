"""roundoff.torch.round and quantize: tensors rounded into an emu format."""
import torch

import roundoff

# (fraction bits, emin, emax) of the dtypes a tensor may have here.
_DTYPES = {torch.float16: (10, -14, 15), torch.bfloat16: (7, -126, 127), torch.float32: (23, -126, 127),
           torch.float64: (52, -1022, 1023)}


def check_tensor(t, name):
    """t as a CPU tensor of a dtype roundoff.torch takes (TypeError otherwise)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{name} is on {t.device}: roundoff.torch takes CPU tensors (move it with .cpu())")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} is {t.dtype}: roundoff.torch takes float32, float64, float16 and bfloat16 tensors")
    return t


def fits(format, dtype):
    """Whether every value of `format` is a value of `dtype` (a torch floating dtype)."""
    info = roundoff.info(format)
    fraction, emin, emax = _DTYPES[dtype]
    return (info["fraction_bits"] <= fraction and info["emax"] <= emax
            and info["emin"] - info["fraction_bits"] >= emin - fraction)


def round(t, format, rounding="rne", *, seed=0, sr_bits=0, subnormals=True, overflow="inf", rng="philox",
          tininess="before"):
    """t's elements rounded once into `format`; returns (tensor, roundoff.Flags).

    The options, their checks and errors, the bits and the flags are roundoff.round's on
    t's values (float16 and bfloat16 values read exactly). The result has t's dtype where
    every value of the format is one of it (so a float16 or bfloat16 tensor rounded into
    its own format comes back bit for bit), else roundoff.round's (float32 where the
    format's values are float32 values, else float64). A contiguous float32 tensor is
    read in place (shared through numpy, no copy); the result is a new tensor. Not
    differentiable (quantize is).
    """
    check_tensor(t, "t")
    source = t.detach()
    if source.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        source = source.float()
    values, flags = roundoff.round(source.numpy(), format, rounding, seed=seed, sr_bits=sr_bits,
                                   subnormals=subnormals, overflow=overflow, rng=rng, tininess=tininess)
    result = torch.from_numpy(values)
    if result.dtype != t.dtype and fits(format, t.dtype):
        result = result.to(t.dtype)
    return result, flags


class _Quantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, forward_options, backward_options):
        ctx.backward_options = backward_options
        return round(t, **forward_options)[0]

    @staticmethod
    def backward(ctx, grad):
        if ctx.backward_options is None:
            return grad, None, None
        return round(grad, **ctx.backward_options)[0], None, None


def quantize(t, format, rounding="rne", *, seed=0, sr_bits=0, subnormals=True, overflow="inf", rng="philox",
             tininess="before", grad_format=None, grad_rounding="rne", grad_seed=0):
    """round(t, format, ...) as an autograd operation; returns the tensor (t's dtype).

    Backward passes the gradient straight through, or with grad_format rounds it into
    that format with grad_rounding and grad_seed (sr_bits, subnormals, overflow, rng and
    tininess as forward). ValueError where the format has values t's dtype lacks (a
    bfloat16 tensor into fp16: quantize a float32 tensor instead).
    """
    check_tensor(t, "t")
    for name, f in (("format", format), ("grad_format", grad_format)):
        if f is not None and not fits(f, t.dtype):
            raise ValueError(f"quantize: {name} {f} has values that are not {t.dtype} values: quantize a "
                             f"float32 or float64 tensor")
    common = dict(sr_bits=sr_bits, subnormals=subnormals, overflow=overflow, rng=rng, tininess=tininess)
    forward_options = dict(format=format, rounding=rounding, seed=seed, **common)
    backward_options = None if grad_format is None else dict(format=grad_format, rounding=grad_rounding,
                                                             seed=grad_seed, **common)
    return _Quantize.apply(t, forward_options, backward_options)
