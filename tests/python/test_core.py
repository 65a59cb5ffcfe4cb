"""roundoff's Python API against the emu calculator (EMU, passed by meson) on the same
inputs, against exact arithmetic (fractions.Fraction) and numpy.float16, and its errors."""
import json
import math
import os
import re
import subprocess
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import roundoff

EMU = os.environ.get("EMU", "build/emu")


def emu(*args):
    done = subprocess.run([EMU, *map(str, args), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def emu_value(v):
    return {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}.get(v, v) if isinstance(v, str) else v


def flags_of(names):
    flags = roundoff.Flags(0)
    for name in names:
        flags |= roundoff.Flags[name]
    return flags


# Values that exercise normal, subnormal, underflowing, overflowing, tie and special cases.
SAMPLE = [0.1, -0.1, 1.0, 0.0004, 1e-6, -3e-8, 6.1e-5, 65504.0, 65520.0, 70000.0, -1e30, 0.0, -0.0,
          1.0009765625, 1.00146484375, 2.5e-39, math.inf, -math.inf, math.nan, 3.14159, 1e-45]


@pytest.mark.parametrize("format", ["fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "tf32", "fp32", "e3m2"])
@pytest.mark.parametrize("rounding", ["rne", "rna", "rz", "ru", "rd", "ro", "sr"])
def test_round_matches_emu_round(format, rounding):
    # float64 input: element by element as `emu round`, sr from the same seeded stream.
    values, flags = roundoff.round(np.array(SAMPLE), format, rounding, seed=11)
    expected = emu("round", *map(repr, SAMPLE), "--format", format, "--rounding", rounding, "--seed", 11)
    all_flags = roundoff.Flags(0)
    for got, want in zip(values.tolist(), expected):
        want_value = emu_value(want["value"])
        assert (math.isnan(got) and math.isnan(want_value)) or got == want_value, (got, want)
        all_flags |= flags_of(want["flags"])
    assert flags == all_flags
    bits = roundoff.bits(values, format)
    assert [int(b) for b in bits] == [int(w["bits"], 16) for w in expected]


@pytest.mark.parametrize("options", [dict(subnormals=False), dict(overflow="saturate"), dict(overflow="nan"),
                                     dict(rng="ipu", rounding="sr", seed=5), dict(rounding="sr", sr_bits=3),
                                     dict(tininess="after")])
def test_round_options_match_emu(options):
    cli = {"subnormals": lambda v: ["--subnormals", "on" if v else "off"], "overflow": lambda v: ["--overflow", v],
           "rng": lambda v: ["--rng", v], "rounding": lambda v: ["--rounding", v], "seed": lambda v: ["--seed", v],
           "sr_bits": lambda v: ["--sr-bits", v], "tininess": lambda v: ["--tininess", v]}
    args = [a for k, v in options.items() for a in cli[k](v)]
    values, _ = roundoff.round(np.array(SAMPLE), "fp16", **options)
    expected = emu("round", *map(repr, SAMPLE), "--format", "fp16", *args)
    assert roundoff.bits(values, "fp16").tolist() == [int(w["bits"], 16) for w in expected]


def test_float32_kernel_equals_scalar_rounding_for_rne():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(20000) * np.exp2(rng.integers(-30, 20, 20000))).astype(np.float32)
    for format in ["fp16", "bf16"]:
        for subnormals in [True, False]:
            fast, fast_flags = roundoff.round(x, format, subnormals=subnormals)
            slow, slow_flags = roundoff.round(x.astype(np.float64), format, subnormals=subnormals)
            assert fast.dtype == np.float32
            np.testing.assert_array_equal(fast, slow)
            assert fast_flags == slow_flags


def test_sr_kernel_does_not_depend_on_layout():
    x = np.random.default_rng(2).standard_normal((64, 48)).astype(np.float32)
    a, _ = roundoff.round(x, "bf16", "sr", seed=9)
    b, _ = roundoff.round(np.asfortranarray(x), "bf16", "sr", seed=9)
    c, _ = roundoff.round(x.ravel(), "bf16", "sr", seed=9)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a.ravel(), c)
    d, _ = roundoff.round(x, "bf16", "sr", seed=10)
    assert not np.array_equal(a, d)


def exact_round(x, format, mode):
    """The oracle: x (a Fraction) rounded into the format by the definition."""
    info = roundoff.info(format)
    p, emin = info["precision"], info["emin"]
    if x == 0:
        return Fraction(0)
    sign = -1 if x < 0 else 1
    m = abs(x)
    e = math.floor(math.log2(m))
    while Fraction(2) ** e > m:
        e -= 1
    while Fraction(2) ** (e + 1) <= m:
        e += 1
    q = max(e, emin) - (p - 1)
    scaled = m / Fraction(2) ** q
    n = math.floor(scaled)
    frac = scaled - n
    up = {"rne": frac > Fraction(1, 2) or (frac == Fraction(1, 2) and n % 2 == 1),
          "rna": frac >= Fraction(1, 2), "rz": False, "ru": frac > 0 and sign > 0, "rd": frac > 0 and sign < 0,
          "ro": frac > 0 and n % 2 == 0}[mode]
    r = Fraction(n + up) * Fraction(2) ** q
    if r > Fraction(info["max"]):
        towards_zero = mode == "rz" or mode == "ro" or (mode == "ru" and sign < 0) or (mode == "rd" and sign > 0)
        return sign * Fraction(info["max"]) if towards_zero else sign * math.inf
    return sign * r


finite_doubles = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


@settings(max_examples=300, deadline=None)
@given(x=finite_doubles, mode=st.sampled_from(["rne", "rna", "rz", "ru", "rd", "ro"]),
       format=st.sampled_from(["fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "e4m5"]))
def test_every_mode_against_exact_fractions(x, mode, format):
    got, flags = roundoff.round(np.array([x]), format, mode)
    want = exact_round(Fraction(x), format, mode)
    got = float(got[0])
    if isinstance(want, float):  # overflow
        assert (math.isinf(got) or math.isnan(got)) and roundoff.Flags.OFLO in flags
    else:
        assert Fraction(got) == want
        assert (roundoff.Flags.INEXACT in flags) == (want != Fraction(x))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=50))
def test_rne_matches_numpy_float16(values):
    x = np.array(values, dtype=np.float32)
    got, _ = roundoff.round(x, "fp16")
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(roundoff.bits(got, "fp16"), want.view(np.uint16))


@pytest.mark.parametrize("x,dtype", [(1 + 2**-12, np.float32), (1 + 3 * 2**-13, np.float64), (2**-20 + 2**-26, np.float64)])
def test_sr_frequency_within_binomial_bound(x, dtype):
    # x lies between two fp16 values; P(up) is its distance from the lower one in ulps.
    n = 20000
    values, _ = roundoff.round(np.full(n, x, dtype=dtype), "fp16", "sr", seed=4)
    lower = float(roundoff.round(np.array([x]), "fp16", "rz")[0][0])
    upper = float(roundoff.round(np.array([x]), "fp16", "ru")[0][0])
    assert set(values.tolist()) <= {lower, upper}
    p = (x - lower) / (upper - lower)
    ups = int(np.count_nonzero(values == upper))
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(ups - n * p) < 5 * sigma, (ups, n * p, sigma)


@pytest.mark.parametrize("dtype, format, rounding", [(np.float32, "fp16", "sr"), (np.float32, "bf16", "rne"),
                                                     (np.float64, "fp16", "sr"), (np.float64, "fp64", "rz")])
def test_round_into_out_equals_a_new_array(dtype, format, rounding):
    x = (np.random.default_rng(7).standard_normal((50, 40)) * 1e3).astype(dtype)
    fresh, flags = roundoff.round(x, format, rounding, seed=5)
    out = np.full_like(fresh, np.nan)
    got, out_flags = roundoff.round(x, format, rounding, seed=5, out=out)
    assert got is out
    assert np.array_equal(got.view(np.uint8), fresh.view(np.uint8)) and out_flags == flags


@pytest.mark.parametrize("out, exception", [
    (np.empty(10, np.float64), ValueError),          # fp16's results are float32
    (np.empty(9, np.float32), ValueError),           # not x's shape
    (np.empty((10, 2), np.float32)[:, 0], ValueError),  # not contiguous
    ([0.0] * 10, TypeError),
])
def test_round_refuses_an_unfit_out(out, exception):
    with pytest.raises(exception, match="out must be"):
        roundoff.round(np.ones(10, np.float32), "fp16", out=out)


@pytest.mark.parametrize("format, options", [
    ("mxfp8-e4m3", {}), ("mxfp8-e5m2", {"scale_rule": "ceil"}), ("mxfp6-e2m3", {"scale_rule": "even"}),
    ("mxfp6-e3m2", {"rounding": "sr", "seed": 9, "sr_bits": 3}), ("mxfp4-e2m1", {"overflow": "nan"}),
    ("mxint8", {"rounding": "rz"}), ("nvfp4", {}),
    ("nvfp4", {"scale_rule": "up", "tensor_scale": float(np.float32(0.001))}),
])
def test_quantize_matches_emu_quantize(format, options):
    # Two and a half blocks of values with outliers, tiny values, zeros and a NaN block.
    rng = np.random.default_rng(11)
    x = rng.standard_normal(80) * np.exp(rng.uniform(-8, 4, 80))
    x[3], x[40], x[41], x[70] = 3e4, 0.0, -0.0, 1e-30
    if format != "nvfp4":
        x[75] = math.nan
    q = roundoff.quantize(x.reshape(8, 10), format, **options)
    cli = [f"--{key.replace('_', '-')}={value.hex() if isinstance(value, float) else value}"  # floats exactly
           for key, value in options.items()]
    expected = emu("quantize", *map(repr, x), "--format", format, *cli)
    assert q.values.shape == (8, 10) and len(q.scales) == len(set(e["block"] for e in expected))
    flags = roundoff.Flags(0)
    for i, e in enumerate(expected):
        got, want = q.values.flat[i], emu_value(e["value"])
        assert (math.isnan(got) and math.isnan(want)) or got == want, (i, e)
        assert q.element_bits.flat[i] == int(e["bits"], 16) and q.elements.flat[i] == emu_value(e["element"])
        b = e["block"]
        scale = emu_value(e["scale"])
        assert (math.isnan(q.scales[b]) and math.isnan(scale)) or q.scales[b] == scale
        assert q.scale_bits[b] == int(e["scale_bits"], 16)
        assert roundoff.Flags(int(q.block_flags[b])) == flags_of(e["block_flags"])
        assert q.tensor_scale == e["tensor_scale"]
        flags |= flags_of(e["block_flags"])
    assert q.flags == flags


@pytest.mark.parametrize("call, exception, message", [
    (lambda: roundoff.quantize([1.0], "mxfp5"), ValueError, "--format: "),
    (lambda: roundoff.quantize([1.0], "nvfp4", scale_rule="floor"), ValueError, "not a power of two"),
    (lambda: roundoff.quantize([1.0], "mxfp8-e4m3", tensor_scale=2.0), ValueError, "has no tensor scale"),
    (lambda: roundoff.quantize([1.0], "nvfp4", tensor_scale=-1.0), ValueError, "positive finite fp32"),
    (lambda: roundoff.quantize([1.0], "nvfp4", tensor_scale="1"), TypeError, "tensor_scale must be a number"),
    (lambda: roundoff.quantize([1.0], "mxfp4-e2m1", rounding="sr", sr_bits=99), ValueError, "--sr-bits"),
])
def test_quantize_bad_arguments(call, exception, message):
    with pytest.raises(exception) as caught:
        call()
    assert message in str(caught.value)


def test_bits_and_from_bits_round_trip_every_fp16_pattern():
    patterns = np.arange(1 << 16, dtype=np.uint16)
    values = roundoff.from_bits(patterns, "fp16")
    np.testing.assert_array_equal(values[~np.isnan(values)], patterns.view(np.float16)[~np.isnan(values)].astype(np.float32))
    finite = ~np.isnan(values)
    assert roundoff.bits(values[finite], "fp16").tolist() == patterns[finite].tolist()


def test_info_formats_units_match_emu():
    for format in ["fp16", "bf16", "fp8-e4m3", "tf32", "e6m9"]:
        assert roundoff.info(format) == emu("info", format)[0]
    assert roundoff.info("fp16", subnormals=False) == emu("info", "fp16", "--subnormals", "off")[0]
    assert {"fp16", "bf16", "fp8-e4m3", "fp64"} <= set(roundoff.formats())
    assert {"a100", "ipu-amp", "exact", "fp16-seq"} <= set(roundoff.units())


def write_matrix(path, m):
    path.write_text("\n".join(" ".join(repr(float(v)) for v in row) for row in m) + "\n")
    return path


@pytest.mark.parametrize("unit", roundoff.units())
def test_dot_and_matmul_match_emu(unit, tmp_path):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((3, 9)) * 100
    B = rng.standard_normal((9, 2)) / 3
    C = rng.standard_normal((3, 2))
    # Inputs to be rounded by the unit, and inputs already fp16 (every unit takes them
    # as they are: matmul then reads the caller's arrays without a copy).
    for A_in, B_in in [(A, B), (roundoff.round(A, "fp16")[0], roundoff.round(B, "fp16")[0])]:
        got, flags = roundoff.matmul(A_in, B_in, C, unit=unit)
        expected = emu("gemm", "--unit", unit, write_matrix(tmp_path / "A", A_in), write_matrix(tmp_path / "B", B_in),
                       write_matrix(tmp_path / "C", C))
        all_flags = roundoff.Flags(0)
        for e in expected:
            assert float(got[e["row"], e["col"]]) == emu_value(e["value"]), e
            all_flags |= flags_of(e["flags"]) | flags_of(e["input_flags"])
        assert flags == all_flags
    value, flags = roundoff.dot(A[0], B[:, 1], C[0, 1], unit=unit)
    (e,) = emu("dot", "--unit", unit, "--a", ",".join(map(repr, A[0])), "--b", ",".join(map(repr, B[:, 1])),
               "--c", repr(C[0, 1]))
    assert value == emu_value(e["value"])
    assert flags == flags_of(e["flags"]) | flags_of(e["input_flags"])


def test_dot_with_formats_and_rounding_matches_emu():
    a, b = [1e-3, 2.5, 3e4, -7.0], [0.3, 0.25, 4.0, 1e-2]
    for args in [dict(unit="fp32-seq", in_format="bf16"), dict(unit="exact", out_format="fp16", rounding="rz"),
                 dict(unit="ipu-amp", rounding="sr", seed=3)]:
        value, _ = roundoff.dot(a, b, 0.5, **args)
        cli = ["--unit", args["unit"]] + (["--in", args["in_format"]] if "in_format" in args else []) + \
              (["--out", args["out_format"]] if "out_format" in args else []) + \
              (["--rounding", args["rounding"]] if "rounding" in args else []) + \
              (["--seed", args["seed"]] if "seed" in args else [])
        (e,) = emu("dot", "--a", ",".join(map(repr, a)), "--b", ",".join(map(repr, b)), "--c", "0.5", *cli)
        assert value == emu_value(e["value"]), args


@pytest.mark.parametrize("unit", ["h100", "ipu-amp", "fp16-seq"])
def test_matmul_is_the_same_at_any_number_of_threads(unit):
    # 96 x 40 x 64 is cut into bands of rows from 2 threads on (emu/threads.hpp); with
    # overflow (fp16-seq) and inf * 0 in rows through the middle.
    rng = np.random.default_rng(8)
    A = roundoff.round(rng.standard_normal((96, 64)) * 30, "fp16")[0]
    B = roundoff.round(rng.standard_normal((64, 40)) * 30, "fp16")[0]
    A[50, 3], B[3, :5], A[70, 9] = math.inf, 0.0, -math.inf
    results = []
    try:
        for n in (1, 2, 3):
            roundoff.set_num_threads(n)
            results.append(roundoff.matmul(A, B, unit=unit))
    finally:
        roundoff.set_num_threads(0)
    for values, flags in results[1:]:
        assert values.dtype == results[0][0].dtype and values.tobytes() == results[0][0].tobytes()
        assert flags == results[0][1]


@pytest.mark.parametrize("in_format", [None, "mxfp8-e4m3"])
def test_matmul_refuses_a_product_over_the_matrix_limit(in_format):
    # 4097 x 1 times 1 x 4097: 16,785,409 elements, one row and one column over 4096 x
    # 4096 (README), refused before the product is allocated; the block path too.
    with pytest.raises(ValueError, match=re.escape(
            "matmul: A @ B would be 4097 x 4097, more than the limit of 16777216 elements (4096 x 4096)")):
        roundoff.matmul(np.ones((4097, 1)), np.ones((1, 4097)), unit="b200", in_format=in_format)


def test_set_num_threads_errors():
    with pytest.raises(ValueError, match="GEMM threads"):
        roundoff.set_num_threads(-1)
    with pytest.raises(TypeError, match="n must be an int"):
        roundoff.set_num_threads(2.0)


@pytest.mark.parametrize("format, options", [
    ("mxfp8-e4m3", {}), ("mxfp8-e5m2", {"scale_rule": "nearest"}), ("mxfp6-e2m3", {}),
    ("mxfp6-e3m2", {"scale_rule": "up"}), ("mxfp4-e2m1", {}), ("mxfp4-e2m1", {"scale_rule": "even"}),
    ("nvfp4", {}), ("nvfp4", {"scale_rule": "up", "rounding": "ru"}),
])
def test_block_dot_and_matmul_match_emu(format, options, tmp_path):
    # b200's block-scaled MMA: k = 80 (two and a half MX blocks, five nvfp4 blocks) with
    # outliers and tiny values, so that quantisation and the MMA raise flags.
    rng = np.random.default_rng(5)
    A = rng.standard_normal((3, 80)) * np.exp(rng.uniform(-6, 3, (3, 80)))
    B = rng.standard_normal((80, 2)) * np.exp(rng.uniform(-6, 3, (80, 2)))
    A[0, 7], B[11, 1], A[2, 40] = 4e4, -3e-9, 0.0
    C = rng.standard_normal((3, 2))
    cli = ["--unit", "b200", "--in", format] + [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    got, flags = roundoff.matmul(A, B, C, unit="b200", in_format=format, **options)
    expected = emu("gemm", write_matrix(tmp_path / "A", A), write_matrix(tmp_path / "B", B),
                   write_matrix(tmp_path / "C", C), *cli)
    assert got.dtype == np.float32 and got.shape == (3, 2) and len(expected) == 6
    all_flags = roundoff.Flags(0)
    for e in expected:
        assert e["kind"] == ("mxf8f6f4" if format.startswith(("mxfp8", "mxfp6")) else "mxf4nvf4")
        assert ("alpha" in e) == (format == "nvfp4")
        assert float(got[e["row"], e["col"]]) == emu_value(e["value"]), e
        all_flags |= flags_of(e["flags"]) | flags_of(e["input_flags"])
    assert flags == all_flags
    assert roundoff.Flags.INEXACT in flags
    for i, j in [(0, 1), (2, 0)]:
        value, flags = roundoff.dot(A[i], B[:, j], C[i, j], unit="b200", in_format=format, **options)
        (e,) = emu("dot", "--a", ",".join(map(repr, A[i])), "--b", ",".join(map(repr, B[:, j])),
                   "--c", repr(C[i, j]), *cli)
        assert value == emu_value(e["value"]), (i, j)
        assert flags == flags_of(e["flags"]) | flags_of(e["input_flags"])


def test_block_format_errors_are_emus():
    # Another unit, mxint8, --out other than fp32: ValueError with emu's message.
    for extra in [["--unit", "h100", "--in", "nvfp4"], ["--unit", "b200", "--in", "mxint8"],
                  ["--unit", "b200", "--in", "mxfp8-e4m3", "--out", "fp16"],
                  ["--unit", "b200", "--in", "nvfp4", "--scale-rule", "floor"],
                  ["--unit", "a100", "--in", "fp16", "--scale-rule", "up"]]:
        done = subprocess.run([EMU, "dot", "--a", "1,2", "--b", "3,4", *extra], capture_output=True, text=True)
        assert done.returncode == 2, extra
        options = dict(zip(extra[::2], extra[1::2]))
        kwargs = dict(unit=options["--unit"], in_format=options["--in"], out_format=options.get("--out"),
                      scale_rule=options.get("--scale-rule"))
        with pytest.raises(ValueError) as caught:
            roundoff.dot([1.0, 2.0], [3.0, 4.0], **kwargs)
        assert str(caught.value) in done.stderr, extra
        with pytest.raises(ValueError) as caught:
            roundoff.matmul(np.ones((2, 2)), np.ones((2, 2)), **kwargs)
        assert str(caught.value) in done.stderr, extra
    with pytest.raises(ValueError, match="b200"):
        roundoff.matmul(np.ones((2, 2)), np.ones((2, 2)), unit="ipu-amp", in_format="mxfp4-e2m1")
    with pytest.raises(TypeError, match="scale_rule must be a str"):
        roundoff.dot([1.0], [1.0], unit="b200", in_format="nvfp4", scale_rule=1)


# Mixed inputs in_format="A:B" (mi300x's fp8 with bf8): A rounded into A's format, B into
# B's, as emu dot/gemm --in A:B.
MIXED = ["fp8-e4m3fnuz:fp8-e5m2fnuz", "fp8-e5m2fnuz:fp8-e4m3fnuz"]


@pytest.mark.parametrize("pair", MIXED)
def test_mixed_inputs_match_emu_and_round_each_operand_into_its_own_format(pair):
    rng = np.random.default_rng(4)
    # Magnitudes from 2^-20 to 2^6: subnormals of both formats, values one takes and the
    # other rounds to zero.
    A = rng.choice([-1, 1], (3, 40)) * 2.0 ** rng.uniform(-20, 6, (3, 40))
    B = rng.choice([-1, 1], (40, 2)) * 2.0 ** rng.uniform(-20, 6, (40, 2))
    got, flags = roundoff.matmul(A, B, unit="mi300x", in_format=pair)
    a_format, b_format = pair.split(":")
    A_in, B_in = roundoff.round(A, a_format)[0], roundoff.round(B, b_format)[0]
    # Operands already in their formats pass as they are: the same product.
    assert np.array_equal(roundoff.matmul(A_in, B_in, unit="mi300x", in_format=pair)[0], got)
    reverse = MIXED[1 - MIXED.index(pair)]
    assert not np.array_equal(roundoff.matmul(A, B, unit="mi300x", in_format=reverse)[0], got)
    for i in range(3):
        for j in range(2):
            a, b = ",".join(map(repr, A[i])), ",".join(map(repr, B[:, j]))
            (e,) = emu("dot", "--unit", "mi300x", "--in", pair, "--a", a, "--b", b)
            assert e["in"] == pair and got[i, j] == emu_value(e["value"]), (i, j)
            value, _ = roundoff.dot(A[i], B[:, j], unit="mi300x", in_format=pair)
            assert value == got[i, j]


@pytest.mark.parametrize("extra", [["--unit", "h100", "--in", "fp8-e4m3fnuz:fp8-e5m2fnuz"],
                                   ["--unit", "mi250x", "--in", "fp16:bf16"],
                                   ["--unit", "mi300x", "--in", "fp8-e4m3fnuz:fp16"],
                                   ["--unit", "mi300x", "--in", "fp8-e5m2fnuz:fp8-e5m2fnuz"],
                                   ["--unit", "b200", "--in", "mxfp8-e4m3:mxfp8-e5m2"],
                                   ["--unit", "mi300x", "--in", "fp8-e4m3fnuz:fp8-e5m2fnuz", "--out", "fp16"]])
def test_refused_mixed_inputs_raise_emus_message(extra):
    done = subprocess.run([EMU, "dot", "--a", "1", "--b", "1", *extra], capture_output=True, text=True)
    assert done.returncode == 2 and "--in" in done.stderr, extra
    options = dict(zip(extra[::2], extra[1::2]))
    with pytest.raises(ValueError) as caught:
        roundoff.matmul(np.ones((2, 2)), np.ones((2, 2)), unit=options["--unit"], in_format=options["--in"],
                        out_format=options.get("--out"))
    assert str(caught.value) in done.stderr, extra


def test_context_operations_match_emu_eval():
    ctx = roundoff.Context(rounding="rz")
    a, b = np.array([0.1, 300.0, 1e-4]), np.array([0.2, 300.0, 3.0])
    for op, symbol in [("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/")]:
        got = getattr(ctx, op)("fp16", *roundoff.round([a, b], "fp16", "rz")[0])
        for x, y, g in zip(a, b, got):
            (e,) = emu("eval", f"{x!r} {symbol} {y!r}", "--format", "fp16", "--rounding", "rz")
            assert float(g) == emu_value(e["value"]), (op, x, y)


def test_context_fma_sqrt_convert_against_fractions():
    ctx = roundoff.Context()
    got = ctx.fma("fp16", [3.0], [1 / 3], [1e-4])[0]
    assert Fraction(float(got)) == exact_round(Fraction(3) * Fraction(1 / 3) + Fraction(1e-4), "fp16", "rne")
    assert float(ctx.sqrt("fp16", [2.0])[0]) == float(np.float16(math.sqrt(2)))
    assert float(ctx.convert("bf16", [1 / 3])[0]) == float(exact_round(Fraction(1 / 3), "bf16", "rne"))
    assert ctx.flags == roundoff.Flags.INEXACT


def test_context_flags_are_sticky_until_cleared():
    ctx = roundoff.Context()
    ctx.mul("fp16", [300.0], [300.0])
    ctx.add("fp16", [1.0], [1.0])
    assert ctx.flags == roundoff.Flags.OFLO | roundoff.Flags.INEXACT
    ctx.div("fp16", [1.0], [0.0])
    assert roundoff.Flags.DIV0 in ctx.flags
    ctx.sqrt("fp16", [-1.0])
    assert roundoff.Flags.INV in ctx.flags
    ctx.clear()
    assert ctx.flags == roundoff.Flags(0)


def test_broadcasting_and_result_dtypes():
    ctx = roundoff.Context()
    out = ctx.add("fp16", np.ones((2, 3)), [1.0, 2.0, 3.0])
    assert out.shape == (2, 3) and out.dtype == np.float32
    assert ctx.add("fp64", [0.1], [0.2]).dtype == np.float64
    assert roundoff.round([1.0], "e11m30")[0].dtype == np.float64


def test_trap_raises_floating_point_trap_with_the_report():
    ctx = roundoff.Context(traps="oflo,div0,inv", overflow="nan")
    with pytest.raises(roundoff.FloatingPointTrap) as caught:
        ctx.mul("fp16", [[1.0, 2.0], [300.0, 4.0]], [[1.0, 1.0], [300.0, 1.0]])
    trap = caught.value
    assert isinstance(trap, FloatingPointError)
    assert (trap.flag, trap.op, trap.element, trap.index) == ("OFLO", "mul", 2, (1, 0))
    assert trap.operands == (300.0, 300.0) and math.isnan(trap.result)
    assert trap.fp_sts == 0b101  # OFLO and INV (NANOO), bit 2 and bit 0
    assert roundoff.Flags.OFLO in trap.status and roundoff.Flags.OFLO in ctx.flags
    with pytest.raises(roundoff.FloatingPointTrap) as caught:
        roundoff.Context(traps=["div0"]).div("fp16", [1.0], [0.0])
    assert caught.value.flag == "DIV0"
    # Disabled traps only raise flags.
    assert np.isinf(roundoff.Context(traps="inv").mul("fp16", [300.0], [300.0])).all()


def test_trap_report_matches_emu_eval_trap():
    done = subprocess.run([EMU, "eval", "300 * 300", "--format", "fp16", "--trap", "oflo", "--json"],
                          capture_output=True, text=True)
    assert done.returncode == 3
    report = json.loads(done.stdout)
    with pytest.raises(roundoff.FloatingPointTrap) as caught:
        roundoff.Context(traps="oflo").mul("fp16", 300.0, 300.0)
    t = caught.value
    assert (t.flag, list(t.operands), t.result, t.fp_sts) == (report["trap"], report["operands"],
                                                              emu_value(report["result"]), report["fp_sts"])
    assert t.status == flags_of(report["flags"])


@pytest.mark.parametrize("call,exception,message", [
    (lambda: roundoff.round([1.0], "fp17"), ValueError, "--format: unknown format 'fp17'"),
    (lambda: roundoff.round([1.0], "fp16", "rn"), ValueError, "--rounding: unknown rounding mode 'rn'"),
    (lambda: roundoff.round([1.0], "fp16", seed=-1), ValueError, "--seed: expected an integer"),
    (lambda: roundoff.round([1.0], "fp16", "sr", sr_bits=65), ValueError, "--sr-bits: expected an integer from 0 to 64"),
    (lambda: roundoff.round([1.0], "fp16", overflow="wrap"), ValueError, "--overflow"),
    (lambda: roundoff.round([1.0], "fp16", rng="mt"), ValueError, "--rng"),
    (lambda: roundoff.round([1.0], "fp16", seed=1.5), TypeError, "seed must be an int"),
    (lambda: roundoff.round([1.0], 16), TypeError, "format must be a str"),
    (lambda: roundoff.round(["a"], "fp16"), TypeError, "array of real numbers"),
    (lambda: roundoff.round([1.0], "fp16", subnormals="off"), TypeError, "subnormals must be a bool"),
    (lambda: roundoff.bits([0.1], "fp16"), ValueError, "is not a value of fp16"),
    (lambda: roundoff.from_bits([1 << 16], "fp16"), ValueError, "bits beyond"),
    (lambda: roundoff.from_bits([1.0], "fp16"), TypeError, "array of integers"),
    (lambda: roundoff.Context(traps="oflo,bogus"), ValueError, "--trap: unknown flag 'bogus'"),
    (lambda: roundoff.dot([1.0], [1.0], unit="gpu"), ValueError, "--unit: unknown unit 'gpu'"),
    (lambda: roundoff.dot([1.0, 2.0], [1.0], unit="exact"), ValueError, "--a has 2 values but --b has 1"),
    (lambda: roundoff.dot([1.0], [1.0], unit="a100", in_format="fp8-e4m3", out_format="fp64"), ValueError, "--unit a100"),
    (lambda: roundoff.matmul(np.ones((2, 3)), np.ones((2, 3)), unit="exact"), ValueError, "B has 2 rows"),
    (lambda: roundoff.matmul(np.ones(3), np.ones(3), unit="exact"), ValueError, "matrices"),
])
def test_bad_arguments_raise_the_documented_exceptions(call, exception, message):
    with pytest.raises(exception, match=None) as caught:
        call()
    assert message in str(caught.value)


def test_bad_arguments_give_the_clis_message():
    done = subprocess.run([EMU, "round", "1", "--format", "fp17"], capture_output=True, text=True)
    assert done.returncode == 2
    with pytest.raises(ValueError) as caught:
        roundoff.round([1.0], "fp17")
    assert str(caught.value) in done.stderr


def test_submodules_load_lazily():
    # results, plot and report (pandas, xarray, matplotlib) are not imported with roundoff.
    code = "import sys, roundoff; print(sorted(m for m in sys.modules if m.startswith('roundoff.')))"
    done = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['roundoff._core']"
    with pytest.raises(AttributeError):
        roundoff.no_such_thing  # noqa: B018


def test_name_lists_are_emus_and_documented():
    # formats(), units() and block_formats() are emu's tables: the calculator's help and
    # configs/README.md name every one (tests/cli/test_names.cpp checks the tables).
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "README.md")).read()
    main_help = subprocess.run([EMU, "--help"], capture_output=True, text=True, check=True).stdout
    dot_help = subprocess.run([EMU, "dot", "--help"], capture_output=True, text=True, check=True).stdout
    word = lambda name, text: re.search(r"(?<![\w-])" + re.escape(name) + r"(?![\w]|-\w)", text)  # noqa: E731
    assert roundoff.formats()[:2] == ["fp64", "fp32"] and "nvfp4" in roundoff.block_formats()
    for name in roundoff.formats() + roundoff.block_formats():
        assert word(name, main_help) and word(name, readme), name
    for name in roundoff.units():
        assert word(name, dot_help) and word(name, readme), name
        roundoff.dot([1.0], [1.0], unit=name)  # every listed unit runs
