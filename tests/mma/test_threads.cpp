// Every unit's GEMM at 1, 2 and 3 threads (emu/threads.hpp): the same bits of C (the
// row padding included), sticky status, per-(scope, op, flag) counts with their order,
// first elements, operands and results, trap report with the elements written before
// it, and error message. The data have NaN, infinities, subnormals, invalid operations
// (inf * 0) and overflow in rows through the middle of C, so that the bands of rows the
// threads take see them in different places; shapes are random, rarely a multiple of a
// band. The runs are inside an arena of 4 threads (oneTBB also limited to 4), so that
// 2 and 3 threads run at once even on a machine with fewer cores.
#include <catch2/catch.hpp>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "emu/amp.hpp"
#include "emu/block.hpp"
#include "emu/block_mma.hpp"
#include "emu/cdna.hpp"
#include "emu/threads.hpp"
#include "emu/unit.hpp"
#include "tests/gemm_problem.hpp"

using namespace emu;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr Flags kAllFlags = OFLO | DIV0 | INV | UFLO | INEXACT;

std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }
using gemm_test::pick;
using gemm_test::Problem;
using gemm_test::sign;

// Sets the GEMM threads for as long as it lives, then back to the default.
struct Threads {
  explicit Threads(int n) { set_gemm_threads(n); }
  ~Threads() { set_gemm_threads(0); }
};

// A normal fp16 value sign * (1 + u) * 2^e, e in [lo, hi], or (one in `subnormal`)
// an fp16 subnormal.
double fp16_value(Rng& rng, int lo, int hi, std::size_t subnormal = 25) {
  if (pick(rng, subnormal) == 0) return sign(rng) * static_cast<double>(1 + pick(rng, 1023)) * 0x1p-24;
  const int e = lo + static_cast<int>(pick(rng, static_cast<std::size_t>(hi - lo + 1)));
  return sign(rng) * static_cast<double>(1024 + pick(rng, 1024)) * std::ldexp(1.0, e - 10);
}

// A random problem of fp16 values, with C's values in fp16 too (a value of every
// output format here). Specials in rows a third, half and two thirds down, and in the
// last row: NaN; a large C with large products (overflow where the output is fp16);
// inf * 0 (INV in the columns where B's entry is zero); -inf + inf (INV).
Problem random_problem(Rng& rng, std::size_t m, std::size_t n, std::size_t k) {
  Problem p = gemm_test::zero_problem(m, n, k);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t q = 0; q < k; ++q) p.A[i * p.lda() + q] = fp16_value(rng, -12, 4);
  for (std::size_t q = 0; q < k; ++q)
    for (std::size_t j = 0; j < n; ++j) p.B[q * p.ldb() + j] = pick(rng, 8) == 0 ? 0.0 : fp16_value(rng, -12, 4);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) p.C[i * p.ldc() + j] = fp16_value(rng, -6, 6);
  p.A[(m / 3) * p.lda() + pick(rng, k)] = kNaN;
  const std::size_t big = m / 2;
  for (std::size_t q = 0; q < std::min<std::size_t>(k, 4); ++q) p.A[big * p.lda() + q] = 32768;
  for (std::size_t j = 0; j < n; ++j) p.C[big * p.ldc() + j] = 65504;  // fp16's largest
  p.A[(2 * m / 3) * p.lda() + pick(rng, k)] = kInf;
  if (k >= 2) {
    p.A[(m - 1) * p.lda()] = -kInf;
    p.A[(m - 1) * p.lda() + 1] = kInf;
  }
  return p;
}

// Everything a GEMM leaves behind.
struct Outcome {
  std::vector<double> C;
  Flags status = 0;
  std::vector<OpCount> counts;
  std::optional<TrapReport> trap;
  std::string error;
};

