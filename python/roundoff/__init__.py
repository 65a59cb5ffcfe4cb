"""roundoff: bit-exact emulation of low-precision arithmetic units, from Python.

The package lives in build/python/roundoff/ after `scripts/setup --python`;
`export PYTHONPATH=$PWD/build/python` makes `import roundoff` work.

    import numpy as np, roundoff
    y, flags = roundoff.round(np.float32([0.1, 1e-6]), "fp16", "sr", seed=7)
    C, flags = roundoff.matmul(A, B, unit="a100")
    D, flags = roundoff.matmul(A, B, unit="b200", in_format="mxfp8-e4m3")  # block-scaled MMA

A sweep's output: roundoff.results (read it), roundoff.plot (its figures, laid out along
the grid), roundoff.report (one self-contained HTML page).

Names (formats, rounding modes, units, flags) are those of the emu calculator and
the C++ core; bad arguments raise ValueError (or TypeError for a wrong type) with the
message `emu` would print. Results come back as float32 arrays where every value of the
format is a float32 (fp16, bf16, fp8, tf32, fp32, ...), else float64.
"""
import collections as _collections
import enum as _enum
import importlib as _importlib
import json as _json
import os as _os
import subprocess as _subprocess
import tempfile as _tempfile

import numpy as _np

__all__ = ["round", "bits", "from_bits", "info", "formats", "units", "Context", "Flags",
           "FloatingPointTrap", "dot", "matmul", "set_num_threads", "sweep", "results", "plot", "report"]


class FloatingPointTrap(FloatingPointError):
    """An enabled trap (Context(traps=...)): the C++ TrapReport's fields.

    flag      the trapping flag's name ("OFLO", "DIV0", "INV", "UFLO", "INEXACT")
    scope     the scope path ("" from Python)
    op        the operation ("add", "mul", "div", "fma", "sqrt", "convert", ...)
    element   the flat C-order index of the element it computed (None for a scalar)
    index     that element's index per dimension of the result (None for a scalar)
    operands  the operands, as the operation names them
    result    the would-be result under the overflow policy
    status    the sticky Flags, the trapping flag included
    fp_sts    the IPU's $FP_STS (bit 0 INV, bit 1 DIV0, bit 2 OFLO)
    """

    def __init__(self, flag, scope, op, element, operands, result, status, fp_sts, index=None):
        self.flag, self.scope, self.op, self.element = flag, scope, op, element
        self.operands, self.result = tuple(operands), result
        self.status, self.fp_sts, self.index = Flags(status), fp_sts, index
        where = f" at element {element}" if element is not None else ""
        super().__init__(f"{flag} in {op}{where} (operands {', '.join(map(repr, self.operands))}), "
                         f"would give {result!r}; $FP_STS {fp_sts:#x}; flags {self.status.names()}")

    def __reduce__(self):
        return (FloatingPointTrap, (self.flag, self.scope, self.op, self.element, self.operands,
                                    self.result, int(self.status), self.fp_sts, self.index))


from . import _core  # noqa: E402  (FloatingPointTrap must exist first: _core raises it)

# The sticky flags, with emu's bit values (emu/status.hpp).
Flags = _enum.IntFlag("Flags", _core.flag_names(), module=__name__)
Flags.names = lambda self: " ".join(f.name for f in Flags if f in self) or "none"
Flags.names.__doc__ = "The raised flags' names in emu's order (OFLO DIV0 INV UFLO INEXACT), or 'none'."


def _text(value, name):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def _integer(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, _np.integer)):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return int(value)


def _boolean(value, name):
    if not isinstance(value, (bool, _np.bool_)):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return bool(value)


def _rounding(rounding, seed, sr_bits, overflow, rng, tininess):
    # The core parses each into its typed value, with the CLI's range checks and messages.
    return _core.Rounding(_text(rounding, "rounding"), _integer(seed, "seed"), _integer(sr_bits, "sr_bits"),
                          _text(overflow, "overflow"), _text(rng, "rng"), _text(tininess, "tininess"))


def _real_array(x, name):
    a = _np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"{name} must be an array of real numbers, not of {a.dtype}")
    return a


def _doubles(x, name):
    return _np.ascontiguousarray(_real_array(x, name), dtype=_np.float64)


