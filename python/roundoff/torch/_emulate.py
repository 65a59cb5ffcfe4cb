"""roundoff.torch.emulate: nn.Linear and nn.Conv2d through an emulated matrix unit
(the package's docstring says what is emulated, what stays float32 and how seeds are
derived); exception_table and round_output."""
import functools
import hashlib

import torch
from torch import nn
from torch.nn import functional as F

import roundoff
from roundoff import _core

from ._tensor import check_tensor

_EMULATED = (nn.Linear, nn.Conv2d)
# Modules whose GEMMs do not go through an emulated module's forward: emulate refuses
# them unless keep_float32 names them (MultiheadAttention calls its projections'
# weights directly).
_NOT_EMULATED = (nn.Conv1d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.RNNBase,
                 nn.MultiheadAttention, nn.Bilinear)
_FP_EXCEPTIONS = ("off", "count", "trap")


def layer_seed(seed, scope, op, call):
    """The seed of one stream of random bits of an emulated module (see roundoff.torch)."""
    text = f"{seed}/{scope}/{op}/{call}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _text(value, name):
    if not isinstance(value, str):
        raise TypeError(f"emulate: {name} must be a str, not {type(value).__name__}")
    return value


def _mixed_inputs(a, b):
    """The in_format naming A's format a and B's format b: "a", or the mixed inputs "a:b"."""
    return a if a == b else f"{a}:{b}"


def _format(value, name):
    try:
        roundoff.info(_text(value, name))
    except ValueError as error:
        raise ValueError(f"emulate: {name}={value!r}: {error}") from None
    return value


class _Emulation:
    """The settings of one emulate() call and the exceptions counted under it."""

    def __init__(self, unit, in_format, grad_in_format, out_format, scale_rule, act_format, grad_format, rounding,
                 act_rounding, grad_rounding, seed, sr_bits, esr, overflow, tininess, fp_exceptions):
        if _text(fp_exceptions, "fp_exceptions") not in _FP_EXCEPTIONS:
            raise ValueError(f"emulate: fp_exceptions={fp_exceptions!r}: expected one of {', '.join(_FP_EXCEPTIONS)}")
        for value, name in ((in_format, "in_format"), (grad_in_format, "grad_in_format"), (out_format, "out_format"),
                            (scale_rule, "scale_rule")):
            if value is not None:
                _text(value, name)
        for value, name in ((seed, "seed"), (sr_bits, "sr_bits")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"emulate: {name} must be a non-negative int, not {value!r}")
        if not isinstance(esr, bool):
            raise TypeError(f"emulate: esr must be a bool, not {type(esr).__name__}")
        def unit_for(formats):
            return _core.TorchUnit(_text(unit, "unit"), formats, out_format, scale_rule, _text(rounding, "rounding"),
                                   sr_bits, _text(overflow, "overflow"), _text(tininess, "tininess"), esr,
                                   fp_exceptions)
        try:
            self.unit = unit_for(in_format)
            # The unit of each GEMM by which operand is the gradient (None: neither, the
            # forward). With grad_in_format, the gradient takes it and the other operand
            # the forward's input format: the mixed inputs grad:in (gradient as A) or in:grad.
            self.units = dict.fromkeys((None, "A", "B"), self.unit)
            if grad_in_format is not None:
                forward_in = self.unit.input_format
                self.units["A"] = unit_for(_mixed_inputs(grad_in_format, forward_in))
                self.units["B"] = unit_for(_mixed_inputs(forward_in, grad_in_format))
        except ValueError as error:
            raise ValueError(f"emulate: unit={unit!r} (in_format={in_format!r}, grad_in_format={grad_in_format!r}, "
                             f"out_format={out_format!r}, scale_rule={scale_rule!r}, rounding={rounding!r}, "
                             f"overflow={overflow!r}, tininess={tininess!r}): {error}") from None
        for value, name in ((act_rounding, "act_rounding"), (grad_rounding, "grad_rounding")):
            if _text(value, name) not in ("rne", "rna", "rz", "ru", "rd", "ro", "sr"):
                raise ValueError(f"emulate: {name}={value!r}: expected rne rna rz ru rd ro sr")
        self.act = (_format(act_format, "act_format"), act_rounding)
        self.grad = (_format(grad_format, "grad_format"), grad_rounding)
        self.seed, self.sr_bits, self.overflow, self.tininess = seed, sr_bits, overflow, tininess
        self.counts = {}  # (scope, op, unit_op, flag) -> [count, element, operands, result]

    def record(self, scope, op, counts):
        for unit_op, flag, count, element, operands, result in counts:
            key = (scope, "round" if unit_op == "round" else op, unit_op, flag)
            if key in self.counts:
                self.counts[key][0] += count
            else:
                self.counts[key] = [count, element, operands, result]

    def round(self, t, format_and_rounding, scope, op, call):
        """t (contiguous, of this emulation's dtype) rounded in place; fp32 on float32: nothing."""
        format, rounding = format_and_rounding
        if format == "fp32" and t.dtype == torch.float32:
            return t
        values = t.detach().numpy()
        _, counts = _core.torch_round(values, values, format, rounding, layer_seed(self.seed, scope, op, call),
                                      self.sr_bits, self.overflow, self.tininess, True, self.unit.counted,
                                      self.unit.traps, scope)
        self.record(scope, op, counts)
        return t