// The first difference between two outcomes ("" where none), naming where.
std::string difference(const Outcome& a, const Outcome& b) {
  std::size_t mismatches = 0, first = 0;
  for (std::size_t e = a.C.size(); e-- > 0;)
    if (bits(a.C[e]) != bits(b.C[e])) {
      ++mismatches;
      first = e;
    }
  if (mismatches != 0)
    return std::to_string(mismatches) + " values of C differ, the first at " + std::to_string(first) + ": " +
           std::to_string(a.C[first]) + " vs " + std::to_string(b.C[first]);
  if (a.status != b.status) return "status " + std::to_string(a.status) + " vs " + std::to_string(b.status);
  if (a.error != b.error) return "error '" + a.error + "' vs '" + b.error + "'";
  if (a.counts.size() != b.counts.size())
    return std::to_string(a.counts.size()) + " counts vs " + std::to_string(b.counts.size());
  auto same_values = [](const std::vector<double>& x, const std::vector<double>& y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end(), [](double u, double v) { return bits(u) == bits(v); });
  };
  for (std::size_t c = 0; c < a.counts.size(); ++c) {
    const OpCount &x = a.counts[c], &y = b.counts[c];
    if (x.scope != y.scope || x.op != y.op || x.flag != y.flag || x.count != y.count ||
        !(x.first_element == y.first_element) || !same_values(x.first_operands, y.first_operands) ||
        bits(x.first_result) != bits(y.first_result))
      return "count " + std::to_string(c) + " (" + x.op + " " + flag_name(x.flag) + "): " +
             std::to_string(x.count) + " first at " + x.first_element.to_string() + " vs " + y.op + " " +
             flag_name(y.flag) + ": " + std::to_string(y.count) + " first at " + y.first_element.to_string();
  }
  if (a.trap.has_value() != b.trap.has_value()) return a.trap ? "a trap vs none" : "no trap vs one";
  if (a.trap) {
    const TrapReport &x = *a.trap, &y = *b.trap;
    if (x.flag != y.flag || x.scope != y.scope || x.op != y.op || !(x.element == y.element) ||
        !same_values(x.operands, y.operands) || bits(x.result) != bits(y.result) || x.status != y.status)
      return std::string("trap ") + flag_name(x.flag) + " at " + x.element.to_string() + " status " +
             std::to_string(x.status) + " vs " + flag_name(y.flag) + " at " + y.element.to_string() + " status " +
             std::to_string(y.status);
  }
  return "";
}

// gemm(ctx, C) under `control` at `threads` threads, on a context that already has a
// scope, a count and an element of an enclosing operation (as inside a network layer).
template <class Gemm>
Outcome run_at(int threads, const FpControl& control, std::vector<double> C, const Gemm& gemm) {
  const Threads setting(threads);
  Context ctx(control, Rng(StreamId{7}));
  const Scope scope(ctx, "layer");
  ctx.convert(fp16(), 0.1);  // INEXACT before the GEMM: its count comes first and adds up
  ctx.set_element(5, {5});
  Outcome out;
  try {
    gemm(ctx, C.data());
  } catch (const FpException& e) {
    out.trap = e.report();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  out.C = std::move(C);
  out.status = ctx.status();
  out.counts = ctx.counts();
  return out;
}

// The controls every unit runs under: fast paths, counting (all flags: the reference
// paths; OFLO, DIV0 and INV: the AMP's vectorised path with counting), traps with and
// without counting, and stochastic rounding (serial, random bits in element order).
std::vector<FpControl> controls() {
  std::vector<FpControl> list(7);
  list[1].counted = kAllFlags;
  list[2].counted = OFLO | DIV0 | INV;
  list[3].counted = kAllFlags;
  list[3].traps = OFLO | DIV0 | INV;
  list[4].traps = OFLO | DIV0 | INV;
  list[5].traps = UFLO;
  list[5].counted = INV;
  list[6].esr = true;
  list[6].counted = kAllFlags;
  return list;
}

// Runs gemm at 1, 2 and 3 threads under every control; fails with the first difference.
template <class Gemm>
void check_threads(const std::vector<double>& C, const Gemm& gemm) {
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 4);
  tbb::task_arena arena(4);
  arena.execute([&] {
    for (const FpControl& control : controls()) {
      INFO("counted " << int(control.counted) << " traps " << int(control.traps) << " esr " << control.esr);
      const Outcome serial = run_at(1, control, C, gemm);
      for (int threads : {2, 3}) {
        INFO(threads << " threads");
        CHECK(difference(serial, run_at(threads, control, C, gemm)) == "");
      }
    }
  });
}

struct Shape {
  std::size_t m, n, k;
};

// Shapes large enough to be cut into bands (emu/threads.cpp: 64 rows and 2^14
// products a band at least), rarely a multiple of one.
std::vector<Shape> shapes(Rng& rng) {
  std::vector<Shape> list{{300, 13, 20}, {530, 7, 24}};
  for (int s = 0; s < 2; ++s) list.push_back({260 + pick(rng, 200), 8 + pick(rng, 12), 16 + pick(rng, 30)});
  return list;
}

}  // namespace