def round(x, format, rounding="rne", *, seed=0, sr_bits=0, subnormals=True, overflow="inf", rng="philox",
          tininess="before", out=None):
    """Rounds every element of x once into `format`; returns (rounded array, Flags).

    As `emu round VALUES --format F --rounding R --seed S --sr-bits K --subnormals on|off
    --overflow P --rng G --tininess T`, element by element in C order. A float32 array
    rounded to fp16 or bf16 with rne or sr (philox, sr_bits 0..32, tininess before) takes
    emu's fast kernels (emu/convert.hpp): same bits and flags as emu::round, and under sr
    the random bits of element i are a pure function of (seed, i), so the result does
    not depend on the array's layout or on how it is cut. Any other input rounds element
    by element through emu::round, sr drawing one stream (seed S, as `emu round --seed S`)
    in C order. The flags are those raised by any element.

    out: an array to write the result into and return (as numpy's out=): C-contiguous,
    writeable, of x's shape and of the result's dtype (float32 where every value of the
    format is a float32, else float64; ValueError otherwise). Reusing one spares the
    fresh memory a new array takes (for 10^7 values, more time than the rounding).
    """
    a = _real_array(x, "x")
    a = _np.ascontiguousarray(a, dtype=_np.float32 if a.dtype == _np.float32 else _np.float64)
    if out is not None and not isinstance(out, _np.ndarray):
        raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
    values, flags = _core.round(a, _text(format, "format"),
                                _rounding(rounding, seed, sr_bits, overflow, rng, tininess),
                                _boolean(subnormals, "subnormals"), out)
    return values, Flags(flags)


def bits(x, format, *, subnormals=True):
    """The bit patterns of x's values in `format` (uint8/16/32/64 by the format's width).

    Every element must be a value of the format (ValueError otherwise: round first);
    NaN gives the format's canonical quiet NaN with its sign.
    """
    return _core.bits(_doubles(x, "x"), _text(format, "format"), _boolean(subnormals, "subnormals"))


def from_bits(b, format, *, subnormals=True):
    """The values that the bit patterns b encode in `format` (float32 or float64)."""
    b = _np.asarray(b)
    if b.dtype.kind not in "iu":
        raise TypeError(f"b must be an array of integers, not of {b.dtype}")
    if b.size and b.min() < 0:
        raise ValueError("from_bits: bit patterns are non-negative integers")
    return _core.from_bits(_np.ascontiguousarray(b, dtype=_np.uint64), _text(format, "format"),
                           _boolean(subnormals, "subnormals"))


def info(format, *, subnormals=True):
    """The format's properties as a dict: the fields of `emu info FORMAT --json`."""
    return _json.loads(_core.info_json(_text(format, "format"), _boolean(subnormals, "subnormals")))


def formats():
    """The preset format names (any eXmY is a format too)."""
    return _core.formats()


def units():
    """The matrix units' names."""
    return _core.units()


def set_num_threads(n):
    """The most threads one emulated GEMM uses (matmul, roundoff.torch's layers): n >= 1,
    or 0, the default: every core. Process-wide. Results, flags, counts and traps are the
    same for every n; 1 runs each GEMM on the calling thread."""
    _core.set_num_threads(_integer(n, "n"))


def _trap_flags(traps):
    if traps is None:
        return ""
    if isinstance(traps, Flags):
        return ",".join(f.name for f in Flags if f in traps)
    if isinstance(traps, str):
        return traps
    return ",".join(_text(t, "traps[...]") for t in traps)


class Context:
    """An FP context after the IPU's $FP_CTL/$FP_STS: element-wise arithmetic in a format.

    Context(rounding="rne", esr=False, overflow="inf", traps=None, sr_bits=0, seed=0,
            rng="philox", tininess="before", subnormals=True)

    traps: flags that raise FloatingPointTrap, as "oflo,div0,inv", a list of names or
    Flags. esr: every operation rounds stochastically ($FP_CTL.ESR). overflow "nan" is
    the IPU's NANOO. Operations take the result's format first, then array operands
    (broadcast together, any real dtype; operands need not be values of the format);
    each result is the exact result rounded once, elements in C order. `flags` is the
    sticky status; clear() clears it.
    """

    def __init__(self, rounding="rne", esr=False, overflow="inf", traps=None, sr_bits=0, seed=0, *,
                 rng="philox", tininess="before", subnormals=True):
        self._ctx = _core.Context(_rounding(rounding, seed, sr_bits, overflow, rng, tininess),
                                  _boolean(esr, "esr"), _trap_flags(traps), _boolean(subnormals, "subnormals"))

    @property
    def flags(self):
        return Flags(self._ctx.status)

    def clear(self):
        self._ctx.clear_status()

    def _apply(self, name, format, *operands):
        arrays = _np.broadcast_arrays(*(_real_array(o, f"operand {i + 1}") for i, o in enumerate(operands)))
        arrays = [_np.ascontiguousarray(a, dtype=_np.float64) for a in arrays]
        try:
            return getattr(self._ctx, name)(_text(format, "format"), *arrays)
        except FloatingPointTrap as trap:
            if trap.element is not None and arrays[0].ndim > 0:
                trap.index = tuple(int(i) for i in _np.unravel_index(trap.element, arrays[0].shape))
            raise

    def add(self, format, a, b):
        return self._apply("add", format, a, b)

    def sub(self, format, a, b):
        return self._apply("sub", format, a, b)

    def mul(self, format, a, b):
        return self._apply("mul", format, a, b)

    def div(self, format, a, b):
        return self._apply("div", format, a, b)

    def fma(self, format, a, b, c):
        """a*b + c with one rounding."""
        return self._apply("fma", format, a, b, c)

    def sqrt(self, format, a):
        return self._apply("sqrt", format, a)

    def convert(self, format, a):
        return self._apply("convert", format, a)