def _view(t, stacked_by_columns, name):
    return _core.MatrixView(t.detach().numpy(), stacked_by_columns, name)


class _Layer:
    """An emulated module: its scope (qualified name), settings and forward calls."""

    def __init__(self, emulation, scope):
        self.emulation, self.scope, self.calls = emulation, scope, 0

    def next_call(self):
        self.calls += 1
        return self.calls - 1

    def gemm(self, op, call, A, B, out, *, a_columns=False, b_columns=False, out_columns=False, bias=None,
             bias_axis=1, gradient=None):
        """out = A B (+ bias) through the unit; rank-3 operands stack matrices by rows, or by
        columns where *_columns says so (_core.MatrixView). gradient: which operand ("A",
        "B") is the gradient in a backward GEMM (it picks the unit: grad_in_format)."""
        e = self.emulation
        bias = None if bias is None else bias.detach().numpy()
        _, counts = e.units[gradient].gemm(_view(A, a_columns, "A"), _view(B, b_columns, "B"), bias, bias_axis,
                                _view(out, out_columns, "out"), layer_seed(e.seed, self.scope, op, call), self.scope,
                                op.split(".g")[0])
        e.record(self.scope, op.split(".g")[0], counts)

    def check_input(self, x, module):
        check_tensor(x, f"{self.scope or 'the model'}'s input")
        if x.dtype != module.weight.dtype:
            raise TypeError(f"emulate: {self.scope} ({type(module).__name__}) got a {x.dtype} input for its "
                            f"{module.weight.dtype} weight")


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        call = layer.next_call()
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty(x2.shape[0], weight.shape[0], dtype=x.dtype)
        layer.gemm("forward", call, x2, weight.t(), out, bias=bias, bias_axis=1)
        layer.emulation.round(out, layer.emulation.act, layer.scope, "round.forward", call)
        ctx.save_for_backward(x2, weight)
        ctx.layer, ctx.call, ctx.x_shape, ctx.has_bias = layer, call, x.shape, bias is not None
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        layer, call = ctx.layer, ctx.call
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.empty_like(x2)
            layer.gemm("backward.input", call, g2, weight, grad_x, gradient="A")
            layer.emulation.round(grad_x, layer.emulation.grad, layer.scope, "round.backward", call)
            grad_x = grad_x.reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.empty_like(weight, memory_format=torch.contiguous_format)
            layer.gemm("backward.weight", call, g2.t(), x2, grad_weight, gradient="A")
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = g2.sum(0)
        return grad_x, grad_weight, grad_bias, None


