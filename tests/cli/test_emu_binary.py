"""Runs the real emu binary through its public interface (CONTRACT.md): golden values,
JSON shape, exit statuses, overflow policies, fp8-e4m3, stochastic rounding seeds,
dot/gemm, and 100,000 values on standard input. The oracle is an exact rounding written
here with Python's fractions, independently of the C++ code.

usage: /usr/bin/python3 test_emu_binary.py path/to/emu [path/to/sweep]
"""
import json
import random
import subprocess
import sys
import time
from fractions import Fraction

EMU = sys.argv[1]
SWEEP = sys.argv[2] if len(sys.argv) > 2 else None
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL:", what)


def emu(*args, stdin=None):
    p = subprocess.run([EMU, *args], input=stdin, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def emu_json(*args, stdin=None):
    rc, out, err = emu(*args, "--json", stdin=stdin)
    check(rc == 0, f"emu {' '.join(args)} --json: exit {rc}, stderr {err!r}")
    lines = out.splitlines()
    return [json.loads(line) for line in lines]


# ---- the oracle: exact rounding into an IEEE-like format (and OCP fp8-e4m3) -------------

class Fmt:
    def __init__(self, ebits, fbits, ocp_fn=False):
        self.ebits, self.fbits, self.ocp_fn = ebits, fbits, ocp_fn
        self.bias = 2 ** (ebits - 1) - 1
        self.emin = 1 - self.bias
        top = 2 ** ebits - 1
        self.emax = (top if ocp_fn else top - 1) - self.bias
        top_significand = 2 - Fraction(2, 2 ** fbits) if ocp_fn else 2 - Fraction(1, 2 ** fbits)
        self.max = top_significand * Fraction(2) ** self.emax
        self.min_normal = Fraction(2) ** self.emin

    @staticmethod
    def rounds_up(n, rest, q, mode, sign):
        if mode == "rne":
            return rest * 2 > q or (rest * 2 == q and n % 2 == 1)
        if mode == "rna":
            return rest * 2 >= q
        if mode == "ro":
            return rest > 0 and n % 2 == 0
        if mode == "rz":
            return False
        if mode == "ru":
            return rest > 0 and sign > 0
        if mode == "rd":
            return rest > 0 and sign < 0
        raise ValueError(mode)

    def round(self, x, mode="rne", tininess="before", subnormals=True):
        """x: a Fraction. Returns (value as Fraction or 'inf'/'-inf'/'nan', flags set).
        Tininess (IEEE 754 7.5): before rounding |x| < min_normal; after rounding, x
        rounded to the format's precision with an unbounded exponent is below it.
        Without subnormals a tiny x flushes to signed zero, a non-tiny x below
        min_normal (only after rounding) gives min_normal."""
        flags = set()
        if x == 0:
            return x, flags
        sign = -1 if x < 0 else 1
        a = abs(x)
        e = a.numerator.bit_length() - a.denominator.bit_length()
        if a < Fraction(2) ** e:
            e -= 1
        tiny = a < self.min_normal
        if tiny and tininess == "after":
            qu = Fraction(2) ** (e - self.fbits)
            nu, restu = divmod(a, qu)
            tiny = (nu + (1 if self.rounds_up(nu, restu, qu, mode, sign) else 0)) * qu < self.min_normal
        if not subnormals and a < self.min_normal:
            if tiny:
                return ("-0" if sign < 0 else Fraction(0)), {"UFLO", "INEXACT"}
            return sign * self.min_normal, {"INEXACT"}
        q = Fraction(2) ** (max(e, self.emin) - self.fbits)
        n, rest = divmod(a, q)  # n integer, rest in [0, q)
        up = self.rounds_up(n, rest, q, mode, sign)
        r = (n + (1 if up else 0)) * q
        if rest:
            flags.add("INEXACT")
            if tiny:
                flags.add("UFLO")
        if r > self.max:
            flags |= {"OFLO", "INEXACT"}
            to_inf = mode in ("rne", "rna") or (mode == "ru" and sign > 0) or (mode == "rd" and sign < 0)
            if not to_inf:
                return sign * self.max, flags
            # OCP E4M3 has no inf: the NaN of the same sign (S.1111.111, both signs exist).
            if self.ocp_fn:
                return ("nan" if sign > 0 else "-nan"), flags
            return ("inf" if sign > 0 else "-inf"), flags
        if r == 0 and sign < 0:
            return "-0", flags  # Fraction has no negative zero
        return sign * r, flags

    def bits(self, v):
        if v in ("nan", "-nan"):
            sign = 1 << (self.ebits + self.fbits) if v == "-nan" else 0
            return sign | ((2 ** (self.ebits + self.fbits) - 1) if self.ocp_fn else
                           (2 ** self.ebits - 1) << self.fbits | 1 << (self.fbits - 1))
        if v == "-0":
            return 1 << (self.ebits + self.fbits)
        if v in ("inf", "-inf"):
            return ((2 ** self.ebits - 1) << self.fbits) | ((1 << (self.ebits + self.fbits)) if v == "-inf" else 0)
        sign = 1 << (self.ebits + self.fbits) if v < 0 else 0
        a = abs(v)
        if a == 0:
            return sign
        if a < self.min_normal:
            return sign | int(a / Fraction(2) ** (self.emin - self.fbits))
        e = a.numerator.bit_length() - a.denominator.bit_length()
        if a < Fraction(2) ** e:
            e -= 1
        significand = int(a / Fraction(2) ** (e - self.fbits))
        return sign | ((e + self.bias) << self.fbits) | (significand - (1 << self.fbits))


FP16, BF16, FP8_E4M3 = Fmt(5, 10), Fmt(8, 7), Fmt(4, 3, ocp_fn=True)
FLAG_ORDER = ["OFLO", "DIV0", "INV", "UFLO", "INEXACT"]


def ordered(flags):
    return [f for f in FLAG_ORDER if f in flags]


def as_json_value(v):
    if v == "-0":
        return -0.0
    if v == "-nan":
        return "nan"  # JSON has one "nan" (CONTRACT.md); the bits keep the sign
    return v if isinstance(v, str) else float(v)


# ---- golden values -----------------------------------------------------------------

rc, out, err = emu("eval", "0.0004 + 0.25 - 0.25", "--format", "fp16", "--json")
check(rc == 0 and out == '{"input": "0.0004 + 0.25 - 0.25", "format": "fp16", "rounding": "rne", '
      '"value": 0.00048828125, "bits": "0x1000", "flags": ["INEXACT"], '
      '"raised_by": {"INEXACT": {"op": "round", "column": 1, "operands": [0.0004]}}}\n',
      f"golden eval line, got {out!r} {err!r}")

# The seeds' worked examples (issue 2), with the true values.
for literal, expected in [("0.2", 0.199951171875), ("0.02", 0.02001953125), ("0.002", 0.001953125),
                          ("0.0002", 0.000244140625), ("0.0004", 0.00048828125)]:
    [r] = emu_json("eval", f"{literal} + 0.25 - 0.25", "--format", "fp16")
    check(r["value"] == expected, f"{literal} + 0.25 - 0.25 in fp16: {r['value']} != {expected}")
# Several expressions: one line each, in order.
rs = emu_json("eval", "1 + 2", "2 * 3", "1 / 3", "--format", "fp16")
check([r["input"] for r in rs] == ["1 + 2", "2 * 3", "1 / 3"] and rs[0]["value"] == 3 and rs[1]["flags"] == []
      and rs[2]["value"] == float(FP16.round(Fraction(1, 3))[0]), f"multiple expressions: {rs}")
# Human output: the shortest decimal that reads back to fp16's 0.00048828125 is 0.0004883.
rc, out, _ = emu("eval", "0.0004 + 0.25 - 0.25", "--format", "fp16")
check(rc == 0 and "0.0004883" in out and "0x1000" in out and "INEXACT" in out and len(out.splitlines()) == 1,
      f"human eval line: {out!r}")

# emu info fp16 (IEEE 754-2008 binary16: max 65504, min normal 2^-14, min subnormal 2^-24).
[info] = emu_json("info", "fp16")
expected_info = {"name": "fp16", "exponent_bits": 5, "fraction_bits": 10, "precision": 11, "bias": 15,
                 "width": 16, "encoding": "ieee", "has_inf": True, "subnormals": True, "emin": -14, "emax": 15,
                 "max": 65504, "min_normal": 6.103515625e-05, "min_subnormal": 5.960464477539063e-08,
                 "unit_roundoff": 2.0 ** -11, "epsilon": 2.0 ** -10,
                 "finite_values": 2 ** 16 - 2 * 2 ** 10 - 1, "finite_encodings": 2 ** 16 - 2 * 2 ** 10}
for key, value in expected_info.items():
    check(info.get(key) == value, f"info fp16 {key}: {info.get(key)!r} != {value!r}")
[info8] = emu_json("info", "fp8-e4m3")
check(info8["max"] == 448 and info8["encoding"] == "ocp-fn" and info8["has_inf"] is False,
      f"info fp8-e4m3: {info8}")  # OCP 8-bit FP spec: E4M3 max 448, no infinities
[info_bf16] = emu_json("info", "bf16")
check(info_bf16["max"] == float((2 - Fraction(1, 128)) * 2 ** 127), f"info bf16 max {info_bf16['max']}")
[info_off] = emu_json("info", "fp16", "--subnormals", "off")
check(info_off["subnormals"] is False, "info --subnormals off")
rc, out, _ = emu("info", "fp16")
check(rc == 0 and "65504" in out, "info fp16 for people")

# ---- round: overflow policies, fp8, tiny/huge, hex, double-rounding traps ------------

def round_one(value, fmt, *options):
    [r] = emu_json("round", value, "--format", fmt, *options)
    return r


r = round_one("70000", "fp16")
check(r["value"] == "inf" and r["bits"] == "0x7c00" and r["flags"] == ["OFLO", "INEXACT"], f"70000 fp16: {r}")
r = round_one("70000", "fp16", "--overflow", "saturate")
check(r["value"] == 65504 and r["bits"] == "0x7bff" and "OFLO" in r["flags"], f"70000 saturate: {r}")
r = round_one("70000", "fp16", "--overflow", "nan")
check(r["value"] == "nan" and "OFLO" in r["flags"] and "INV" in r["flags"], f"70000 nan: {r}")
r = round_one("-70000", "fp16", "--rounding", "rz")
check(r["value"] == -65504 and r["bits"] == "0xfbff", f"-70000 rz: {r}")
r = round_one("448", "fp8-e4m3")
check(r["value"] == 448 and r["bits"] == "0x7e" and r["flags"] == [], f"448 e4m3: {r}")
r = round_one("464", "fp8-e4m3")  # the tie between 448 and the NaN pattern's place: to even 448
check(r["value"] == 448 and r["flags"] == ["INEXACT"], f"464 e4m3: {r}")
r = round_one("480", "fp8-e4m3")
check(r["value"] == "nan" and r["bits"] == "0x7f", f"480 e4m3: {r}")
r = round_one("0x1.8p-3", "fp16")
check(r["value"] == 0.1875 and r["flags"] == [], f"hex-float: {r}")
r = round_one("0x1.00000000000000000001p0", "fp16", "--rounding", "ru")
check(r["value"] == 1 + 2 ** -10, f"hex-float beyond double, ru: {r}")
r = round_one("1e-400", "fp16", "--rounding", "ru")
check(r["value"] == 2.0 ** -24 and r["flags"] == ["UFLO", "INEXACT"], f"1e-400 ru: {r}")
r = round_one("1e400", "fp16", "--rounding", "rz")
check(r["value"] == 65504 and "OFLO" in r["flags"], f"1e400 rz: {r}")
r = round_one("1e-6", "fp16", "--subnormals", "off")
check(r["value"] == 0 and r["flags"] == ["UFLO", "INEXACT"], f"subnormals off: {r}")
for text, expected in [("inf", "inf"), ("-Infinity", "-inf"), ("+INF", "inf"), ("nan", "nan")]:
    r = round_one(text, "fp16")
    check(r["value"] == expected and r["flags"] == [], f"{text}: {r}")
# Just above fp16's tie 1 + 2^-11 (nearest double: the tie itself): rounds up, once.
r = round_one("1.00048828125000000000000000001", "fp16")
check(r["bits"] == "0x3c01", f"double-rounding trap fp16: {r}")
r = round_one("1.00390625000000000000000000001", "bf16")  # bf16 tie 1 + 2^-8
check(r["bits"] == "0x3f81", f"double-rounding trap bf16: {r}")
r = round_one("1", "tf32")
check(r["bits"] == "0x1fc00", f"tf32 bits width: {r}")
r = round_one("1", "fp64")
check(r["bits"] == "0x3ff0000000000000", f"fp64 bits: {r}")
r = round_one("-2", "fp8-e5m2")
check(r["bits"] == "0xc0", f"fp8-e5m2 bits: {r}")
# Each value's own flags.
rs = emu_json("round", "1", "0.1", "70000", "1", "--format", "fp16")
check([x["flags"] for x in rs] == [[], ["INEXACT"], ["OFLO", "INEXACT"], []], f"per-value flags: {rs}")

# Stochastic rounding: reproducible with a seed, different across seeds, always a neighbour.
values = [f"{random.Random(5).uniform(-10, 10) + i / 1000:.12f}" for i in range(2000)]
stdin = "\n".join(values) + "\n"
runs = {}
for seed in ("1", "1", "2"):
    runs.setdefault(seed, []).append(emu_json("round", "-", "--format", "bf16", "--rounding", "sr", "--seed", seed,
                                              stdin=stdin))
check(runs["1"][0] == runs["1"][1], "sr with the same seed is reproducible")
check(runs["1"][0] != runs["2"][0], "sr with another seed differs")
for text, r in zip(values, runs["2"][0]):
    x = Fraction(text)
    down, up = BF16.round(x, "rd")[0], BF16.round(x, "ru")[0]
    if Fraction(r["value"]) not in (down, up):
        check(False, f"sr result {r['value']} of {text} is not a neighbour")
        break
sr_bits = emu_json("round", "-", "--format", "bf16", "--rounding", "sr", "--sr-bits", "4", "--rng", "ipu",
                   "--seed", "9", stdin=stdin)
check(len(sr_bits) == len(values), "sr with --sr-bits 4 --rng ipu")

# ---- fp64 and other 52-bit formats: inputs near a tie are rounded once, every mode ----

FP64, E8M52 = Fmt(11, 52), Fmt(8, 52)
MODES = ["rne", "rna", "rz", "ru", "rd", "ro"]


def exact_text(x, hex_form):
    """A Fraction whose denominator is 2^a 5^b as exact text: hex 0x..p-a, or decimal."""
    sign = "-" if x < 0 else ""
    x = abs(x)
    den = x.denominator
    twos = (den & -den).bit_length() - 1
    rest = den >> twos
    fives = 0
    while rest % 5 == 0:
        rest //= 5
        fives += 1
    assert rest == 1
    if hex_form and fives == 0:
        return f"{sign}0x{x.numerator:x}p-{twos}"
    k = max(twos, fives)
    return f"{sign}{x.numerator * 10 ** k // x.denominator}e-{k}"


def near_ties(fmt, gen, count):
    """Texts a hair above and below ties of fmt (and the ties), with their exact values."""
    out = []
    for _ in range(count):
        e = gen.randint(fmt.emin - 1, fmt.emax)
        frac = gen.getrandbits(fmt.fbits)
        if e < fmt.emin:
            v, ulp = Fraction(frac) * Fraction(2) ** (fmt.emin - fmt.fbits), Fraction(2) ** (fmt.emin - fmt.fbits)
        else:
            v = Fraction(frac + 2 ** fmt.fbits) * Fraction(2) ** (e - fmt.fbits)
            ulp = Fraction(2) ** (e - fmt.fbits)
        if v + ulp > fmt.max:
            continue
        tie = v + ulp / 2
        d = gen.randint(54, 90)  # the residual is ulp/2 within 2^-d ulp: it rounds to ulp/2 in double
        sign = gen.choice([1, -1])
        for x, hex_form in [(tie, True), (tie + ulp / 2 ** d, True), (tie - ulp / 2 ** d, gen.random() < 0.5)]:
            out.append((exact_text(sign * x, hex_form), sign * x))
    return out


near_gen = random.Random(52)
audit = ["9007199254740993.0000000000000000000001", "0x1.000000000000080000000000000001p0",
         "9007199254740992.9999999999999999999", "0x1.00000000000007ffffffffffffffffp0",
         "2.4703282292062328e-324", "1.797693134862315807937289714053034150799e308", "0x1p-1075",
         "-0x1.0000000000001p-1075", "0x1.fffffffffffff8p1023", "0x1.fffffffffffff7ffffffffffffp1023"]


def parse_fraction(text):
    if "0x" in text:
        neg = text.startswith("-")
        mant, exp = text.lstrip("-")[2:].split("p")
        whole, _, frac = mant.partition(".")
        value = Fraction(int(whole + frac, 16), 16 ** len(frac)) * Fraction(2) ** int(exp)
        return -value if neg else value
    return Fraction(text)


for fmt_name, fmt, extra in [("fp64", FP64, audit), ("e8m52", E8M52, [])]:
    cases = [(t, parse_fraction(t)) for t in extra] + near_ties(fmt, near_gen, 150)
    stdin = "\n".join(t for t, _ in cases) + "\n"
    for mode in MODES:
        rs = emu_json("round", "-", "--format", fmt_name, "--rounding", mode, stdin=stdin)
        check(len(rs) == len(cases), f"{fmt_name} {mode}: {len(rs)} results for {len(cases)} inputs")
        bad = 0
        for (text, x), r in zip(cases, rs):
            value, flags = fmt.round(x, mode)
            want_bits = f"0x{fmt.bits(value):0{(1 + fmt.ebits + fmt.fbits + 3) // 4}x}"
            if r["bits"] != want_bits or r["flags"] != ordered(flags) or r["value"] != as_json_value(value):
                bad += 1
                if bad <= 3:
                    check(False, f"{fmt_name} {mode} {text}: got {r['bits']} {r['flags']}, "
                                 f"oracle {want_bits} {ordered(flags)}")
        check(bad == 0, f"{fmt_name} {mode}: {bad} of {len(cases)} near-tie inputs differ from the oracle")
# eval rounds its literals the same way.
[r] = emu_json("eval", "9007199254740993.0000000000000000000001 + 0", "--format", "fp64")
check(r["bits"] == "0x4340000000000001", f"eval near-tie literal in fp64: {r}")

# ---- fp8-e4m3 NaN signs and flags; NaN on overflow; subnormals off -----------------

for text, bits, flags in [("-inf", "0xff", ["INV"]), ("inf", "0x7f", ["INV"]), ("-1000", "0xff", ["OFLO", "INEXACT"]),
                          ("1000", "0x7f", ["OFLO", "INEXACT"]), ("-nan", "0xff", [])]:
    r = round_one(text, "fp8-e4m3")
    check(r["value"] == "nan" and r["bits"] == bits and r["flags"] == flags, f"e4m3 {text}: {r}")
r = round_one("-1000", "fp8-e4m3", "--rounding", "ru")  # toward zero: -448, no NaN
check(r["value"] == -448 and r["bits"] == "0xfe", f"e4m3 -1000 ru: {r}")
# NANOO gives the canonical positive NaN for both signs (emu/status.hpp).
r = round_one("-70000", "fp16", "--overflow", "nan")
check(r["bits"] == "0x7e00" and r["flags"] == ["OFLO", "INV", "INEXACT"], f"-70000 --overflow nan: {r}")
# Tininess before rounding: 2^-14 - 2^-26 would round up to min normal, yet flushes.
r = round_one("0x1.ffep-15", "fp16", "--subnormals", "off")
check(r["bits"] == "0x0000" and r["flags"] == ["UFLO", "INEXACT"], f"tiny before rounding flushes: {r}")
r = round_one("0x1.ffep-15", "fp16")
check(r["bits"] == "0x0400", f"with subnormals it rounds to min normal: {r}")

# ---- --rng ipu --seed S: the $PRNG_SEED expansion and xoroshiro128aox ---------------

M64 = 2 ** 64 - 1


def aox_stream(v):
    """xoroshiro128aox (Hanlon and Felix, IEEE Trans. Computers 72(5), 2023) from the IPU's
    $PRNG_SEED expansion of the 32-bit v, written here from the published algorithm."""
    nv = ~v & 0xFFFFFFFF
    s0 = v | nv << 32
    s1 = ((v << 13 | nv >> 19) & 0xFFFFFFFF) | (((nv << 13 | v >> 19) & 0xFFFFFFFF) << 32)

    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & M64
    while True:
        sx, sa = s0 ^ s1, s0 & s1
        yield sx ^ (rotl(sa, 1) | rotl(sa, 2))
        s0 = rotl(s0, 55) ^ sx ^ ((sx << 14) & M64)
        s1 = rotl(sx, 36)


ipu_gen = random.Random(128)
ipu_values = []
for i in range(600):
    if i % 7 == 0:  # exact in bf16: no random word drawn
        ipu_values.append(float(BF16.round(Fraction(ipu_gen.uniform(-50, 50)))[0]))
    else:
        ipu_values.append(ipu_gen.choice([-1, 1]) * ipu_gen.uniform(0.001, 1000))
ipu_texts = [v.hex() for v in ipu_values]  # exact doubles: the discarded fraction is exact
for seed in (0, 1, 12345, 2 ** 32 - 1):
    for k in (0, 4, 13, 64):
        rs = emu_json("round", "-", "--format", "bf16", "--rounding", "sr", "--rng", "ipu", "--seed", str(seed),
                      "--sr-bits", str(k), stdin="\n".join(ipu_texts) + "\n")
        words = aox_stream(seed)
        bad = 0
        for text, v, r in zip(ipu_texts, ipu_values, rs):
            x = Fraction(v)
            toward, away = BF16.round(x, "rz")[0], (BF16.round(x, "ru")[0] if x > 0 else BF16.round(x, "rd")[0])
            if toward == x:
                expected = x
            else:
                f = (abs(x) - abs(toward)) / (abs(away) - abs(toward))
                w = next(words)
                up = (w < f * 2 ** 64) if k == 0 else ((w >> (64 - k)) < int(f * 2 ** k))
                expected = away if up else toward
            if Fraction(r["value"]) != expected:
                bad += 1
        check(len(rs) == len(ipu_texts) and bad == 0,
              f"--rng ipu --seed {seed} --sr-bits {k}: {bad} results differ from xoroshiro128aox's words")
rc, _, err = emu("round", "1.1", "--format", "bf16", "--rounding", "sr", "--rng", "ipu", "--seed", str(2 ** 32))
check(rc == 2 and "4294967295" in err, f"--rng ipu takes a 32-bit seed: {rc} {err!r}")
rc, _, _ = emu("round", "1.1", "--format", "bf16", "--rounding", "sr", "--seed", str(2 ** 64 - 1))
check(rc == 0, "--rng philox takes a 64-bit seed")

# ---- write errors -----------------------------------------------------------------

for args in (["round", "1", "--format", "fp16"], ["info", "fp16", "--json"], ["--help"]):
    with open("/dev/full", "w") as full:
        p = subprocess.run([EMU, *args], stdout=full, stderr=subprocess.PIPE, text=True)
    check(p.returncode == 1 and p.stderr.startswith("emu: write error:") and len(p.stderr.splitlines()) == 1,
          f"emu {args} > /dev/full: exit {p.returncode}, stderr {p.stderr!r}")

# ---- small things: argument names, format spellings, blank lines, -nan, 2^k ---------

rc, _, err = emu("info", "e12m3")
check(rc == 2 and "FORMAT" in err and "--format" not in err, f"info names its argument: {err!r}")
for args in (["info", "e05m2"], ["round", "1", "--format", "e05m2"], ["round", "1", "--format", "e5m02"]):
    rc, _, err = emu(*args)
    check(rc == 2 and "e5m2" in err and len(err.splitlines()) == 1, f"emu {args}: {rc} {err!r}")
rs = emu_json("round", "-", "--format", "fp16", stdin="1\n\n   \n\t\n2\n")
check([r["input"] for r in rs] == ["1", "2"], f"blank stdin lines are skipped: {rs}")
rc, _, err = emu("round", "-", "--format", "fp16", stdin="1\n\n0.3.4\n")
check(rc == 2 and "line 3" in err, f"line numbers count blank lines: {err!r}")
rc, out, _ = emu("round", "-nan", "nan", "--format", "fp16")
lines = out.splitlines()
check(rc == 0 and "-> -nan" in lines[0] and "0xfe00" in lines[0] and "-> nan" in lines[1] and "0x7e00" in lines[1],
      f"-nan printed for people: {out!r}")
rc, out, _ = emu("info", "fp16")
check("0.00048828125 (2^-11)" in out and "(2^-14)" in out and "(2^-24)" in out, f"info shows powers of two: {out!r}")

# ---- 100,000 values on standard input, timed, checked against the oracle -------------

gen = random.Random(20261122)
texts = []
for i in range(100_000):
    kind = i % 4
    if kind == 0:  # random decimals over fp16's whole range, subnormals and overflow included
        texts.append(f"{gen.choice('+-')}{gen.randint(1, 10 ** gen.randint(1, 20))}e{gen.randint(-30, 4)}")
    elif kind == 1:  # plain decimals as people type them
        texts.append(f"{gen.uniform(-1000, 1000):.{gen.randint(0, 8)}f}")
    elif kind == 2:  # a hair above or below an fp16 tie: the double-rounding traps
        b = gen.randint(0, 0x7bfe)
        e, m = b >> 10, b & 0x3ff
        v = Fraction(m, 2 ** 24) if e == 0 else Fraction(1024 + m, 2 ** 10) * Fraction(2) ** (e - 15)
        ulp = Fraction(1, 2 ** 24) if e == 0 else Fraction(2) ** (e - 25)
        x = v + ulp / 2 + gen.choice([-1, 1]) * Fraction(1, 10 ** 40)
        digits = 60
        texts.append(str(x.numerator * 10 ** digits // x.denominator) + f"e-{digits}")
    else:  # hex-floats
        texts.append(f"{gen.choice(['', '-'])}0x{gen.randint(1, 2 ** 20):x}p{gen.randint(-40, 0)}")
stdin = "\n".join(texts) + "\n"
start = time.perf_counter()
rc, out, err = emu("round", "-", "--format", "fp16", "--json", stdin=stdin)
elapsed = time.perf_counter() - start
print(f"emu round - --format fp16 --json: 100,000 values in {elapsed:.2f} s")
check(rc == 0, f"100k: exit {rc} {err!r}")
results = [json.loads(line) for line in out.splitlines()]
check(len(results) == len(texts), f"100k: {len(results)} result lines")
bad = 0
for text, r in zip(texts, results):
    x = Fraction(float.fromhex(text)) if "0x" in text else Fraction(text)
    value, flags = FP16.round(x)
    if r["input"] != text or r["value"] != as_json_value(value) or r["bits"] != f"0x{FP16.bits(value):04x}" \
            or r["flags"] != ordered(flags):
        bad += 1
        if bad <= 5:
            check(False, f"100k: {text}: got {r}, oracle {as_json_value(value)} 0x{FP16.bits(value):04x} {ordered(flags)}")
check(bad == 0, f"100k: {bad} results differ from the oracle")
start = time.perf_counter()
rc, out, _ = emu("round", "-", "--format", "fp16", stdin=stdin)
print(f"emu round - --format fp16 (for people): 100,000 values in {time.perf_counter() - start:.2f} s")
check(rc == 0 and len(out.splitlines()) == len(texts), "100k for people")

# ---- dot and gemm -------------------------------------------------------------------

[r] = emu_json("dot", "--unit", "exact", "--a", "1,2,3", "--b", "4,5,6")
check(r["value"] == 32 and r["bits"] == "0x42000000" and r["flags"] == [] and r["unit"] == "exact"
      and r["in"] == "fp16" and r["out"] == "fp32" and r["format"] == "fp32" and r["rounding"] == "rne",
      f"dot exact: {r}")
[r] = emu_json("dot", "--unit", "fp16-seq", "--a", "1", "--b", "1", "--rounding", "rz")
check(r["format"] == "fp16" and r["out"] == "fp16" and r["rounding"] == "rz", f"dot format/rounding fields: {r}")
# fp16-seq: c <- fl16(a_i * b_i + c), in order; inputs rounded into fp16 first.
a, b, c = ["0.1", "0.2", "0.3", "1e-4"], ["3", "0.7", "1.1", "5"], "1"
acc = FP16.round(Fraction(c))[0]
seq_flags = set()
for ai, bi in zip(a, b):
    acc, f = FP16.round(FP16.round(Fraction(ai))[0] * FP16.round(Fraction(bi))[0] + acc)
    seq_flags |= f
[r] = emu_json("dot", "--unit", "fp16-seq", "--a", ",".join(a), "--b", ",".join(b), "--c", c)
check(r["value"] == float(acc) and r["flags"] == ordered(seq_flags) and r["input_flags"] == ["INEXACT"],
      f"dot fp16-seq: {r}, oracle {float(acc)}")

# ---- provenance: raised_by, --trap (exit 3), --tininess --------------------------------

# CONTRACT.md's example: the operator as written, its 1-based column, its operands.
[r] = emu_json("eval", "(300) * 300", "--format", "fp16")
check(list(r) == ["input", "format", "rounding", "value", "bits", "flags", "raised_by"],
      f"eval fields in order, raised_by added last: {list(r)}")
check(r["raised_by"] == {"OFLO": {"op": "*", "column": 7, "operands": [300, 300]},
                         "INEXACT": {"op": "*", "column": 7, "operands": [300, 300]}}, f"raised_by: {r}")
check(list(r["raised_by"]) == ["OFLO", "INEXACT"], "raised_by keys in flag order")
[r] = emu_json("eval", "0.1 + 300 * 300", "--format", "fp16")
check(r["raised_by"] == {"OFLO": {"op": "*", "column": 11, "operands": [300, 300]},
                         "INEXACT": {"op": "round", "column": 1, "operands": [0.1]}}, f"first raisers differ: {r}")
[r] = emu_json("eval", "1/3 + 1/0 + 2/0 + inf/0 + (inf - inf)", "--format", "fp16")
check(r["raised_by"] == {"DIV0": {"op": "/", "column": 8, "operands": [1, 0]},
                         "INV": {"op": "-", "column": 32, "operands": ["inf", "inf"]},
                         "INEXACT": {"op": "/", "column": 2, "operands": [1, 3]}}, f"DIV0 and INV: {r}")
[r] = emu_json("eval", "1 + 2", "--format", "fp16")
check(r["raised_by"] == {}, f"no flags, empty raised_by: {r}")
rs = emu_json("round", "1", "70000", "--format", "fp16")
check(rs[0]["raised_by"] == {} and rs[1]["raised_by"] == {"OFLO": {"op": "round", "operands": [70000]},
                                                         "INEXACT": {"op": "round", "operands": [70000]}},
      f"round raised_by: {rs}")
check(list(rs[1]) == ["input", "format", "rounding", "value", "bits", "flags", "raised_by"], f"round fields: {rs[1]}")
rc, out, _ = emu("eval", "0.1 + 300 * 300", "--format", "fp16")
check(rc == 0 and out.rstrip().endswith("(first raised by: OFLO 300 * 300 at column 11; INEXACT round(0.1) at column 1)"),
      f"raised_by for people: {out!r}")
rc, out, _ = emu("round", "70000", "--format", "fp16")
check(rc == 0 and "(first raised by: OFLO INEXACT round(70000))" in out, f"round raised_by for people: {out!r}")

TRAP_FIELDS = ["input", "format", "rounding", "trap", "op", "column", "scope", "element", "operands", "result", "bits",
               "fp_sts", "flags"]


def trapped(*args, stdin=None):
    """Runs emu expecting exit 3; returns the JSON lines."""
    rc, out, err = emu(*args, "--json", stdin=stdin)
    check(rc == 3 and not err, f"emu {' '.join(args)}: exit {rc} (expected 3), stderr {err!r}")
    return [json.loads(line) for line in out.splitlines()]


lines = trapped("eval", "1 + 2", "(300) * 300", "5", "--format", "fp16", "--trap", "oflo,div0,inv")
check(len(lines) == 2 and lines[0]["value"] == 3, f"results before the trap, nothing after: {lines}")
t = lines[-1]
check(list(t) == TRAP_FIELDS, f"trap report fields: {list(t)}")
check(t["input"] == "(300) * 300" and t["trap"] == "OFLO" and t["op"] == "*" and t["column"] == 7 and
      t["scope"] == "" and t["element"] is None and t["operands"] == [300, 300] and t["result"] == "inf" and
      t["bits"] == "0x7c00" and t["fp_sts"] == 4 and t["flags"] == ["OFLO", "INEXACT"], f"trap report: {t}")
# Every inf/zero division against IEEE 754 7.3: only a finite x / 0 raises DIV0.
for expr, flags in [("inf / 0", []), ("-inf / -0", []), ("inf / -0", []), ("-inf / 0", []), ("0 / 0", ["INV"]),
                    ("1 / 0", ["DIV0"]), ("-2 / -0", ["DIV0"]), ("inf / inf", ["INV"])]:
    [r] = emu_json("eval", expr, "--format", "fp16")
    check(r["flags"] == flags, f"{expr}: flags {r['flags']} != {flags}")
    rc, out, _ = emu("eval", expr, "--format", "fp16", "--trap", "div0", "--json")
    check(rc == (3 if "DIV0" in flags else 0), f"{expr} --trap div0: exit {rc}")
[t] = trapped("eval", "1 / 0", "--format", "fp16", "--trap", "DIV0")
check(t["trap"] == "DIV0" and t["op"] == "/" and t["column"] == 3 and t["result"] == "inf" and t["fp_sts"] == 2,
      f"div0 trap: {t}")
[t] = trapped("eval", "0 / 0", "--format", "fp16", "--trap", "inv")
check(t["trap"] == "INV" and t["result"] == "nan" and t["fp_sts"] == 1, f"inv trap: {t}")
# A subset: DIV0 passes (into the status), the overflow traps; $FP_STS shows both.
[t] = trapped("eval", "1/0 + 300 * 300", "--format", "fp16", "--trap", "oflo")
check(t["trap"] == "OFLO" and t["column"] == 11 and t["flags"] == ["OFLO", "DIV0", "INEXACT"] and t["fp_sts"] == 6,
      f"oflo among others: {t}")
# The would-be result under each overflow policy; NANOO's INV is the consequence: OFLO is named.
for policy, result, bits, fp_sts in [("inf", "inf", "0x7c00", 4), ("saturate", 65504, "0x7bff", 4),
                                     ("nan", "nan", "0x7e00", 5)]:
    lines = trapped("round", "1", "70000", "2", "--format", "fp16", "--overflow", policy, "--trap", "oflo,inv")
    t = lines[-1]
    check(len(lines) == 2 and [k for k in TRAP_FIELDS if k != "column"] == list(t) and t["op"] == "round" and
          t["trap"] == "OFLO" and t["operands"] == [70000] and t["result"] == result and t["bits"] == bits and
          t["fp_sts"] == fp_sts, f"round trap, overflow {policy}: {lines}")
# INEXACT and UFLO can trap too.
[t] = trapped("eval", "1 + 0.1", "--format", "fp16", "--trap", "inexact")
check(t["trap"] == "INEXACT" and t["op"] == "round" and t["column"] == 5 and t["operands"] == [0.1] and
      t["fp_sts"] == 0, f"inexact trap: {t}")
[t] = trapped("round", "1e-6", "--format", "fp16", "--trap", "uflo")
check(t["trap"] == "UFLO" and t["result"] == float(FP16.round(Fraction("1e-6"))[0]), f"uflo trap: {t}")
rc, out, err = emu("eval", "(300) * 300", "--format", "fp16", "--trap", "oflo")
check(rc == 3 and not err and "trapped: OFLO in 300 * 300 at column 7" in out and "$FP_STS 0x4 (OFLO)" in out,
      f"trap for people: {out!r} {err!r}")
rc, out, _ = emu("round", "1", "--format", "fp16", "--trap", "oflo,div0,inv", "--json")
check(rc == 0, "no trap: exit 0")

# --tininess on the values next to min_normal, every mode, subnormals on and off,
# against the oracle above (both rules from IEEE 754 7.5).
for fmt, name, step in [(FP16, "fp16", Fraction(2) ** -28), (BF16, "bf16", Fraction(2) ** -136)]:
    xs = [s * (fmt.min_normal - k * step) for k in range(-6, 40) for s in (1, -1)]
    texts = [f"{'-' if x < 0 else ''}0x{int(abs(x) / step):x}p-{step.denominator.bit_length() - 1}" for x in xs]
    for mode in MODES:
        for tininess in ("before", "after"):
            for subnormals in ("on", "off"):
                rs = emu_json("round", "-", "--format", name, "--rounding", mode, "--tininess", tininess,
                              "--subnormals", subnormals, stdin="\n".join(texts) + "\n")
                for x, r in zip(xs, rs):
                    value, flags = fmt.round(x, mode, tininess, subnormals == "on")
                    if r["value"] != as_json_value(value) or r["flags"] != ordered(flags):
                        check(False, f"{name} {mode} --tininess {tininess} --subnormals {subnormals} {x}: "
                                     f"{r['value']} {r['flags']}, expected {as_json_value(value)} {ordered(flags)}")
                        break
# The two rules differ there (else the loop above proves nothing).
[before] = emu_json("round", "0x1.ffep-15", "--format", "fp16")
[after] = emu_json("round", "0x1.ffep-15", "--format", "fp16", "--tininess", "after")
check(before["flags"] == ["UFLO", "INEXACT"] and after["flags"] == ["INEXACT"] and before["bits"] == after["bits"],
      f"2^-14 - 2^-26: {before} {after}")
[flushed] = emu_json("round", "0x1.ffep-15", "--format", "fp16", "--subnormals", "off")
[kept] = emu_json("round", "0x1.ffep-15", "--format", "fp16", "--subnormals", "off", "--tininess", "after")
check(flushed["value"] == 0 and kept["value"] == 2.0 ** -14 and kept["flags"] == ["INEXACT"], f"{flushed} {kept}")
# Units take it too (their contexts and the rounding of their inputs).
[r] = emu_json("dot", "--unit", "fp16-seq", "--a", "0x1.ffep-15", "--b", "1", "--tininess", "after")
check(r["input_flags"] == ["INEXACT"], f"dot --tininess after: {r}")
[r] = emu_json("dot", "--unit", "fp16-seq", "--a", "0x1.ffep-15", "--b", "1")
check(r["input_flags"] == ["UFLO", "INEXACT"], f"dot --tininess before: {r}")

# Help: exit status 3 in both programs, the tininess rule for subnormals on and off.
rc, out, _ = emu("--help")
check(rc == 0 and "3 an enabled\nfloating-point exception trapped" in out, f"emu --help exit status 3: {out!r}")
rc, out, _ = emu("round", "--help")
check(rc == 0 and "--tininess" in out and "before (default)" in out and "With subnormals on" in out and
      "--subnormals off" in out and "status 3" in out, f"emu round --help tininess: {out!r}")
rc, out, _ = emu("eval", "--help")
check(rc == 0 and "raised_by" in out and "--trap" in out, f"emu eval --help: {out!r}")
if SWEEP:
    p = subprocess.run([SWEEP, "--help"], capture_output=True, text=True)
    check(p.returncode == 0 and "Status 3" in p.stdout and "recorded outcome" in p.stdout,
          f"sweep --help exit status 3: {p.stdout!r}")

import os
import tempfile
tmp = tempfile.mkdtemp()


def write(name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


A = write("A.txt", "0.1 0.2 0.3\n# a comment\n\n1 2 3\n")
B = write("B.txt", "1 2\n3 4\n5 6.5\n")
C = write("C.txt", "1 1\n1 1\n")
rs = emu_json("gemm", "--unit", "exact", A, B, C)
check(len(rs) == 4 and [(r["row"], r["col"]) for r in rs] == [(0, 0), (0, 1), (1, 0), (1, 1)], f"gemm shape: {rs}")
check(all(r["format"] == "fp32" == r["out"] and r["rounding"] == "rne" for r in rs), f"gemm format field: {rs[0]}")
FP32 = Fmt(8, 23)
rows_a = [[FP16.round(Fraction(t))[0] for t in line.split()] for line in ["0.1 0.2 0.3", "1 2 3"]]
cols_b = list(zip(*[[FP16.round(Fraction(t))[0] for t in line.split()] for line in ["1 2", "3 4", "5 6.5"]]))
for r in rs:
    exact = sum(x * y for x, y in zip(rows_a[r["row"]], cols_b[r["col"]])) + 1
    check(r["value"] == float(FP32.round(exact)[0]), f"gemm element {r}")
rc, out, _ = emu("gemm", "--unit", "exact", A, B)
check(rc == 0 and len(out.splitlines()) == 3, f"gemm for people: {out!r}")
# --threads: 300 rows, cut into bands from 2 threads on (emu/threads.hpp); the same output
# at any number, with sr's random bits too.
rng = random.Random(22)
A_big = write("A_big.txt", "\n".join(" ".join(repr(rng.gauss(0, 1)) for _ in range(40)) for _ in range(300)))
B_big = write("B_big.txt", "\n".join(" ".join(repr(rng.gauss(0, 1)) for _ in range(20)) for _ in range(40)))
for unit, rounding in [("h100", "rne"), ("ipu-amp", "sr"), ("fp16-seq", "rne")]:
    outs = [emu("gemm", "--unit", unit, "--rounding", rounding, A_big, B_big, "--threads", t, "--json")
            for t in ("1", "2", "0")]
    check(outs[0][0] == 0 and all(o == outs[0] for o in outs), f"gemm --threads 1, 2, 0 differ for {unit}")

# ---- b200's block-scaled MMA: emu dot/gemm with a block format ----------------------
# Oracle: the model emu/block_mma.hpp documents (after the PTX ISA and MMA-Sim; no
# measured data), written here with fractions on the elements and scales that
# `emu quantize --json` reports: kind::mxf8f6f4 (K 32, 25 kept bits, each product's
# exponent its elements' plus its scales'), kind::mxf4/mxf4nvf4 (mxfp4-e2m1 and nvfp4: K
# 64, sums of 16 products with the scales' exponents, 35 kept bits); terms truncated
# below the largest exponent, summed exactly, rz into fp32, instructions chained.
ELEMENT_EMIN = {"mxfp8-e4m3": -6, "mxfp8-e5m2": -14, "mxfp6-e2m3": 0, "mxfp6-e3m2": -2, "mxfp4-e2m1": 0,
                "nvfp4": 0}


def floor_log2(x):
    e = x.numerator.bit_length() - x.denominator.bit_length()
    return e - 1 if x < Fraction(2) ** e else e


def block_mma_oracle(fmt, a, b, c):
    """a, b: [(element, scale)] as Fractions; c a Fraction. Returns (value, flags)."""
    grouped = fmt in ("mxfp4-e2m1", "nvfp4")
    K, kept = (64, 35) if grouped else (32, 25)
    scale_emin = -6 if fmt == "nvfp4" else -127
    emin = ELEMENT_EMIN[fmt]
    flags = set()
    for first in range(0, len(a), K):
        end = min(first + K, len(a))
        if c == "-0":  # a result rz made -0: a zero accumulator
            c = Fraction(0)
        terms = [(c, max(floor_log2(abs(c)), -126))] if c else []
        if grouped:
            for g in range(first, end, 16):
                s = sum(a[i][0] * b[i][0] for i in range(g, min(g + 16, end)))
                sa, sb = a[g][1], b[g][1]
                if s and sa and sb:
                    terms.append((s * sa * sb, max(floor_log2(sa), scale_emin) + max(floor_log2(sb), scale_emin)))
        else:
            for i in range(first, end):
                (x, sa), (y, sb) = a[i], b[i]
                if x and y:
                    terms.append((x * sa * y * sb, max(floor_log2(abs(x)), emin) + max(floor_log2(abs(y)), emin)
                                  + floor_log2(sa) + floor_log2(sb)))
        if not terms:
            c = Fraction(0)
            continue
        q = Fraction(2) ** (max(e for _, e in terms) - kept)
        total = Fraction(0)
        for v, _ in terms:
            n = int(v / q)  # toward zero
            if n * q != v:
                flags.add("INEXACT")
            total += n * q
        if abs(total) >= Fraction(2) ** 128:
            return ("inf" if total > 0 else "-inf"), flags | {"OFLO", "INEXACT"}
        c, f = FP32.round(total, "rz")
        flags |= f
    return c, flags


def quantized_operand(fmt, values, *options):
    rs = emu_json("quantize", "--format", fmt, *[repr(v) for v in values], *options)
    flags = set()
    for r in rs:
        flags |= set(r["block_flags"])
    return [(Fraction(r["element"]), Fraction(r["scale"])) for r in rs], Fraction(rs[0]["tensor_scale"]), flags


def block_expected(fmt, a_values, b_values, c, *options, ts_a=None, ts_b=None):
    """The documented result of emu dot/gemm --unit b200 --in fmt: (value, flags, input flags, alpha)."""
    more_a = ["--tensor-scale", float(ts_a).hex()] if ts_a is not None else []  # exact
    more_b = ["--tensor-scale", float(ts_b).hex()] if ts_b is not None else []
    qa, ta, fa = quantized_operand(fmt, a_values, *options, *more_a)
    qb, tb, fb = quantized_operand(fmt, b_values, *options, *more_b)
    if fmt != "nvfp4":
        value, flags = block_mma_oracle(fmt, qa, qb, c)
        return value, flags, fa | fb, None
    # nvfp4: the MMA from zero, then alpha = fp32(ts_a * ts_b) and one fp32 fma with c (rne).
    acc, flags = block_mma_oracle(fmt, qa, qb, Fraction(0))
    alpha, alpha_flags = FP32.round(ta * tb)
    acc = Fraction(0) if acc == "-0" else acc
    value, f = FP32.round(alpha * acc + c)
    return value, flags | f, fa | fb | alpha_flags, float(alpha)


gen = random.Random(2025)
block_cases = 0
for fmt in ["mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4-e2m1", "nvfp4"]:
    for k in (32, 64, 100):
        for trial in range(3):
            a = [gen.gauss(0, 1) * 2.0 ** gen.randint(-8, 8) for _ in range(k)]
            b = [gen.gauss(0, 1) for _ in range(k)]
            if trial == 1:  # cancellation: b's second half undoes its first
                a = a[:k // 2] * 2
                b = b[:k // 2] + [-x for x in b[:k // 2]]
                a, b = a[:k], b[:k] + [1.0] * (k - len(b))
            c = float(FP32.round(Fraction(gen.gauss(0, 4)))[0])
            options = ["--scale-rule", "ceil"] if trial == 2 and fmt != "nvfp4" else []
            [r] = emu_json("dot", "--unit", "b200", "--in", fmt, "--a", ",".join(map(repr, a)),
                           "--b", ",".join(map(repr, b)), "--c", repr(c), *options)
            value, flags, input_flags, alpha = block_expected(fmt, a, b, Fraction(c), *options)
            want = {"unit": "b200", "in": fmt, "out": "fp32", "format": "fp32", "value": as_json_value(value),
                    "bits": f"0x{FP32.bits(value):08x}", "flags": ordered(flags), "input_flags": ordered(input_flags),
                    "kind": "mxf4nvf4" if fmt in ("mxfp4-e2m1", "nvfp4") else "mxf8f6f4"}
            if alpha is not None:
                want["alpha"] = alpha
            got = {key: r.get(key) for key in want}
            check(got == want and ("alpha" in r) == (alpha is not None), f"dot --in {fmt} k {k}: {got} != {want}")
            block_cases += 1
check(block_cases == 54, f"block dot cases run: {block_cases}")

# Hand-worked (kind::mxf4): block 0 quantises to scale 1, group 0's sum is
# 6*6 + 6*(-6) + 0.5*0.5 = 0.25 with exponent 0 (its scales'), c = -0.25 cancels it.
# Block 1: 1.5 * 2^-20 and 0.5 * 2^-15 quantise to 6 * 2^-22 and 4 * 2^-18 (floor rule):
# the term 24 * 2^-40 = 0.75 * 2^-35 is 0.75 units of 2^(0 - 35): cut, d = +0 INEXACT.
# With 0.5 * 2^-20 and 0.5 * 2^-13 (4 * 2^-23, 4 * 2^-16) it is 2^-35, one unit: kept.
for a32, b32, value, flags in [("0x1.8p-20", "0x1p-16", 0.0, ["INEXACT"]), ("0x1p-21", "0x1p-14", 2.0 ** -35, [])]:
    a = ["6", "6", "0.5"] + ["0"] * 29 + [a32] + ["0"] * 31
    b = ["6", "-6", "0.5"] + ["0"] * 29 + [b32] + ["0"] * 31
    [r] = emu_json("dot", "--unit", "b200", "--in", "mxfp4-e2m1", "--a", ",".join(a), "--b", ",".join(b),
                   "--c", "-0.25")
    check(r["value"] == value and r["flags"] == flags and r["kind"] == "mxf4nvf4", f"mxf4 hand-worked: {r}")

# gemm: A's rows and B's columns quantised along k = 40 (a short last block); nvfp4 with
# one tensor scale for all of A and one for all of B.
for fmt in ["mxfp8-e4m3", "nvfp4"]:
    m, k, n = 2, 40, 3
    A_rows = [[gen.gauss(0, 1) * 2.0 ** gen.randint(-3, 3) for _ in range(k)] for _ in range(m)]
    B_rows = [[gen.gauss(0, 1) for _ in range(n)] for _ in range(k)]
    C_rows = [[float(FP32.round(Fraction(gen.gauss(0, 1)))[0]) for _ in range(n)] for _ in range(m)]
    A_file = write(f"A_{fmt}.txt", "\n".join(" ".join(map(repr, row)) for row in A_rows) + "\n")
    B_file = write(f"B_{fmt}.txt", "\n".join(" ".join(map(repr, row)) for row in B_rows) + "\n")
    C_file = write(f"C_{fmt}.txt", "\n".join(" ".join(map(repr, row)) for row in C_rows) + "\n")
    rs = emu_json("gemm", "--unit", "b200", "--in", fmt, A_file, B_file, C_file)
    check(len(rs) == m * n, f"gemm --in {fmt}: {len(rs)} elements")
    ts_a = ts_b = None
    if fmt == "nvfp4":
        ts_a = quantized_operand(fmt, [x for row in A_rows for x in row])[1]
        ts_b = quantized_operand(fmt, [x for row in B_rows for x in row])[1]
    for r in rs:
        i, j = r["row"], r["col"]
        column = [B_rows[p][j] for p in range(k)]
        value, flags, input_flags, alpha = block_expected(fmt, A_rows[i], column, Fraction(C_rows[i][j]),
                                                          ts_a=ts_a, ts_b=ts_b)
        check(r["value"] == as_json_value(value) and r["flags"] == ordered(flags)
              and r["input_flags"] == ordered(input_flags) and r.get("alpha") == alpha,
              f"gemm --in {fmt} element {i},{j}: {r} != {value} {flags} {input_flags} {alpha}")
    rc, out, _ = emu("gemm", "--unit", "b200", "--in", fmt, A_file, B_file)
    check(rc == 0 and len(out.splitlines()) == m + 1 and "block-scaled" in out, f"gemm --in {fmt} for people: {out!r}")

for args, needle in [(["dot", "--unit", "h100", "--in", "mxfp8-e4m3", "--a", "1", "--b", "1"], "b200"),
                     (["dot", "--unit", "b200", "--in", "mxint8", "--a", "1", "--b", "1"], "mxint8"),
                     (["dot", "--unit", "b200", "--in", "nvfp4", "--out", "fp16", "--a", "1", "--b", "1"], "fp32"),
                     (["dot", "--unit", "b200", "--a", "1", "--b", "1", "--scale-rule", "floor"], "block format"),
                     (["dot", "--unit", "b200", "--in", "nvfp4", "--a", "1", "--b", "1", "--scale-rule", "floor"],
                      "floor"),
                     (["dot", "--unit", "b200", "--in", "mxfp8-e4m3", "--a", "1", "--b", "1", "--scale-rule", "x"],
                      "scale rule"),
                     (["gemm", "--unit", "ipu-amp", "--in", "nvfp4", A, B], "b200")]:
    rc, out, err = emu(*args)
    check(rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, f"emu {args}: exit {rc}, stderr {err!r}")
rc, out, _ = emu("dot", "--help")
check(rc == 0 and "b200" in out and "mxf8f6f4" in out and "alpha" in out, "dot --help tells of block formats")

# ---- mixed inputs --in A:B (mi300x's fp8 with bf8) --------------------------------------

# The a_i rounded into A's format, the b_i into B's. fp8-e4m3fnuz:fp8-e5m2fnuz: 0.01 ->
# 10 * 2^-10 (e4m3fnuz subnormals are multiples of 2^-10), 1e-5 -> 2^-17 (e5m2fnuz's
# least subnormal; 1e-5 = 1.31 * 2^-17): 1*3 + 2*2^-17 + 10*2^-10*4 = 3.0390777587890625
# (the fused group keeps it: 3 is 2^1, its grid 2^-23). The reverse pair: 0.01 ->
# 1.25 * 2^-7 in e5m2fnuz, 1e-5 -> 0 in e4m3fnuz (below 2^-11): 3 + 0.0390625.
MIXED_A, MIXED_B = "1,2,0.01", "3,1e-5,4"
for pair, value in [("fp8-e4m3fnuz:fp8-e5m2fnuz", Fraction(3) + 2 * Fraction(1, 2 ** 17) + Fraction(40, 2 ** 10)),
                    ("fp8-e5m2fnuz:fp8-e4m3fnuz", Fraction(3) + Fraction(5, 2 ** 9) * 4)]:
    [r] = emu_json("dot", "--unit", "mi300x", "--in", pair, "--a", MIXED_A, "--b", MIXED_B)
    check(r["in"] == pair and r["out"] == "fp32" and r["value"] == float(value) and r["flags"] == []
          and r["input_flags"] == ["UFLO", "INEXACT"], f"dot --unit mi300x --in {pair}: {r}")
    A_MIX = write("mixed_A.txt", "1 2 0.01\n-0.01 2 1\n")
    B_MIX = write("mixed_B.txt", "3 0.5\n1e-5 1\n4 -1e-5\n")
    rows = emu_json("gemm", "--unit", "mi300x", "--in", pair, A_MIX, B_MIX)
    for r in rows:
        a = ["1,2,0.01", "-0.01,2,1"][r["row"]]
        b = ["3,1e-5,4", "0.5,1,-1e-5"][r["col"]]
        [d] = emu_json("dot", "--unit", "mi300x", "--in", pair, "--a", a, "--b", b)
        check(r["in"] == pair and r["value"] == d["value"] and r["flags"] == d["flags"],
              f"gemm --in {pair} element {r['row']},{r['col']}: {r} != dot {d}")
    check(len(rows) == 4, f"gemm --in {pair}: {len(rows)} elements")

for args, needles in [(["--unit", "h100", "--in", "fp8-e4m3fnuz:fp8-e5m2fnuz"], ["--in", "--unit h100", "mi300x"]),
                      (["--unit", "mi250x", "--in", "fp8-e4m3fnuz:fp8-e5m2fnuz"], ["--in", "mi300x", "one input format"]),
                      (["--unit", "mi300x", "--in", "fp8-e4m3fnuz:fp16"], ["--in fp8-e4m3fnuz:fp16", "fp8-e5m2fnuz"]),
                      (["--unit", "mi300x", "--in", "fp16:fp16"], ["--in", "write it fp16"]),
                      (["--unit", "b200", "--in", "mxfp8-e4m3:fp8-e4m3"], ["--in", "block format (mxfp8-e4m3)"]),
                      (["--unit", "mi300x", "--in", "fp8-e4m3fnuz:fp17"], ["--in", "B of", "fp17"]),
                      (["--unit", "mi300x", "--in", "fp16:fp16:fp16"], ["--in", "two formats"]),
                      (["--unit", "mi300x", "--in", "fp8-e4m3fnuz:fp8-e5m2fnuz", "--out", "fp16"], ["--out", "fp32"])]:
    rc, out, err = emu("dot", *args, "--a", "1", "--b", "1")
    check(rc == 2 and len(err.strip().splitlines()) == 1 and all(n in err for n in needles),
          f"emu dot {args}: exit {rc}, stderr {err!r}")
for fmt in ["fp16", "bf16", "tf32", "fp8-e4m3fnuz", "fp8-e5m2fnuz", "fp32"]:  # one format: named alone
    [r] = emu_json("dot", "--unit", "mi300x", "--in", fmt, "--a", "1", "--b", "1")
    check(r["in"] == fmt and r["value"] == 1, f"dot --unit mi300x --in {fmt}: {r}")
rc, out, _ = emu("dot", "--help")
check(rc == 0 and "mi300x  fp8-e4m3fnuz:fp8-e5m2fnuz fp8-e5m2fnuz:fp8-e4m3fnuz" in out,
      "dot --help lists the mixed inputs each unit takes")

# ---- bad input: exit 2 with one line on stderr; never a traceback-like dump ---------

BAD_B = write("bad_B.txt", "1 2\n3\n")
BAD_NUM = write("bad_num.txt", "1 2\n3 x\n")
bad_calls = [
    ([], None), (["frobnicate"], None), (["round", "1"], None), (["round", "1", "--format", "fp17"], None),
    (["round", "1", "--format", "fp16", "--rounding", "nearest"], None), (["round", "1x", "--format", "fp16"], None),
    (["round", "1", "--format", "fp16", "--frobnicate"], None), (["round", "1", "--format"], None),
    (["round", "--format", "fp16"], None), (["round", "-", "--format", "fp16"], "1\n2\n0.3.4\n"),
    (["round", "1", "--format", "fp16", "--overflow", "wrap"], None),
    (["round", "1", "--format", "fp16", "--sr-bits", "99"], None),
    (["round", "1", "--format", "fp16", "--subnormals", "maybe"], None),
    (["round", "1", "--format", "fp16", "--seed", "x"], None),
    (["eval", "1 + * 2", "--format", "fp16"], None), (["eval", "(1 + 2", "--format", "fp16"], None),
    (["eval", "1 +", "--format", "fp16"], None), (["eval", "1 + 2", "--format", "fp99"], None),
    (["info", "fp99"], None), (["info"], None),
    (["dot", "--unit", "exact", "--a", "1,2", "--b", "1"], None),
    (["dot", "--unit", "warp-drive", "--a", "1", "--b", "1"], None),
    (["dot", "--unit", "exact", "--a", "1,x", "--b", "1,2"], None),
    (["dot", "--unit", "exact", "--a", "1", "--b", "1", "--in", "fp99"], None),
    (["dot", "--a", "1", "--b", "1"], None),
    (["gemm", "--unit", "exact", A, BAD_B], None), (["gemm", "--unit", "exact", A, BAD_NUM], None),
    (["gemm", "--unit", "exact", A, os.path.join(tmp, "missing.txt")], None),
    (["gemm", "--unit", "exact", A, A], None), (["gemm", "--unit", "exact", A, B, A], None),
    (["gemm", "--unit", "exact", A, B, "--threads", "-1"], None),
    (["dot", "--unit", "exact", "--a", "1", "--b", "1", "--threads", "2"], None),
    (["eval", "1", "--format", "fp16", "--trap", "overflow"], None),
    (["eval", "1", "--format", "fp16", "--trap", "oflo,,inv"], None),
    (["round", "1", "--format", "fp16", "--tininess", "during"], None),
    (["dot", "--unit", "exact", "--a", "1", "--b", "1", "--trap", "oflo"], None),
]
for args, stdin in bad_calls:
    rc, out, err = emu(*args, stdin=stdin)
    check(rc == 2, f"emu {args}: exit {rc}, expected 2 (stderr {err!r})")
    check(len(err.strip().splitlines()) == 1, f"emu {args}: stderr is not one line: {err!r}")
rc, _, err = emu("round", "-", "--format", "fp16", stdin="1\n2\n0.3.4\n")
check("line 3" in err and "0.3.4" in err, f"stdin error names the line and input: {err!r}")
rc, _, err = emu("eval", "1 + * 2", "--format", "fp16")
check("column 5" in err, f"syntax error names the column: {err!r}")
rc, _, err = emu("round", "1", "--format", "fp17")
check("fp16" in err and "bf16" in err, f"unknown format lists the known ones: {err!r}")
rc, _, err = emu("gemm", "--unit", "exact", A, BAD_B)
check("bad_B.txt:2" in err, f"gemm names the file and line: {err!r}")
# The matrix limit (README): a product over 2^24 elements is refused before anything is
# allocated (4097 x 1 times 1 x 4097), and so is a file of more than 2^24 values, at the
# line where it passes the limit (4096 rows of 4096, then one more value).
TALL = write("tall.txt", "1\n" * 4097)
WIDE = write("wide.txt", " ".join(["1"] * 4097) + "\n")
rc, out, err = emu("gemm", "--unit", "exact", TALL, WIDE)
check(rc == 2 and out == "" and err == f"emu gemm: A*B with A = {TALL} and B = {WIDE} would be 4097 x 4097, more than "
      "the limit of 16777216 elements (4096 x 4096)\n", f"gemm over the matrix limit: {rc} {err!r}")
HUGE = write("huge.txt", ("0 " * 4096 + "\n") * 4096 + "0\n")
rc, out, err = emu("gemm", "--unit", "exact", HUGE, TALL)
check(rc == 2 and out == "" and err == f"emu gemm: {HUGE}:4097: more than 16777216 values, the limit of a matrix "
      "(4096 x 4096)\n", f"gemm file over the matrix limit: {rc} {err!r}")
os.remove(HUGE)

# ---- formats beyond IEEE and block quantisation -------------------------------------
[fnuz] = emu_json("info", "fp8-e4m3fnuz")
check(fnuz["max"] == 240 and fnuz["encoding"] == "fnuz" and fnuz["nan"] == "negative-zero"
      and fnuz["has_negative_zero"] is False and fnuz["bias"] == 8, f"info fp8-e4m3fnuz: {fnuz}")
[e8] = emu_json("info", "e8m0")
check(e8["has_zero"] is False and e8["signed"] is False and e8["max"] == 2.0 ** 127 and e8["min_normal"] == 2.0 ** -127,
      f"info e8m0: {e8}")
r = round_one("7", "fp4-e2m1")  # OCP MX FP4: no inf, no NaN: saturates at 6 under every policy
check(r["value"] == 6 and r["bits"] == "0x7" and r["flags"] == ["OFLO", "INEXACT"], f"7 fp4-e2m1: {r}")
r = round_one("-1", "e8m0")  # unsigned: a negative value is invalid
check(r["value"] == "nan" and r["bits"] == "0xff" and r["flags"] == ["INV"], f"-1 e8m0: {r}")
r = round_one("1000", "binary8p4se")  # P3109: 0x7f is +inf
check(r["value"] == "inf" and r["bits"] == "0x7f", f"1000 binary8p4se: {r}")

# mxfp8-e4m3 with OCP's rule: X = 2^(floor(log2 amax) - 8), E8M0 range 2^-127..2^127,
# elements x / X rounded to nearest even into E4M3 and saturated at 448.
gen = random.Random(13)
values = [gen.gauss(0, 1) for _ in range(70)]
values[5] = 300.0
values[40] = -gen.uniform(0, 1) * 2 ** -130
values[41:64] = [v * 2 ** -130 for v in values[41:64]]
rs = emu_json("quantize", "--format", "mxfp8-e4m3", *[repr(v) for v in values])
check(len(rs) == 70, f"quantize: one line per value ({len(rs)})")
for i, (v, r) in enumerate(zip(values, rs)):
    block = values[32 * (i // 32):32 * (i // 32) + 32]
    amax = max(abs(Fraction(b)) for b in block)
    e = amax.numerator.bit_length() - amax.denominator.bit_length()
    if amax < Fraction(2) ** e:
        e -= 1
    k = min(max(e - 8, -127), 127)
    scale = Fraction(2) ** k
    element, flags = FP8_E4M3.round(Fraction(v) / scale)
    if element in ("nan", "-nan"):  # saturate
        element = FP8_E4M3.max if element == "nan" else -FP8_E4M3.max
    want = {"element": as_json_value(element), "bits": f"0x{FP8_E4M3.bits(element):02x}",
            "scale": float(scale), "scale_bits": f"0x{k + 127:02x}", "block": i // 32, "flags": ordered(flags),
            "scale_rule": "floor", "format": "mxfp8-e4m3", "input": repr(v),
            "value": as_json_value(element if element == "-0" else element * scale)}
    got = {key: r.get(key) for key in want}
    if got != want:
        check(False, f"quantize value {i}: {got} != {want}")
        break
check(rs[0]["block_flags"] == ordered(set().union(*[set(r["flags"]) for r in rs[:32]])), "block_flags = OR of its elements")
rs = emu_json("quantize", "--format", "nvfp4", "2688", "3")
check(rs[0]["tensor_scale"] == 1 and rs[0]["scale"] == 448 and rs[0]["bits"] == "0x7", f"nvfp4: {rs[0]}")

bad_calls = [(["quantize", "1"], None), (["quantize", "1", "--format", "fp16"], None),
             (["quantize", "1", "--format", "nvfp4", "--scale-rule", "floor"], None),
             (["quantize", "1", "--format", "mxfp4-e2m1", "--scale-rule", "round"], None),
             (["quantize", "1", "--format", "mxfp4-e2m1", "--tensor-scale", "2"], None),
             (["quantize", "1", "--format", "nvfp4", "--tensor-scale", "0.1"], None),
             (["quantize", "1x", "--format", "mxint8"], None), (["quantize", "--format", "mxint8"], None),
             (["quantize", "-", "--format", "mxint8"], "1\nx\n")]
for args, stdin in bad_calls:
    rc, out, err = emu(*args, stdin=stdin)
    check(rc == 2 and len(err.strip().splitlines()) == 1, f"emu {args}: exit {rc}, stderr {err!r}")

good_calls = [["--help"], ["round", "--help"], ["eval", "--help"], ["info", "--help"], ["dot", "--help"],
              ["gemm", "--help"], ["quantize", "--help"], ["info", "fp8-e5m2"], ["round", "-1.5", "--format", "e4m10"],
              ["quantize", "1", "-2.5", "--format", "mxfp6-e3m2", "--scale-rule", "even", "--rounding", "sr"],
              ["eval", "-(0.1) * 3", "--format", "bf16", "--rounding", "ru"],
              ["round", "0.1", "--format=fp16", "--rounding=rz"]]
for args in good_calls:
    rc, out, err = emu(*args)
    check(rc == 0 and out and not err, f"emu {args}: exit {rc}, stderr {err!r}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all emu binary checks passed")
