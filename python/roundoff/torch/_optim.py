"""Optimizers whose weights are stored in a low-precision format: the update rules of the
`train` experiment (experiments/nn/mlp.hpp, Updater) on ordinary float32 torch parameters.

The arithmetic runs in C++ (roundoff._core.OptimizerKernel), element by element in one
pass over the float32 tensors' own memory: every operation is emu::Context's, the exact
result rounded once (inline double arithmetic where that gives Context's result, Context
itself elsewhere).
"""
import functools
import hashlib
import math
import numbers

import numpy as np
import torch

import roundoff
from roundoff import _core

__all__ = ["SGD", "Adam", "UPDATE_RULES", "sr_seed"]

# train's `update` parameter (kUpdateRuleNames).
UPDATE_RULES = ("fp32", "fp16-rn", "fp16-sr", "fp16-kahan", "fp32-master")


# ---- formats ----------------------------------------------------------------------------

class _Format:
    """A format whose values are all float32 values (parameters and state are float32
    tensors), with the two bits to spare below its last bit in every binade that rounding
    to odd through float32 needs (precision <= 22, exponents within float32's), or fp32
    itself."""

    def __init__(self, name, option):
        if not isinstance(name, str):
            raise TypeError(f"{option} must be a str (a format name), not {type(name).__name__}")
        try:
            info = roundoff.info(name)
        except ValueError as e:
            raise ValueError(f"{option}: {str(e).removeprefix('--format: ')}") from None
        smallest = info["min_subnormal"] if info["subnormals"] else info["min_normal"]
        self.name = name
        self.is_fp32 = (info["precision"] == 24 and info["emin"] == -126 and info["emax"] == 127
                        and info["subnormals"] and info["encoding"] == "ieee")
        if not self.is_fp32 and not (info["precision"] <= 22 and info["emax"] <= 127 and smallest >= 2.0**-147):
            raise ValueError(f"{option} {name!r} is not supported: parameters and optimizer state are float32 "
                             "tensors, so a format needs values that are float32 values with two bits to spare "
                             "(precision at most 22 bits, exponents within float32's), or is fp32")

    def __eq__(self, other):
        return self.name == other.name

    def constant(self, value):
        """A hyperparameter rounded to nearest into the format, once, from its double
        (train's round_constant)."""
        return _constant(self.name, float(value))


@functools.lru_cache(maxsize=1024)
def _constant(name, value):
    return float(roundoff.round(np.float64([value]), name)[0][0])


# ---- the update rules' arithmetic ----------------------------------------------------------

def _rounded(fmt, t):
    """t's values (float32) rounded to nearest into fmt: a new contiguous tensor."""
    if fmt.is_fp32:
        return t.detach().clone(memory_format=torch.contiguous_format)
    return torch.from_numpy(roundoff.round(t.detach().reshape(-1).numpy(), fmt.name)[0]).view(t.shape)


def _float32_view(t):
    """A contiguous float32 tensor's values as a numpy array sharing its memory."""
    return t.detach().view(-1).numpy()


class _Contiguous:
    """A float32 tensor as a contiguous one for the kernels: itself, or a copy in C order
    that is written back on leaving (a parameter in another memory format)."""

    def __init__(self, t):
        self.tensor, self.work = t, t.detach() if t.is_contiguous() else t.detach().contiguous()

    def __enter__(self):
        return _float32_view(self.work)

    def __exit__(self, *exc):
        if self.work.data_ptr() != self.tensor.data_ptr():
            self.tensor.detach().copy_(self.work)


# ---- option checks --------------------------------------------------------------------------