def _conv_geometry(module, x):
    """(padding as F.pad takes it, padded height and width, output height and width)."""
    pad = list(module._reversed_padding_repeated_twice)  # left, right, top, bottom
    height, width = x.shape[2] + pad[2] + pad[3], x.shape[3] + pad[0] + pad[1]
    (kh, kw), (dh, dw), (sh, sw) = module.kernel_size, module.dilation, module.stride
    return pad, (height, width), ((height - dh * (kh - 1) - 1) // sh + 1, (width - dw * (kw - 1) - 1) // sw + 1)


class _Conv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer, module):
        call = layer.next_call()
        pad, padded, (oh, ow) = _conv_geometry(module, x)
        xp = F.pad(x, pad) if any(pad) else x
        cols = F.unfold(xp, module.kernel_size, dilation=module.dilation, stride=module.stride)  # N x K x L
        n, oc, groups = x.shape[0], weight.shape[0], module.groups
        w2 = weight.reshape(oc, -1)
        ocg, kg = oc // groups, w2.shape[1]
        out = torch.empty(n, oc, oh * ow, dtype=x.dtype)
        for g in range(groups):
            o, k = slice(g * ocg, (g + 1) * ocg), slice(g * kg, (g + 1) * kg)
            layer.gemm("forward" + (f".g{g}" if g else ""), call, w2[o], cols[:, k], out[:, o], b_columns=True,
                       out_columns=True, bias=None if bias is None else bias[o], bias_axis=0)
        layer.emulation.round(out, layer.emulation.act, layer.scope, "round.forward", call)
        ctx.save_for_backward(cols, weight)
        ctx.layer, ctx.call, ctx.module, ctx.geometry = layer, call, module, (x.shape, pad, padded)
        ctx.has_bias = bias is not None
        return out.view(n, oc, oh, ow)

    @staticmethod
    def backward(ctx, grad):
        cols, weight = ctx.saved_tensors
        layer, call, module = ctx.layer, ctx.call, ctx.module
        x_shape, pad, padded = ctx.geometry
        n, oc, groups = x_shape[0], weight.shape[0], module.groups
        w2 = weight.reshape(oc, -1)
        ocg, kg = oc // groups, w2.shape[1]
        g3 = grad.reshape(n, oc, -1)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # float64 columns: fold's sums of overlapping windows are exact for fp32 terms
            # of like magnitude, then rounded once.
            grad_cols = torch.empty(n, kg * groups, g3.shape[2], dtype=torch.float64)
            for g in range(groups):
                o, k = slice(g * ocg, (g + 1) * ocg), slice(g * kg, (g + 1) * kg)
                layer.gemm("backward.input" + (f".g{g}" if g else ""), call, w2[o].t(), g3[:, o], grad_cols[:, k],
                           b_columns=True, out_columns=True, gradient="B")
            folded = F.fold(grad_cols, padded, module.kernel_size, dilation=module.dilation, stride=module.stride)
            left, right, top, bottom = pad
            grad_x = folded[:, :, top:padded[0] - bottom, left:padded[1] - right].to(weight.dtype).contiguous()
            layer.emulation.round(grad_x, layer.emulation.grad, layer.scope, "round.backward", call)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.empty(oc, kg, dtype=weight.dtype)
            for g in range(groups):
                o, k = slice(g * ocg, (g + 1) * ocg), slice(g * kg, (g + 1) * kg)
                layer.gemm("backward.weight" + (f".g{g}" if g else ""), call, g3[:, o], cols[:, k].transpose(1, 2),
                           grad_weight[o], a_columns=True, gradient="A")
            grad_weight = grad_weight.view_as(weight)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = g3.sum((0, 2))
        return grad_x, grad_weight, grad_bias, None, None


def _linear_forward(module, layer, x):
    layer.check_input(x, module)
    return _LinearFunction.apply(x, module.weight, module.bias, layer)