TEST_CASE("every unit's gemm: the same outcome at 1, 2 and 3 threads", "[threads]") {
  Rng rng(StreamId{2026});
  for (const Named<UnitKind>& named : unit_table()) {
    const UnitKind kind = named.value;
    std::vector<std::unique_ptr<MatrixUnit>> units;
    units.push_back(make_unit(kind));
    if (kind == UnitKind::fp32_seq || kind == UnitKind::fp16_seq) units.push_back(make_sequential_unit(kind, false));
    for (const auto& unit : units)
      for (const Shape& s : shapes(rng)) {
        INFO(named.name << " (" << units.front().get() - unit.get() << ") " << s.m << "x" << s.n << "x" << s.k);
        const Problem p = random_problem(rng, s.m, s.n, s.k);
        check_threads(p.C, [&](Context& ctx, double* C) {
          unit->gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), C, p.ldc());
        });
      }
  }
}

// The reference units' gemm scans and packs B once for all its bands: B's NaN and
// infinite columns (the exact pass leaves them to the reference) and a B whose value is
// not an fp32 value (no pass applies) come out as serially.
TEST_CASE("the reference units with specials or a non-fp32 value in B: the same outcome at 1, 2 and 3 threads",
          "[threads]") {
  Rng rng(StreamId{2027});
  std::vector<std::unique_ptr<MatrixUnit>> units;
  for (UnitKind kind : {UnitKind::exact, UnitKind::fp32_seq, UnitKind::fp16_seq}) units.push_back(make_unit(kind));
  units.push_back(make_sequential_unit(UnitKind::fp32_seq, false));
  const Shape s{300, 13, 20};
  Problem specials = random_problem(rng, s.m, s.n, s.k);
  specials.B[3 * specials.ldb() + 2] = kNaN;
  specials.B[7 * specials.ldb() + 9] = -kInf;
  Problem not_float = random_problem(rng, s.m, s.n, s.k);
  not_float.B[5 * not_float.ldb() + 4] = 1 + 0x1p-30;
  for (const Problem* p : {&specials, &not_float})
    for (const auto& unit : units) {
      INFO(unit_kind_name(unit->kind()) << (p == &specials ? ": specials" : ": not fp32"));
      auto gemm = [&](Context& ctx, double* C) {
        unit->gemm(ctx, p->m, p->n, p->k, p->A.data(), p->lda(), p->B.data(), p->ldb(), C, p->ldc());
      };
      check_threads(p->C, gemm);
      // And the values and status of dot() element by element.
      Outcome by_dot;
      by_dot.C = p->C;
      Context ctx;
      for (std::size_t i = 0; i < p->m; ++i)
        for (std::size_t j = 0; j < p->n; ++j) {
          double& c = by_dot.C[i * p->ldc() + j];
          c = unit->dot(ctx, p->k, p->A.data() + i * p->lda(), 1, p->B.data() + j, p->ldb(), c);
        }
      by_dot.status = ctx.status();
      const Threads setting(2);
      Outcome threaded;
      threaded.C = p->C;
      Context threaded_ctx;
      gemm(threaded_ctx, threaded.C.data());
      threaded.status = threaded_ctx.status();
      CHECK(difference(by_dot, threaded) == "");
    }
}

TEST_CASE("a tensor-core input outside fp16: the serial error at any number of threads", "[threads]") {
  Rng rng(StreamId{3});
  Problem p = random_problem(rng, 300, 40, 50);
  p.A[250 * p.lda() + 3] = 0.1;  // not an fp16 value; B's is later in the unit's decoding order
  p.B[7 * p.ldb() + 30] = 0.2;
  const auto unit = make_unit(UnitKind::h100);
  check_threads(p.C, [&](Context& ctx, double* C) {
    unit->gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), C, p.ldc());
  });
  const Outcome serial = run_at(1, {}, p.C, [&](Context& ctx, double* C) {
    unit->gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), C, p.ldc());
  });
  CHECK(serial.error.find("0.100000") != std::string::npos);
}