def _real(value, option, low=None, high=None, high_open=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{option} must be a real number, not {type(value).__name__}")
    value = float(value)
    above = high is not None and (value >= high if high_open else value > high)
    if math.isnan(value) or (low is not None and value < low) or above:
        bound = ")" if high_open else "]"
        raise ValueError(f"{option} must be in [{low}, {high if high is not None else 'inf'}{bound}, not {value}")
    return value


def _seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, not {type(seed).__name__}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer from 0 to {2**64 - 1}, not {seed}")
    return int(seed)


def sr_seed(seed, index, step):
    """The roundoff.round seed of fp16-sr's weight update of parameter `index` at its
    step `step`: the first 8 bytes, little-endian, of the SHA-256 of the text
    f"roundoff.torch.sr {seed} {index} {step}"."""
    digest = hashlib.sha256(f"roundoff.torch.sr {seed} {index} {step}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


# ---- the optimizers ---------------------------------------------------------------------------

_RULES_DOC = """
    Parameters are ordinary float32 CPU nn.Parameters whose values are kept in
    `weight_format` (float32 tensors holding that format's values); forward and backward
    read them as they are. `update` is train's update strategy (required):
      fp32         everything fp32 (train's baseline; the format options are ignored).
      fp16-rn      w = w - delta rounded to nearest into weight_format: updates below half
                   an ulp of w are lost (swamping).
      fp16-sr      the same rounded stochastically (roundoff.round's sr, exact
                   probabilities). The random stream of parameter i (its position among
                   the optimizer's parameters, param_groups in order, as state_dict
                   numbers them) at its step t (1, 2, ...: its applied steps) is
                   roundoff.round(w - delta, weight_format, "sr", seed=sr_seed(seed, i, t))
                   on the parameter's values flat in C order, w - delta a float64 array
                   (the exact difference: always for fp16 weights; for bf16, where that is
                   no float64 value, only possible when |delta| < 2^-44 |w|, rounded to odd
                   into float64).
      fp32-master  an fp32 master copy (master_format) updated in its own arithmetic,
                   master = master - delta; the parameter is the master rounded to nearest
                   into weight_format after each step (Micikevicius et al., 2018).
      fp16-kahan   Kahan-compensated update with a compensation buffer c in weight_format:
                   y = -delta - c; s = w + y; c = (s - w) - y; w = s, each rounded into
                   weight_format.
    The update arithmetic's format (`arith_format`) is master_format under fp32-master and
    weight_format otherwise; `state_format` ("auto" = the update arithmetic's) holds the
    optimizer state. Per element, the gradient g = p.grad rounded into the update
    arithmetic (a LossScaler has already divided it by the loss scale there), with weight
    decay g = fma(weight_decay, w, g) (w: the master under fp32-master; not in train, as
    torch adds it), then the optimizer's direction d (below) and delta = lr d, each
    operation rounded once to nearest into its format, constants (lr, momentum, betas,
    1 - beta1, 1 - beta2, eps, weight_decay) rounded to nearest into the format they are
    used in: train's Updater exactly.

    The constructor (and add_param_group) rounds the parameters in place into
    weight_format (fp32-master: the master copy is the parameters rounded into
    master_format, the parameters its rounding into weight_format) and allocates the
    state: "step" (applied steps), "master", "compensation" and the optimizer's buffers,
    float32 tensors holding their formats' values, in `state` and state_dict. A parameter
    without a gradient is skipped and its step does not count. Formats are optimizer-wide;
    lr, weight_decay and the optimizer's coefficients are per param group, as torch's.
    Bad options raise TypeError or ValueError naming the option."""


class _LowPrecisionOptimizer(torch.optim.Optimizer):
    def __init__(self, params, defaults, update, weight_format, state_format, master_format, seed):
        if not isinstance(update, str):
            raise TypeError(f"update must be a str, not {type(update).__name__}")
        if update not in UPDATE_RULES:
            raise ValueError(f"update: unknown update rule {update!r} (known: {' '.join(UPDATE_RULES)})")
        self.update = update
        storage, master = _Format(weight_format, "weight_format"), _Format(master_format, "master_format")
        if state_format != "auto":
            state = _Format(state_format, "state_format")
        if update == "fp32":
            storage = master = state = _Format("fp32", "weight_format")
        arith = master if update == "fp32-master" else storage
        if state_format == "auto":
            state = arith
        self._storage, self._arith, self._state, self._master = storage, arith, state, master
        self.weight_format, self.arith_format = storage.name, arith.name
        self.state_format, self.master_format = state.name, master.name
        self.seed = _seed(seed)
        self._parameters_seen = 0
        self._kernels = {}
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            problem = (f"a {p.dtype} tensor" if p.dtype != torch.float32 else
                       f"on {p.device}" if p.device.type != "cpu" else None)
            if problem:
                self.param_groups.pop()
                raise TypeError(f"parameter {self._parameters_seen + group['params'].index(p)} is {problem}: "
                                f"roundoff.torch.{type(self).__name__} takes float32 CPU parameters")
        try:
            self._check_group(group)
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise
        with torch.no_grad():
            for p in group["params"]:
                state = self.state[p]
                state["index"], state["step"] = self._parameters_seen, 0
                self._parameters_seen += 1
                if self.update == "fp32-master":
                    state["master"] = _rounded(self._master, p)
                    p.copy_(_rounded(self._storage, state["master"]))
                else:
                    p.copy_(_rounded(self._storage, p))
                if self.update == "fp16-kahan":
                    state["compensation"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                for name in self._buffers(group):
                    state[name] = torch.zeros_like(p, memory_format=torch.contiguous_format)

    def _check_group(self, group):
        group["lr"] = _real(group["lr"], "lr", 0.0)
        group["weight_decay"] = _real(group["weight_decay"], "weight_decay", 0.0)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        ar = self._arith
        for group in self.param_groups:
            lr = ar.constant(group["lr"])
            weight_decay = ar.constant(group["weight_decay"]) if group["weight_decay"] != 0 else None
            kernel = self._kernel(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] += 1
                buffers = [_float32_view(state[name]) for name in self._buffers(group)]
                buffers += [None] * (2 - len(buffers))
                seed = sr_seed(self.seed, state["index"], state["step"]) if self.update == "fp16-sr" else 0
                with _Contiguous(p) as w:
                    kernel.step(w, _float32_view(p.grad.contiguous()),
                                _float32_view(state["master"]) if "master" in state else None,
                                _float32_view(state["compensation"]) if "compensation" in state else None,
                                *buffers, lr, weight_decay, self._coefficients(group, state), seed)
        return loss

    def _kernel(self, group):
        """The C++ update rule for a group's direction (built once per direction)."""
        direction = self._direction(group)
        if direction not in self._kernels:
            self._kernels[direction] = _core.OptimizerKernel(self.update, direction, self._storage.name,
                                                            self._arith.name, self._state.name, self._master.name)
        return self._kernels[direction]


class SGD(_LowPrecisionOptimizer):
    __doc__ = """Stochastic gradient descent, with momentum, on low-precision weights.

    SGD(params, lr, momentum=0, weight_decay=0, *, update, weight_format="fp16",
        state_format="auto", master_format="fp32", seed=0)

    lr, momentum and weight_decay as torch.optim.SGD's (no dampening, no Nesterov):
    direction d = g (momentum 0: train's optimizer sgd), or with momentum mu (train's
    optimizer momentum) the buffer "momentum_buffer" m = fma(mu, m, g) rounded into
    state_format (starting at 0, so the first step stores g, as torch does) and d = m
    rounded into the update arithmetic.
    """ + _RULES_DOC

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, *, update, weight_format="fp16",
                 state_format="auto", master_format="fp32", seed=0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay), update,
                         weight_format, state_format, master_format, seed)

    def _check_group(self, group):
        super()._check_group(group)
        group["momentum"] = _real(group["momentum"], "momentum", 0.0, 1.0)

    def _buffers(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _direction(self, group):
        return "momentum" if group["momentum"] != 0 else "sgd"

    def _coefficients(self, group, state):
        return [self._state.constant(group["momentum"])] if group["momentum"] != 0 else []


class Adam(_LowPrecisionOptimizer):
    __doc__ = """Adam on low-precision weights.

    Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, *, update,
         weight_format="fp16", state_format="auto", master_format="fp32", seed=0)

    As train's optimizer adam, at the parameter's step t: in state_format
    m = fma(b1, m, (1 - b1) g) and v = fma(b2, v, (1 - b2) (g g)) ("exp_avg", "exp_avg_sq";
    each product and fma rounded once), then in the update arithmetic
    d = (m / c1) / (sqrt(v / c2) + eps) with c1 = 1 - b1^t and c2 = 1 - b2^t computed in
    fp64 and rounded into it. eps is rounded to nearest into the update arithmetic's format
    (arith_format: master_format, fp32, under fp32-master; weight_format otherwise): torch's
    default 1e-8 becomes 0 in fp16 (its smallest subnormal is 2^-24, about 6e-8), so a
    weight whose m and v are 0 gets 0 / 0 = NaN; use eps=1e-4 there
    (configs/adam_eps.yaml). bf16 keeps it (1.00117e-8).
    """ + _RULES_DOC

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, update,
                 weight_format="fp16", state_format="auto", master_format="fp32", seed=0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), update,
                         weight_format, state_format, master_format, seed)

    def _check_group(self, group):
        super()._check_group(group)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2), not {betas!r}")
        group["betas"] = (_real(betas[0], "betas[0]", 0.0, 1.0, high_open=True),
                          _real(betas[1], "betas[1]", 0.0, 1.0, high_open=True))
        group["eps"] = _real(group["eps"], "eps", 0.0)

    def _buffers(self, group):
        return ("exp_avg", "exp_avg_sq")

    def _direction(self, group):
        return "adam"

    def _coefficients(self, group, state):
        st, ar, t = self._state, self._arith, state["step"]
        b1, b2 = group["betas"]
        return [st.constant(b1), st.constant(1 - b1), st.constant(b2), st.constant(1 - b2), ar.constant(1 - b1**t),
                ar.constant(1 - b2**t), ar.constant(group["eps"])]
