"""Optimizers whose weights are stored in a low-precision format: the update rules of the
`train` experiment (experiments/mlp.hpp, Updater) on ordinary float32 torch parameters.

Every rounding goes through roundoff.round; see _Exact for how each operation's exact
result reaches it.
"""
import hashlib
import math
import numbers

import numpy as np
import torch

import roundoff

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
        return float(roundoff.round(np.float64([value]), self.name)[0][0])


# ---- exact arithmetic ---------------------------------------------------------------------

class _Exact:
    """The operations of the update rules, each giving its exact result held in a float64
    tensor, or, where that is no float64 value, the exact result rounded to odd into
    float64 (the neighbour with an odd last bit). Operands are float32 values (stored
    weights, state, gradients) or doubles (the loss scale). `into` then rounds once into
    a format: to nearest, the float64 value is rounded to odd into float32 (exact where it
    is a float32 value) and roundoff.round's fast kernels take it; rounding to odd into a
    precision at least two bits wider than the target's loses nothing that a later
    rounding to nearest needs (Boldo and Melquiond, IEEE Trans. Computers 57(4), 2008), so
    the result is the exact result rounded once. A result in fp32 is the float64 value
    rounded to nearest even by torch's conversion, again once-rounded. Stochastic rounding
    passes the float64 value to roundoff.round, which compares the random bits with all
    of its bits."""

    @staticmethod
    def _odd(rounded, residual, bits):
        # `rounded` is x rounded to nearest; `residual` has the sign of x - rounded (0:
        # exact). An inexact result with an even last bit moves one step towards x.
        towards = torch.copysign(torch.full_like(rounded, math.inf), residual)
        move = (residual != 0) & ~torch.isnan(residual) & ((rounded.view(bits) & 1) == 0)
        return torch.where(move, torch.nextafter(rounded, towards), rounded)

    @staticmethod
    def _two_product(a, b):
        # a * b = p + e exactly (Dekker, with Veltkamp's splitting).
        def split(x):
            c = 134217729.0 * x  # 2^27 + 1
            hi = c - (c - x)
            return hi, x - hi
        p = a * b
        (ah, al), (bh, bl) = split(a), split(b)
        return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl

    @classmethod
    def add(cls, a, b):
        s = a + b
        bb = s - a
        return cls._odd(s, (a - (s - bb)) + (b - bb), torch.int64)  # TwoSum's exact error

    @classmethod
    def sub(cls, a, b):
        return cls.add(a, -b)

    @staticmethod
    def mul(a, b):
        return a * b  # float32 values: the product has at most 48 bits

    @classmethod
    def fma(cls, a, b, c):
        return cls.add(a * b, c)

    @classmethod
    def div(cls, a, b):
        b = torch.as_tensor(b, dtype=torch.float64)
        q = a / b
        p, e = cls._two_product(q, b)
        # a - p is exact (p is within a factor 2 of a), so the sign of (a - p) - e is that of a - q b.
        return cls._odd(q, ((a - p) - e) * torch.sign(b), torch.int64)

    @classmethod
    def sqrt(cls, a):
        s = torch.sqrt(a)
        p, e = cls._two_product(s, s)
        return cls._odd(s, (a - p) - e, torch.int64)

    @classmethod
    def into(cls, fmt, x, seed=None):
        """x (float64) rounded once into fmt as a float32 tensor: to nearest even, or
        stochastically (roundoff.round's sr, exact probabilities, seed `seed`, elements in
        C order) when a seed is given."""
        if seed is not None:
            values, _ = roundoff.round(x.numpy(), fmt.name, "sr", seed=seed)
            return torch.from_numpy(values)
        nearest = x.float()
        if fmt.is_fp32:
            return nearest
        odd = cls._odd(nearest, x - nearest.double(), torch.int32)
        values, _ = roundoff.round(odd.numpy(), fmt.name)
        return torch.from_numpy(values)


def _values(t):
    """A tensor's values, flat in C order, as float64."""
    return t.detach().reshape(-1).double()


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
                    state["master"] = _Exact.into(self._master, _values(p)).view_as(p).clone()
                    p.copy_(_Exact.into(self._storage, _values(state["master"])).view_as(p))
                else:
                    p.copy_(_Exact.into(self._storage, _values(p)).view_as(p))
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
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] += 1
                updated = state["master"] if self.update == "fp32-master" else p
                g = _Exact.into(ar, _values(p.grad))
                if group["weight_decay"] != 0:
                    g = _Exact.into(ar, _Exact.fma(ar.constant(group["weight_decay"]), _values(updated), g.double()))
                direction = self._direction(g.double(), state, group)
                delta = _Exact.into(ar, _Exact.mul(lr, direction)).double()
                self._apply(p, state, delta)
        return loss

    def _apply(self, p, state, delta):
        ws = self._storage
        w = _values(p)
        if self.update in ("fp32", "fp16-rn"):
            new = _Exact.into(ws, _Exact.sub(w, delta))
        elif self.update == "fp16-sr":
            new = _Exact.into(ws, _Exact.sub(w, delta), seed=sr_seed(self.seed, state["index"], state["step"]))
        elif self.update == "fp32-master":
            master = _Exact.into(self._master, _Exact.sub(_values(state["master"]), delta))
            state["master"].copy_(master.view_as(p))
            new = _Exact.into(ws, master.double())
        else:  # fp16-kahan
            c = _values(state["compensation"])
            y = _Exact.into(ws, _Exact.sub(-delta, c)).double()
            s = _Exact.into(ws, _Exact.add(w, y)).double()
            c = _Exact.into(ws, _Exact.sub(_Exact.into(ws, _Exact.sub(s, w)).double(), y))
            state["compensation"].copy_(c.view_as(p))
            new = s.float()  # a value of weight_format already
        p.copy_(new.view_as(p))

    def _keep(self, state, name, values):
        """Stores a state buffer (float32 values of state_format) and returns it as float64."""
        state[name].copy_(values.view_as(state[name]))
        return values.double()


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

    def _direction(self, g, state, group):
        if group["momentum"] == 0:
            return g
        mu = self._state.constant(group["momentum"])
        m = self._keep(state, "momentum_buffer",
                       _Exact.into(self._state, _Exact.fma(mu, _values(state["momentum_buffer"]), g)))
        return _Exact.into(self._arith, m).double()


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

    def _direction(self, g, state, group):
        st, ar, t = self._state, self._arith, state["step"]
        (b1, b2), E = group["betas"], _Exact
        m = E.fma(st.constant(b1), _values(state["exp_avg"]), E.into(st, E.mul(st.constant(1 - b1), g)).double())
        m = self._keep(state, "exp_avg", E.into(st, m))
        g2 = E.into(st, E.mul(g, g)).double()
        v = E.fma(st.constant(b2), _values(state["exp_avg_sq"]), E.into(st, E.mul(st.constant(1 - b2), g2)).double())
        v = self._keep(state, "exp_avg_sq", E.into(st, v))
        m_hat = E.into(ar, E.div(m, ar.constant(1 - b1**t))).double()
        v_hat = E.into(ar, E.div(v, ar.constant(1 - b2**t))).double()
        denominator = E.into(ar, E.add(E.into(ar, E.sqrt(v_hat)).double(), ar.constant(group["eps"]))).double()
        return E.into(ar, E.div(m_hat, denominator)).double()