TEST_CASE("b200's block-scaled gemm: the same outcome at 1, 2 and 3 threads", "[threads]") {
  Rng rng(StreamId{4});
  for (const std::string name : {"mxfp8-e4m3", "nvfp4"}) {
    INFO(name);
    const BlockFormat& f = block_format_by_name(name);
    const std::size_t m = 300, n = 12, k = 96;
    std::vector<BlockQuantized> rows, cols;
    auto quantized = [&](double scale) {
      std::vector<double> v(k);
      for (double& x : v) x = fp16_value(rng, -8, 4) * scale;
      return quantize(f, v, default_block_spec(f), nullptr);
    };
    for (std::size_t i = 0; i < m; ++i) rows.push_back(quantized(i % 7 == 3 ? 0x1p-100 : 1.0));
    for (std::size_t j = 0; j < n; ++j) cols.push_back(quantized(j % 5 == 1 ? 0x1p60 : 1.0));
    const auto unit = make_block_mma_unit(UnitKind::b200, f, f);
    std::vector<double> C(m * n);
    for (double& c : C) c = fp16_value(rng, -6, 6);
    C[20 * n + 3] = kInf;
    C[200 * n + 8] = -kInf;
    auto gemm = [&](Context& ctx, double* out) { unit->gemm(ctx, rows, cols, out, n); };
    check_threads(C, gemm);
    C[190 * n + 4] = 0.1;  // not an fp32 value: the serial error
    check_threads(C, gemm);
    // Operands that are not arrays quantised in the format (a scale missing): a column
    // (gemm then leaves B to the bands, which decode it after their rows) and a row,
    // whose error comes first.
    cols[7].scales.pop_back();
    check_threads(C, gemm);
    rows[250].scales.pop_back();
    check_threads(C, gemm);
  }
}

TEST_CASE("the AMP's convolution: the same outcome at 1, 2 and 3 threads", "[threads][amp]") {
  // amp_conv2d runs the im2col gemm of all images in bands of output positions, the
  // weights packed once: values, flags, counts with their [n, o, y, x] elements, traps
  // (serial) and stochastic rounding (serial) as on one thread. Every configuration the
  // vectorised path takes, random shapes of 300 to 700 positions (bands cut through
  // images), NaN, infinities, subnormals, overflowing products, zero weights, partials
  // in, and an input that is not an fp16 value (its band computes output by output).
  Rng rng(StreamId{5});
  const AmpConfig configs[] = {amp_config(PartialsType::float32), amp_config(PartialsType::half),
                               amp_config(PartialsType::float32, fp16(), fp16())};
  for (const AmpConfig& cfg : configs)
    for (int trial = 0; trial < 2; ++trial) {
      Conv2dShape s;
      s.batch = 2 + pick(rng, 3);
      s.in_channels = 1 + pick(rng, 20);
      s.height = 10 + pick(rng, 6);
      s.width = 10 + pick(rng, 6);
      s.out_channels = 3 + pick(rng, 40);
      s.kernel_height = 1 + pick(rng, 3);
      s.kernel_width = 1 + pick(rng, 3);
      s.pad_h = pick(rng, 2);
      s.pad_w = pick(rng, 2);
      std::vector<double> input(s.input_size()), weights(s.weights_size()), partials(s.output_size());
      for (double& x : input) x = fp16_value(rng, -10, 3);
      for (double& x : weights) x = pick(rng, 6) == 0 ? 0.0 : fp16_value(rng, -10, 3);
      for (double& x : partials) x = fp16_value(rng, -6, 6);
      const std::size_t per_image = s.in_channels * s.height * s.width;
      input[pick(rng, per_image)] = kNaN;
      input[per_image + pick(rng, per_image)] = kInf;
      input[pick(rng, input.size())] = 30000;  // with a large weight: overflow
      weights[pick(rng, weights.size())] = 30000;
      partials[pick(rng, partials.size())] = -kInf;
      partials[pick(rng, partials.size())] = 0x1p-20;  // an fp16 subnormal
      if (trial == 1) input[(s.batch - 1) * per_image + pick(rng, per_image)] = 0.1;  // not an fp16 value
      INFO((cfg.partials == fp16() ? "half" : "float") << " partials, out " << cfg.output.name() << ", N "
                                                       << s.batch << " C " << s.in_channels << " O "
                                                       << s.out_channels << " K " << s.kernel_height << "x"
                                                       << s.kernel_width);
      check_threads(std::vector<double>(s.output_size()), [&](Context& ctx, double* out) {
        const std::vector<double> result = amp_conv2d(ctx, cfg, s, input, weights, partials);
        std::copy(result.begin(), result.end(), out);
      });
    }
}