def _conv2d_forward(module, layer, x):
    layer.check_input(x, module)
    if x.dim() != 4:
        raise ValueError(f"emulate: {layer.scope} (Conv2d) takes N x C x H x W inputs, not {tuple(x.shape)}")
    return _Conv2dFunction.apply(x, module.weight, module.bias, layer, module)


def _check_module(name, module):
    where = f"{name or 'the model'} ({type(module).__name__})"
    for p in module.parameters(recurse=False):
        if p.device.type != "cpu":
            raise TypeError(f"emulate: {where} is on {p.device}: roundoff.torch emulates CPU modules (model.cpu())")
        if p.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"emulate: {where} has {p.dtype} parameters: roundoff.torch emulates float32 and "
                            f"float64 modules (the unit's formats say what precision the GEMMs have)")
    if isinstance(module, nn.Conv2d) and module.padding_mode != "zeros":
        raise ValueError(f"emulate: {where} has padding_mode={module.padding_mode!r}: only 'zeros' is emulated")


def _kept(name, module, keep_float32):
    return any((isinstance(k, str) and k == name) or (isinstance(k, type) and isinstance(module, k))
               for k in keep_float32)


def emulate(model, unit, *, in_format=None, grad_in_format=None, out_format=None, scale_rule=None, act_format="fp32",
            grad_format="fp32", rounding="rne", act_rounding="rne", grad_rounding="rne", seed=0, sr_bits=0, esr=False,
            overflow="inf", tininess="before", fp_exceptions="off", keep_float32=()):
    """Runs every nn.Linear and nn.Conv2d of `model` through `unit`; returns `model` itself.

    unit, in_format, out_format, scale_rule, rounding, sr_bits, overflow, tininess: as
    roundoff.matmul (in_format a block format: b200's block-scaled MMA, or the reference
    units exact, fp32-seq and fp16-seq on its dequantised values; "A:B" the mixed inputs
    A's and B's formats, mi300x's fp8 with bf8). grad_in_format: the gradient's format in
    the backward GEMMs (default: as the forward's), the other operand staying in the
    forward's input format: the mixed inputs grad_in_format:in_format where the gradient
    is A, in_format:grad_in_format where it is B. FP8 training's "hybrid" recipe (e4m3
    forward, e5m2 gradients): unit="mi300x", in_format="fp8-e4m3fnuz",
    grad_in_format="fp8-e5m2fnuz"; a unit without mixed inputs refuses it. esr: $FP_CTL.ESR (the
    IPU's stochastic rounding of its fp16 roundings: ipu-amp-half's partials; ipu-amp's
    fp32 partials round to nearest, as the hardware's do). act_format/act_rounding: each emulated module's output rounded
    into it; grad_format/grad_rounding: the gradient each passes back; sr_bits,
    overflow and tininess apply to those roundings too. seed: see roundoff.torch.
    fp_exceptions: "off", "count" (exception_table) or "trap" (FloatingPointTrap).
    keep_float32: module classes or qualified names left as they are (with their
    submodules). The parameters stay the module's own; emulating a model again replaces
    the earlier settings. TypeError/ValueError name the module or option at fault.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"emulate: model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(keep_float32, (tuple, list, set)):
        keep_float32 = (keep_float32,)
    emulation = _Emulation(unit, in_format, grad_in_format, out_format, scale_rule, act_format, grad_format, rounding,
                           act_rounding, grad_rounding, seed, sr_bits, esr, overflow, tininess, fp_exceptions)
    kept, chosen, fused = [], [], []
    for name, module in model.named_modules():
        if any(name == k or name.startswith(k + ".") for k in kept):
            continue
        if _kept(name, module, keep_float32):
            kept.append(name)
            continue
        if isinstance(module, _EMULATED):
            _check_module(name, module)
            chosen.append((name, module))
        elif isinstance(module, nn.TransformerEncoderLayer):
            fused.append(module)
        elif isinstance(module, _NOT_EMULATED):
            raise TypeError(f"emulate: {name or 'the model'} ({type(module).__name__}) computes GEMMs that "
                            f"roundoff.torch does not emulate (nn.Linear and nn.Conv2d): pass keep_float32="
                            f"(nn.{type(module).__name__},) to leave it in float32")
    # In eval mode without autograd, torch's TransformerEncoderLayer (and the
    # TransformerEncoder over it) takes a fused kernel that reads linear1/linear2's weights
    # without calling their forward, so their GEMMs would silently stay float32. torch 1.13
    # takes that path only where activation_relu_or_gelu is set; the ordinary path calls
    # self.activation, which this flag does not change.
    for module in fused:
        module.activation_relu_or_gelu = 0
    # An earlier emulate's forwards go first: a module now kept in float32 is float32 again.
    for module in model.modules():
        earlier = module.__dict__.get("forward")
        if isinstance(earlier, functools.partial) and earlier.func in (_linear_forward, _conv2d_forward):
            del module.forward
    for name, module in chosen:
        forward = _linear_forward if isinstance(module, nn.Linear) else _conv2d_forward
        module.forward = functools.partial(forward, module, _Layer(emulation, name))
    model._roundoff_emulation = emulation
    return model


def _emulation_of(model, caller):
    emulation = getattr(model, "_roundoff_emulation", None)
    if emulation is None:
        raise ValueError(f"{caller}: the model is not emulated (roundoff.torch.emulate(model, ...) first)")
    return emulation


def exception_table(model):
    """The exceptions counted under emulate(model, ..., fp_exceptions="count"), in the order
    first raised: a pandas DataFrame with scope (module), op (forward, backward.input,
    backward.weight, round), unit_op (the unit's operation: mma, amp, fma, convert for
    an operand's or bias's rounding into the unit's formats, quantize, round), flag,
    count (elements), element (the first: [row, column] of the GEMM, or (flat index,)
    of a rounded tensor), operands and result (its would-be result)."""
    import pandas
    emulation = _emulation_of(model, "exception_table")
    rows = [(scope, op, unit_op, flag, count, element, operands, result)
            for (scope, op, unit_op, flag), (count, element, operands, result) in emulation.counts.items()]
    return pandas.DataFrame(rows, columns=["scope", "op", "unit_op", "flag", "count", "element", "operands", "result"])


class _RoundOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, layer):
        call = layer.next_call()
        ctx.layer, ctx.call = layer, call
        return layer.emulation.round(t.contiguous().clone(), layer.emulation.act, layer.scope, "round.forward", call)

    @staticmethod
    def backward(ctx, grad):
        e = ctx.layer.emulation
        return e.round(grad.contiguous().clone(), e.grad, ctx.layer.scope, "round.backward", ctx.call), None


def round_output(model, *modules):
    """Rounds the output of each given module of an emulated model into its act_format
    (and the gradient arriving there into grad_format), counted under the module's
    qualified name as op "round". modules: module objects, qualified names or classes
    (every module of the class). Returns the hooks' handles (handle.remove() undoes)."""
    emulation = _emulation_of(model, "round_output")
    handles, found = [], set()
    for name, module in model.named_modules():
        for wanted in modules:
            if wanted is module or wanted == name or (isinstance(wanted, type) and isinstance(module, wanted)):
                found.add(id(wanted) if not isinstance(wanted, str) else wanted)
                layer = _Layer(emulation, name)
                handles.append(module.register_forward_hook(functools.partial(_round_hook, layer)))
                break
    for wanted in modules:
        if (wanted if isinstance(wanted, str) else id(wanted)) not in found:
            raise ValueError(f"round_output: {wanted!r} is not a module of the model")
    return handles


def _round_hook(layer, module, inputs, output):
    if isinstance(output, torch.Tensor):
        return _RoundOutput.apply(output, layer)
    if isinstance(output, tuple):
        return tuple(_RoundOutput.apply(o, layer) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                     for o in output)
    return output