def _unit(unit, in_format, out_format, rounding, scale_rule):
    optional = lambda v, n: None if v is None else _text(v, n)  # noqa: E731
    return _core.Unit(_text(unit, "unit"), optional(in_format, "in_format"), optional(out_format, "out_format"),
                      optional(scale_rule, "scale_rule"), _text(rounding, "rounding"))


def dot(a, b, c=0, *, unit, in_format=None, out_format=None, rounding="rne", seed=0, sr_bits=0, overflow="inf",
        rng="philox", tininess="before", scale_rule=None):
    """c + sum a_i*b_i as `unit` computes it; returns (value, Flags), as `emu dot`.

    a and b are rounded into the unit's input format and c into its output format with
    rne first (in_format/out_format as --in/--out); the flags are those of the unit's
    computation and of those conversions (`emu dot`'s flags and input_flags together).
    The value is a Python float (a value of the output format).

    A block format as in_format (mxfp8-e4m3 mxfp8-e5m2 mxfp6-e2m3 mxfp6-e3m2 mxfp4-e2m1
    nvfp4) with unit="b200" runs Blackwell's block-scaled MMA as `emu dot --unit b200
    --in FORMAT [--scale-rule R]` does: a and b each quantised into blocks (scale_rule:
    floor, ceil, even, up, nearest; None = the format's default), c rounded into fp32,
    nvfp4's tensor scales applied after the MMA as alpha in one fp32 fma under
    `rounding`; fp32 output. mxint8, another unit, or scale_rule without a block format
    raise ValueError with emu's message.

    in_format="A:B" (mixed inputs, as `emu dot --in A:B`) rounds a into format A and b
    into B on the units that mix them: unit="mi300x" with "fp8-e4m3fnuz:fp8-e5m2fnuz" or
    "fp8-e5m2fnuz:fp8-e4m3fnuz"; other units and pairs raise ValueError.
    """
    a, b = _doubles(a, "a").ravel(), _doubles(b, "b").ravel()
    c = _real_array(c, "c")
    if c.ndim != 0:
        raise ValueError("dot: c must be a scalar")
    setup = _unit(unit, in_format, out_format, rounding, scale_rule)
    value, flags, input_flags, _ = _core.dot(a, b, float(c), setup,
                                             _rounding(rounding, seed, sr_bits, overflow, rng, tininess))
    return value, Flags(flags | input_flags)


def matmul(A, B, C=None, *, unit, in_format=None, out_format=None, rounding="rne", seed=0, sr_bits=0,
           overflow="inf", rng="philox", tininess="before", scale_rule=None):
    """A @ B + C through `unit`; returns (matrix, Flags), element for element as `emu gemm`.

    A (m x k) and B (k x n) are rounded into the unit's input format and C (default zero)
    into its output format with rne; the flags are those of every element's computation
    and of those conversions.
    The product has at most 2^24 = 16,777,216 elements (4096 x 4096; ValueError
    beyond, before anything is allocated).

    A block format as in_format with unit="b200" (see dot) quantises A's rows and B's
    columns into blocks along k (nvfp4: one tensor scale for all of A, one for all of B)
    and runs the block-scaled MMA per element, as `emu gemm --unit b200 --in FORMAT`;
    the result is float32. in_format="A:B" (mixed inputs, see dot) rounds A into format A
    and B into B.
    """
    setup = _unit(unit, in_format, out_format, rounding, scale_rule)
    r = _rounding(rounding, seed, sr_bits, overflow, rng, tininess)
    C = None if C is None else _doubles(C, "C")
    result, flags, input_flags = _core.matmul(_doubles(A, "A"), _doubles(B, "B"), C, setup, r)
    return result, Flags(flags | input_flags)


Quantized = _collections.namedtuple(
    "Quantized", "values elements element_bits scales scale_bits block_flags tensor_scale flags")