namespace {

// A unit that records the rows of each serial_gemm call (the bands). Its first call
// waits (up to a minute) for a second to start: so with more than one thread the GEMM
// must have run two bands at the same time.
class BandRecorder final : public MatrixUnit {
 public:
  UnitKind kind() const override { return UnitKind::exact; }
  const Format& input_format() const override { return fp16(); }
  const Format& output_format() const override { return fp32(); }
  double dot(Context&, std::size_t, const double*, std::size_t, const double*, std::size_t, double c) const override {
    return c;
  }
  const double* C0 = nullptr;
  std::size_t ldc = 0;
  bool wait_for_another = false;
  mutable std::mutex mutex;
  mutable std::condition_variable another;
  mutable std::vector<std::pair<std::size_t, std::size_t>> bands;  // first row, rows
  mutable bool overlapped = false;

 protected:
  void serial_gemm(Context&, std::size_t m, std::size_t, std::size_t, const double*, std::size_t, const double*,
                   std::size_t, double* C, std::size_t) const override {
    std::unique_lock lock(mutex);
    bands.emplace_back(static_cast<std::size_t>(C - C0) / ldc, m);
    if (bands.size() == 1 && wait_for_another) {
      overlapped = another.wait_for(lock, std::chrono::seconds(60), [&] { return bands.size() > 1; });
    } else {
      another.notify_all();
    }
  }
};

}  // namespace

TEST_CASE("gemm runs bands of rows at the same time where it has threads, and serially where it has one",
          "[threads]") {
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 4);
  tbb::task_arena arena(4);
  const std::size_t m = 601, n = 50, k = 60;
  std::vector<double> A(m * k), B(k * n), C(m * n);
  for (int threads : {1, 2, 3}) {
    INFO(threads << " threads");
    const Threads setting(threads);
    BandRecorder unit;
    unit.C0 = C.data();
    unit.ldc = n;
    unit.wait_for_another = threads > 1;
    Context ctx;
    arena.execute([&] { unit.gemm(ctx, m, n, k, A.data(), k, B.data(), n, C.data(), n); });
    std::sort(unit.bands.begin(), unit.bands.end());
    if (threads == 1) CHECK(unit.bands.size() == 1);
    else CHECK(unit.overlapped);
    std::size_t next = 0;
    for (const auto& [first, rows] : unit.bands) {
      CHECK(first == next);
      next = first + rows;
    }
    CHECK(next == m);
  }
  CHECK_THROWS_AS(set_gemm_threads(-1), std::invalid_argument);
}

// The AMD units' fast gemm passes (emu/cdna.cpp) against their reference, one dot() per
// element (detail::select_cdna_fast_gemm(false)), at 1, 2 and 3 threads against the
// reference at 1: every input format or pair each unit takes, random shapes, operands
// of every kind (moderate values, random encodings with their specials, subnormals and
// extremes, zeros, exact cancellations within groups, values that flush on mi250x),
// under every control (counts, traps), and operands a unit refuses (the error).
namespace {

// A value of f: mostly moderate, else any encoding (specials, subnormals, extremes).
double value_of(Rng& rng, const Format& f) {
  switch (pick(rng, 16)) {
    case 0:
    case 1: return 0.0;
    case 2:
    case 3: {
      const double v = f.decode(rng.next_u64() & f.all_mask());
      return std::isnan(v) && pick(rng, 4) != 0 ? 1.0 : v;  // NaN, but not too often
    }
    case 4: return sign(rng) * f.min_normal() * static_cast<double>(1 + pick(rng, 3));  // tiny products, results
    case 5: return sign(rng) * f.min_subnormal() * static_cast<double>(1 + pick(rng, 7));  // flushes on mi250x
    default: {
      const int spread = std::min(f.emax(), 8);
      const int e = static_cast<int>(pick(rng, static_cast<std::size_t>(2 * spread + 1))) - spread;
      const double significand = 1 + std::ldexp(static_cast<double>(pick(rng, std::size_t{1} << f.fraction_bits())),
                                                -f.fraction_bits());
      return sign(rng) * std::ldexp(significand, e);
    }
  }
}

struct CdnaCase {
  UnitKind unit;
  Format a, b, out;
};

// Every input format or pair of each AMD unit.
std::vector<CdnaCase> cdna_cases() {
  std::vector<CdnaCase> list;
  const Format* all[] = {&fp16(), &bf16(), &tf32(), &fp32(), &fp64(), &fp8_e4m3fnuz(), &fp8_e5m2fnuz()};
  for (UnitKind unit : {UnitKind::mi100, UnitKind::mi250x, UnitKind::mi300x})
    for (const Format* a : all)
      for (const Format* b : all) {
        try {
          const auto made = make_cdna_unit(unit, *a, *b, std::nullopt);
          list.push_back({unit, *a, *b, made->output_format()});
        } catch (const std::invalid_argument&) {
        }
      }
  return list;
}

// A problem with A's values in a, B's in b (cancelling pairs: A's entry the negation of
// the one before it, B's row a copy of the one before), C's in out.
Problem cdna_problem(Rng& rng, const CdnaCase& c, std::size_t m, std::size_t n, std::size_t k) {
  Problem p = gemm_test::zero_problem(m, n, k);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t q = 0; q < k; ++q)
      p.A[i * p.lda() + q] = q > 0 && pick(rng, 6) == 0 ? -p.A[i * p.lda() + q - 1] : value_of(rng, c.a);
  for (std::size_t q = 0; q < k; ++q) {
    const bool copy = q > 0 && pick(rng, 4) == 0;
    for (std::size_t j = 0; j < n; ++j)
      p.B[q * p.ldb() + j] = copy ? p.B[(q - 1) * p.ldb() + j] : value_of(rng, c.b);
  }
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) p.C[i * p.ldc() + j] = value_of(rng, c.out);
  return p;
}

