"""Loss scaling with the semantics of the `train` experiment's loss_scale and ls_*
parameters (experiments/nn/mlp.cpp, Trainer::step_on)."""
import numbers

import torch

from roundoff import _core

from ._optim import _Contiguous, _Format, _LowPrecisionOptimizer, _real

__all__ = ["LossScaler"]


class LossScaler:
    """Static or dynamic loss scaling, as train's loss_scale, ls_init, ls_interval,
    ls_growth, ls_backoff (same names, defaults and meaning).

    LossScaler(loss_scale, *, ls_init=65536.0, ls_interval=2000, ls_growth=2.0,
               ls_backoff=0.5, unscale_format="auto")

    loss_scale: "none" (S = 1), a constant S (a positive number, or its text) or "dynamic"
    (S starts at ls_init). fastai's schedule (2^24, halve on overflow, double after 500
    clean steps) is LossScaler("dynamic", ls_init=2**24, ls_interval=500).

    A training step:
        optimizer.zero_grad()
        scaler.scale(loss).backward()   # the gradients of S * loss
        scaler.step(optimizer)          # checks, unscales, steps or skips
        scaler.update()                 # the next step's S

    scale(loss) is loss * S in torch's float32 (exact for a power of two, barring
    overflow). step(optimizer) looks for an inf or NaN in any gradient of the optimizer's
    parameters. Under dynamic scaling such a step is skipped: no gradient is touched and
    optimizer.step is not called. Otherwise (and always under static scaling, where a
    non-finite gradient is applied as it is) every gradient is divided by S, the quotient
    rounded once to nearest into `unscale_format` and written back to p.grad, then
    optimizer.step() runs; S = 1 leaves the gradients as they are. unscale_format "auto"
    is train's: the update arithmetic's format of a roundoff.torch optimizer
    (arith_format: master_format, fp32, under fp32-master; weight_format under fp16-*),
    fp32 for any other optimizer; or a format name. update() then sets the next step's S
    under dynamic scaling: a skipped step multiplies it by ls_backoff and restarts the
    count of clean steps; a clean step counts, and the ls_interval-th clean step in a row
    multiplies it by ls_growth and restarts the count. As train, which updates S in the
    same step.

    Counts (train's metrics): steps (step() calls), skipped_steps, nonfinite_grad_steps
    (steps whose gradients held an inf or NaN: skipped under dynamic scaling, applied
    otherwise). state_dict() and load_state_dict() carry S, the clean-step count and the
    counts. Bad options raise TypeError or ValueError naming the option.
    """

    def __init__(self, loss_scale, *, ls_init=65536.0, ls_interval=2000, ls_growth=2.0, ls_backoff=0.5,
                 unscale_format="auto"):
        self.dynamic = loss_scale == "dynamic"
        if loss_scale == "none":
            constant = 1.0
        elif self.dynamic:
            constant = None
        elif isinstance(loss_scale, (str, numbers.Real)) and not isinstance(loss_scale, bool):
            try:
                constant = float(loss_scale)
            except ValueError:
                constant = None
            if constant is None or not 0 < constant < float("inf"):
                raise ValueError(f"loss_scale must be none, a positive number or dynamic, not {loss_scale!r}")
        else:
            raise TypeError(f"loss_scale must be a str or a number, not {type(loss_scale).__name__}")
        self.ls_init = _real(ls_init, "ls_init", 0.0)
        if self.ls_init == 0:
            raise ValueError("ls_init must be positive, not 0.0")
        if isinstance(ls_interval, bool) or not isinstance(ls_interval, numbers.Integral):
            raise TypeError(f"ls_interval must be an int, not {type(ls_interval).__name__}")
        if ls_interval < 1:
            raise ValueError(f"ls_interval must be at least 1, not {ls_interval}")
        self.ls_interval = int(ls_interval)
        self.ls_growth = _real(ls_growth, "ls_growth", 1.0)
        self.ls_backoff = _real(ls_backoff, "ls_backoff", 0.0, 1.0)
        if self.ls_backoff == 0:
            raise ValueError("ls_backoff must be in (0, 1], not 0.0")
        if unscale_format != "auto":
            _Format(unscale_format, "unscale_format")
        self.unscale_format = unscale_format
        self._scale = self.ls_init if self.dynamic else constant
        self._clean_steps = 0
        self.steps = self.skipped_steps = self.nonfinite_grad_steps = 0
        self._found_nonfinite = None  # of the last step(), until update()

    def get_scale(self):
        """The loss scale S of the coming step."""
        return self._scale

    def scale(self, loss):
        """loss * S."""
        return loss * self._scale

    def _unscale_format(self, optimizer):
        if self.unscale_format != "auto":
            return _Format(self.unscale_format, "unscale_format")
        return optimizer._arith if isinstance(optimizer, _LowPrecisionOptimizer) else _Format("fp32", "unscale_format")

    @torch.no_grad()
    def step(self, optimizer, *args, **kwargs):
        """Skips the step (dynamic scaling, an inf or NaN gradient) and returns None, or
        unscales the gradients and returns optimizer.step(*args, **kwargs)."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        nonfinite = any(not bool(torch.isfinite(g).all()) for g in grads)
        self.steps += 1
        self.nonfinite_grad_steps += nonfinite
        self._found_nonfinite = nonfinite
        if nonfinite and self.dynamic:
            self.skipped_steps += 1
            return None
        if self._scale != 1.0:
            fmt = self._unscale_format(optimizer)
            for g in grads:
                with _Contiguous(g) as values:
                    _core.torch_divide(fmt.name, values, self._scale)
        return optimizer.step(*args, **kwargs)

    def update(self):
        """The next step's S (dynamic scaling; static scaling keeps S). Follows step()."""
        if self._found_nonfinite is None:
            raise RuntimeError("LossScaler.update() follows a LossScaler.step()")
        if self.dynamic:
            if self._found_nonfinite:
                self._scale *= self.ls_backoff
                self._clean_steps = 0
            else:
                self._clean_steps += 1
                if self._clean_steps >= self.ls_interval:
                    self._scale *= self.ls_growth
                    self._clean_steps = 0
        self._found_nonfinite = None

    def state_dict(self):
        return {"scale": self._scale, "clean_steps": self._clean_steps, "steps": self.steps,
                "skipped_steps": self.skipped_steps, "nonfinite_grad_steps": self.nonfinite_grad_steps}

    def load_state_dict(self, state):
        self._scale, self._clean_steps = float(state["scale"]), int(state["clean_steps"])
        self.steps, self.skipped_steps = int(state["steps"]), int(state["skipped_steps"])
        self.nonfinite_grad_steps = int(state["nonfinite_grad_steps"])