Quantized.__doc__ = """A block-quantised array (roundoff.quantize): values (the dequantised values, exactly
element * scale * tensor_scale, x's shape), elements (their exact element values) and
element_bits (uint8 patterns of the element format; MXINT8: two's complement), per block
scales (NaN for a NaN block) and scale_bits (E8M0 or UE4M3 patterns) and block_flags
(int, the block's elements' and scale's flags), tensor_scale (nvfp4's fp32 scale; 1 for
MX) and flags (Flags, of every block)."""


def quantize(x, format, *, scale_rule=None, rounding="rne", seed=0, sr_bits=0, overflow=None, rng="philox",
             tininess="before", tensor_scale=None):
    """Quantises x (its values in C order, in consecutive blocks) into a block format; as
    `emu quantize VALUES --format F [--scale-rule R] --rounding R --seed S --sr-bits K
    [--overflow P] --rng G --tininess T [--tensor-scale T]`, value for value. Returns a
    Quantized.

    format: mxfp8-e4m3 mxfp8-e5m2 mxfp6-e2m3 mxfp6-e3m2 mxfp4-e2m1 mxint8 (OCP MX v1.0, 32
    elements, an E8M0 scale) or nvfp4 (16 FP4 elements, a UE4M3 scale, one fp32 scale for
    the tensor); roundoff.block_formats() lists them. scale_rule: floor (OCP, MX's
    default), ceil, even, up, nearest (nvfp4's default); the elements round with
    `rounding` (sr draws one stream in index order, seed S) and saturate unless overflow
    says otherwise; tensor_scale: nvfp4's fp32 scale (default: amax / (6 * 448) rounded up).
    """
    r = _rounding(rounding, seed, sr_bits, "inf" if overflow is None else overflow, rng, tininess)
    if scale_rule is not None:
        scale_rule = _text(scale_rule, "scale_rule")
    if tensor_scale is not None:
        if isinstance(tensor_scale, bool) or not isinstance(tensor_scale, (int, float, _np.floating, _np.integer)):
            raise TypeError(f"tensor_scale must be a number, not {type(tensor_scale).__name__}")
        tensor_scale = float(tensor_scale)
    values, elements, element_bits, scales, scale_bits, block_flags, scale, flags = _core.quantize(
        _doubles(x, "x"), _text(format, "format"), scale_rule, r, overflow is not None, tensor_scale)
    return Quantized(values, elements, element_bits, scales, scale_bits, block_flags, scale, Flags(flags))


def block_formats():
    """The block formats roundoff.quantize takes."""
    return _core.block_formats()


def _run_sweep(config, jobs=None, output=None):
    """Runs build/sweep on config (a path, or a dict written to a temporary YAML file);
    returns the output path. Errors: ValueError with sweep's message (its exit status 2)."""
    args = [_core.sweep_path]
    with _tempfile.TemporaryDirectory(prefix="roundoff-sweep-") as folder:
        if isinstance(config, dict):
            if output is None and "output" not in config:
                raise ValueError("sweep: a config given as a dict needs 'output' (or output=...)")
            path = _os.path.join(folder, "config.yaml")
            with open(path, "w") as f:
                _json.dump(config, f)  # JSON is YAML
        elif isinstance(config, (str, _os.PathLike)):
            path = _os.fspath(config)
        else:
            raise TypeError(f"config must be a path or a dict, not {type(config).__name__}")
        args.append(path)
        if jobs is not None:
            args += ["-j", str(_integer(jobs, "jobs"))]
        if output is not None:
            args += ["-o", _os.fspath(output)]
        args.append("--quiet")
        done = _subprocess.run(args, capture_output=True, text=True)
        if done.returncode == 2:
            raise ValueError(done.stderr.strip())
        if done.returncode != 0:
            raise RuntimeError(f"sweep exited with status {done.returncode}: {done.stderr.strip()}")
        if output is None:
            plan = _subprocess.run([_core.sweep_path, path, "--dry-run"], capture_output=True, text=True)
            output = _output_of_dry_run(plan.stdout)
    return _os.fspath(output)


def _output_of_dry_run(text):
    for line in text.splitlines():
        if line.startswith("output: "):
            return line[len("output: "):]
    raise RuntimeError("sweep --dry-run did not name the output")


def sweep(config, jobs=None, output=None):
    """Runs a config (a YAML path, or a dict with the same keys) with build/sweep and
    returns roundoff.results.open(output). jobs: threads (-j); output: -o."""
    path = _run_sweep(config, jobs, output)
    from . import results  # lazily: pandas and xarray load only here
    return results.open(path)


_lazy = ("results", "plot", "report")


def __getattr__(name):
    # The submodules need pandas, xarray and matplotlib: loaded on first use (PEP 562).
    if name in _lazy:
        module = _importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