// Selects the AMD units' gemm passes for as long as it lives, then the fast ones.
struct CdnaPasses {
  explicit CdnaPasses(bool fast) { detail::select_cdna_fast_gemm(fast); }
  ~CdnaPasses() { detail::select_cdna_fast_gemm(true); }
};

void check_cdna_against_reference(const CdnaCase& c, const Problem& p) {
  const auto unit = make_cdna_unit(c.unit, c.a, c.b, std::nullopt);
  const auto gemm = [&](Context& ctx, double* C) {
    unit->gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), C, p.ldc());
  };
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 4);
  tbb::task_arena arena(4);
  arena.execute([&] {
    for (const FpControl& control : controls()) {
      INFO("counted " << int(control.counted) << " traps " << int(control.traps) << " esr " << control.esr);
      Outcome reference;
      {
        const CdnaPasses passes(false);
        reference = run_at(1, control, p.C, gemm);
      }
      for (int threads : {1, 2, 3}) {
        INFO(threads << " threads");
        CHECK(difference(reference, run_at(threads, control, p.C, gemm)) == "");
      }
    }
  });
}

}  // namespace

TEST_CASE("AMD units' fast gemm: the reference's outcome at 1, 2 and 3 threads", "[threads][cdna]") {
  Rng rng(StreamId{24});
  for (const CdnaCase& c : cdna_cases()) {
    const std::vector<Shape> sizes{{1 + pick(rng, 40), 1 + pick(rng, 40), pick(rng, 70)},
                                   {1 + pick(rng, 40), 1 + pick(rng, 40), pick(rng, 4)},  // many exact elements
                                   {1 + pick(rng, 20), 17 + pick(rng, 20), 1 + pick(rng, 40)},
                                   {260 + pick(rng, 40), 5 + pick(rng, 10), 16 + pick(rng, 20)}};  // in bands
    for (const Shape& s : sizes) {
      INFO(unit_kind_name(c.unit) << " " << c.a.name() << ":" << c.b.name() << " " << s.m << "x" << s.n << "x" << s.k);
      check_cdna_against_reference(c, cdna_problem(rng, c, s.m, s.n, s.k));
    }
  }
}

TEST_CASE("AMD units' fast gemm: an operand the unit refuses, the reference's error", "[threads][cdna]") {
  Rng rng(StreamId{25});
  for (const CdnaCase& c : cdna_cases()) {
    if (c.a.name() == "fp64") continue;  // every double is an fp64 value
    Problem p = cdna_problem(rng, c, 280, 20, 24);
    for (double& x : p.A) x = std::isfinite(x) ? x : 1.0;
    for (double& x : p.B) x = std::isfinite(x) ? x : 1.0;
    const double refused = c.a.name() == "tf32" ? 0.1 : 1 + 0x1p-30;  // tf32 takes every fp32 value
    p.A[200 * p.lda() + 5] = refused;
    p.B[3 * p.ldb() + 11] = refused;  // before A's in element order
    INFO(unit_kind_name(c.unit) << " " << c.a.name() << ":" << c.b.name());
    check_cdna_against_reference(c, p);
    const Outcome fast = run_at(1, {}, p.C, [&](Context& ctx, double* C) {
      make_cdna_unit(c.unit, c.a, c.b, std::nullopt)->gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(),
                                                           p.ldb(), C, p.ldc());
    });
    CHECK(fast.error.find("is not an") != std::string::npos);
  }
}
