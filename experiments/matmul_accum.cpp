// matmul_accum: how accurately does a matrix unit accumulate long inner products?
//
// C = A B (A M x K, B K x N, C starting at zero) through a chosen emu matrix unit,
// compared element by element with the exactly computed product.
//  - Inputs are rounded (RNE, saturating) into in_format: uniform01 = U[0, 1); normal =
//    N(0, 1); lognormal = exp(spread * N(0, 1)); sign = positive takes magnitudes, mixed
//    gives each entry a random sign.
//  - A block format (OCP MX, NVFP4) as in_format quantises the rows of A and the columns
//    of B in blocks along K (as MX matrix units take their operands; nvfp4 with one
//    tensor scale per matrix), with the format's default scale rule and elements RNE and
//    saturating. Unit b200 runs Blackwell's block-scaled MMA (emu/block_mma.hpp) on the
//    quantised rows and columns, as `emu gemm --unit b200 --in FORMAT` does: kind
//    mxf8f6f4 for mxfp8-* and mxfp6-*, mxf4 for mxfp4-e2m1, mxf4nvf4 for nvfp4, whose
//    tensor scales are applied after the MMA as cuBLASLt's alpha (emu's
//    TensorScaleEpilogue: one fp32 fma under the context's rounding; mxint8 is refused:
//    no kind takes integer elements). The reference units (exact, fp32-seq, fp16-seq)
//    take the dequantised values (their input format is then fp64, since those need
//    not lie in any scalar format); the other tensor cores and the IPU take scalar
//    formats only. Either way the reference is the exact product of the dequantised
//    values, so the error is the unit's accumulation alone, not the quantisation's.
//  - Common random numbers: A and B depend only on (seed, replica, M, N, K,
//    distribution, spread for lognormal, sign, in_format), not on the unit, rounding or
//    the point's place in the grid, so every unit at the same K sees the same matrices
//    (b200 and exact with the same block format: the same quantised matrices). Their
//    stream is the run's stream with lane 1 and the point index replaced by
//    data_point(), a 32-bit FNV-1a hash of those parameters.
//  - fused (fp32-seq and fp16-seq only; other units refuse fused = false): true is
//    c <- fma(a_i, b_i, c); false rounds the product into out_format first, then the sum.
//  - Non-finite results (overflow to inf, NaN) are counted in frac_nonfinite; the
//    relative errors are taken over the finite results whose exact value is not zero
//    (NaN when there is none), so max and mean always describe the same elements.
//  - out_format is the unit's partials/output format; "" or "default" = the unit's
//    natural one (emu/unit.hpp: fp32 for the tensor cores, ipu-amp, exact and fp32-seq;
//    fp16 for ipu-amp-half and fp16-seq; the block-scaled MMA has fp32 only).
//  - rounding is the context's rounding mode. For the IPU units (ipu-amp, ipu-amp-half)
//    rounding = sr sets $FP_CTL.ESR (stochastic rounding of the fp16 partials) and
//    leaves RNE as the default mode, which is how the IPU is driven; stochastic rounding
//    takes its bits from lane 2. Units that round in a fixed way ignore the mode (the
//    block-scaled MMA too, but for nvfp4's epilogue fma).
//  - Relative errors |C - exact| / |exact| over the finite elements whose exact value is
//    not zero; u is the unit roundoff of the unit's output (accumulation) format.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/block_mma.hpp"
#include "emu/exact_sum.hpp"
#include "emu/round.hpp"
#include "emu/unit.hpp"
#include "emu/unit_request.hpp"
#include "experiment.hpp"
#include "cli/commands.hpp"

namespace roundoff {

namespace {

bool is_default_format(const std::string& name) { return name.empty() || name == "default"; }

bool is_ipu_unit(emu::UnitKind kind) {
  return kind == emu::UnitKind::ipu_amp || kind == emu::UnitKind::ipu_amp_half;
}

// The parameters, typed once.
struct Point {
  emu::UnitRequest request;  // unit, in_format, out_format, fused
  std::size_t m = 0, n = 0, k = 0;
  std::string distribution;
  double spread = 0;
  std::string sign;
  emu::Rounding rounding = emu::Rounding::rne;
};

Point point_of(const Params& p) {
  Point t;
  t.request.unit = emu::unit_kind_by_name(p.string("unit"));
  t.request.in = emu::unit_input_by_name(p.string("in_format"));
  if (const std::string& out = p.string("out_format"); !is_default_format(out)) t.request.out = emu::format_by_name(out);
  t.request.fused = p.boolean("fused");
  t.m = static_cast<std::size_t>(p.integer("M"));
  t.n = static_cast<std::size_t>(p.integer("N"));
  t.k = static_cast<std::size_t>(p.integer("K"));
  t.distribution = p.string("distribution");
  t.spread = p.real("spread");
  t.sign = p.string("sign");
  t.rounding = emu::rounding_by_name(p.string("rounding"));
  return t;
}

// The unit the point names: b200 with a block format is the block-scaled MMA, the
// reference units take the dequantised values (emu::resolve_unit says which takes what).
emu::ReadyUnit ready_unit(const Point& t) {
  return emu::resolve_unit(t.request, {"unit", "in_format", "out_format", "scale_rule", "fused"});
}

// The point index of the data stream: a hash of exactly the parameters the matrices
// depend on (the format by its canonical name; spread only for lognormal, the one
// distribution that reads it; spread by its bit pattern).
std::uint32_t data_point(const Point& t) {
  std::string key = "matmul_accum data;M=" + std::to_string(t.m) + ";N=" + std::to_string(t.n) +
                    ";K=" + std::to_string(t.k) + ";distribution=" + t.distribution + ";sign=" + t.sign +
                    ";in=" + t.request.in->name();
  if (t.distribution == "lognormal") key += ";spread=" + std::to_string(std::bit_cast<std::uint64_t>(t.spread));
  return stable_hash32(key);
}

double draw(emu::Rng& rng, const std::string& distribution, double spread, bool mixed_sign) {
  double magnitude = 0;
  if (distribution == "uniform01")
    magnitude = rng.uniform();
  else if (distribution == "normal")
    magnitude = std::fabs(rng.normal());
  else  // lognormal
    magnitude = std::exp(spread * rng.normal());
  if (mixed_sign && (rng.next_u64() & 1)) return -magnitude;
  return magnitude;
}

RunResult run(const Params& p, const RunEnv& env) {
  const Point t = point_of(p);
  // One of the two: the block-scaled MMA (b200 with a block format), or a matrix unit.
  const emu::ReadyUnit ready = ready_unit(t);
  const std::size_t m = t.m, n = t.n, k = t.k;
  const bool mixed = t.sign == "mixed";

  emu::StreamId data_stream = env.stream;  // seed and replica
  data_stream.point = data_point(t);
  data_stream.lane = 1;
  emu::Rng data(data_stream);
  const emu::RoundSpec input_rounding{emu::Rounding::rne, emu::Overflow::saturate, 0};
  std::vector<double> A(m * k), B(k * n), C(m * n, 0.0);
  emu::QuantizedOperands blocks;  // A's rows and B's columns where the unit takes a block format
  if (ready.block) {
    // Raw draws, then blocks along K: the rows of A, the columns of B.
    for (double& x : A) x = draw(data, t.distribution, t.spread, mixed);
    for (double& x : B) x = draw(data, t.distribution, t.spread, mixed);
    blocks = ready.quantize_operands(A, B, m, n, k);
  } else {
    for (auto [v, f] : {std::pair{&A, &ready.unit->input_format()}, std::pair{&B, &ready.unit->b_input_format()}})
      for (double& x : *v) {
        emu::Flags ignored = 0;
        x = emu::round(*f, draw(data, t.distribution, t.spread, mixed), input_rounding, nullptr, ignored);
      }
  }
  if (env.cancelled()) throw Cancelled();

  emu::FpControl control;
  const bool esr = is_ipu_unit(t.request.unit) && t.rounding == emu::Rounding::sr;
  control.esr = esr;
  control.rounding = esr ? emu::Rounding::rne : t.rounding;
  emu::StreamId rounding_stream = env.stream;
  rounding_stream.lane = 2;
  emu::Context ctx(with_fp_exceptions(control, p), emu::Rng(rounding_stream));
  const emu::Scope gemm_scope(ctx, "gemm");
  // In blocks of rows: a cancelled run stops soon, and each gemm call is big enough for
  // the units' packed fast paths (results do not depend on the blocking).
  constexpr std::size_t kRowsPerCall = 32;
  for (std::size_t i = 0; i < m; i += kRowsPerCall) {
    if (env.cancelled()) throw Cancelled();
    const std::size_t count = std::min(kRowsPerCall, m - i);
    if (ready.mma)
      ready.mma->gemm(ctx, std::span<const emu::BlockQuantized>(blocks.rows).subspan(i, count), blocks.cols,
                      C.data() + i * n, n, blocks.epilogue);
    else
      ready.unit->gemm(ctx, count, n, k, A.data() + i * k, k, B.data(), n, C.data() + i * n, n);
  }

  double max_rel = 0, sum_rel = 0;
  std::size_t counted = 0, exact_results = 0, nonfinite = 0;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      emu::ExactSum sum;
      for (std::size_t q = 0; q < k; ++q) sum.add_product(A[i * k + q], B[q * n + j]);
      const emu::Exact x = sum.value();  // finite: the inputs are
      const double c = C[i * n + j];
      if (!std::isfinite(c)) {
        ++nonfinite;
        continue;
      }
      if (c == x.hi && x.lo == 0 && !x.beyond_double) ++exact_results;
      if (x.hi == 0 && x.lo == 0) continue;  // relative error undefined
      // |c - x| / |x| to double accuracy: c - hi is exact (Sterbenz) or dominates lo.
      const double rel = std::fabs((c - x.hi) - x.lo) / std::fabs(x.hi);
      max_rel = std::max(max_rel, rel);
      sum_rel += rel;
      ++counted;
    }

  const double u = ready.output_format().unit_roundoff();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  RunResult result;
  result.metrics["max_rel_error"] = counted ? max_rel : nan;
  result.metrics["mean_rel_error"] = counted ? sum_rel / static_cast<double>(counted) : nan;
  result.metrics["frac_exact"] = static_cast<double>(exact_results) / static_cast<double>(m * n);
  result.metrics["frac_nonfinite"] = static_cast<double>(nonfinite) / static_cast<double>(m * n);
  result.metrics["bound_det"] = static_cast<double>(k) * u;
  result.metrics["bound_prob"] = std::sqrt(static_cast<double>(k)) * u;
  result.flags = ctx.status();
  result.fp_counts = ctx.counts();
  return result;
}

std::string check_out_format(const ParamValue& v) {
  const std::string* s = std::get_if<std::string>(&v);
  if (s && is_default_format(*s)) return "";
  return check_format_name(v);
}

// A and B within the matrix limit (M x N is by the parameters' ranges), and the unit
// must accept the formats: ask it (e.g. ipu-amp-half refuses an fp32 output, b200 mxint8).
std::string check_point(const Params& p) {
  try {
    const Point t = point_of(p);
    for (const auto& [name, rows, cols] : {std::tuple{"A (M x K)", t.m, t.k}, std::tuple{"B (K x N)", t.k, t.n}})
      emu::cli::check_matrix_size(name, rows, cols);
    (void)ready_unit(t);
  } catch (const emu::cli::UsageError& e) {
    return e.what();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

Experiment make_matmul_accum() {
  Experiment e;
  e.name = "matmul_accum";
  e.description =
      "accumulation error of C = A B through a matrix unit against the exact product, over K (same A, B for every unit)";
  e.params = {
      string_param("unit", "ipu-amp",
                   "matrix unit: " + emu::name_list(emu::unit_table()) +
                       " (b200 with a block in_format: the block-scaled MMA)",
                   {}, check_unit_name),
      int_param("K", 256, "inner dimension (products per result)", 1, 16777216),
      int_param("M", 8, "rows of A and C", 1, 4096),
      int_param("N", 8, "columns of B and C", 1, 4096),
      string_param("distribution", "uniform01",
                   "input entries: uniform01 = U[0,1), normal = N(0,1), lognormal = exp(spread * N(0,1))",
                   {"uniform01", "normal", "lognormal"}),
      real_param("spread", 1.0, "sigma of the lognormal distribution (other distributions ignore it)", 0, 20),
      string_param("sign", "positive", "positive: magnitudes only; mixed: each entry gets a random sign",
                   {"positive", "mixed"}),
      string_param("in_format", "fp16",
                   "format the inputs are rounded into (RNE, saturating); a block format (mxfp8-e4m3 ... nvfp4) "
                   "quantises A's rows and B's columns in blocks along K: unit b200 runs the blocks on its "
                   "block-scaled MMA (not mxint8; nvfp4's tensor scales as alpha after it), exact, fp32-seq and "
                   "fp16-seq take the dequantised values, other units refuse it; the error is against the exact "
                   "product of the dequantised values; A:B rounds A into A and B into B (mixed inputs: mi300x's "
                   "fp8-e4m3fnuz:fp8-e5m2fnuz and fp8-e5m2fnuz:fp8-e4m3fnuz)",
                   {}, check_unit_input_name),
      string_param("out_format", "default", "partials/output format; \"\" or default = the unit's natural one",
                   {}, check_out_format),
      string_param("rounding", "rne",
                   "context rounding mode; sr on ipu-amp/ipu-amp-half sets ESR (stochastic fp16 partials); b200 "
                   "with nvfp4: the rounding of the epilogue's fma (the MMA itself truncates)",
                   {}, check_rounding_name),
      bool_param("fused", true,
                 "fp32-seq/fp16-seq: true = fma per step, false = product rounded then added (other units: true)"),
  };
  e.metrics = {
      {"max_rel_error", "largest |C - exact| / |exact| over the finite elements with exact != 0"},
      {"mean_rel_error", "mean |C - exact| / |exact| over the finite elements with exact != 0"},
      {"frac_exact", "fraction of elements equal to the exact product"},
      {"frac_nonfinite", "fraction of elements that came out inf or NaN (left out of the errors)"},
      {"bound_det", "deterministic bound K * u (u: unit roundoff of the output format)"},
      {"bound_prob", "probabilistic bound sqrt(K) * u"},
  };
  e.headline_metric = "mean_rel_error";
  e.run = run;
  e.check_point = check_point;
  for (ParamSpec& s : fp_exception_params()) e.params.push_back(std::move(s));
  e.fp_exceptions_note =
      "scope: gemm (the unit's operations, with the op names and elements the unit reports). The inputs are "
      "rounded into in_format (block formats: quantised, nvfp4's alpha rounded into fp32) outside the context "
      "(saturating, no flags); b200's block-scaled MMA reports op mma, its nvfp4 epilogue op fma. trap turns the "
      "IPU units' vectorised path off (the exact model instead: the same results, slower)";
  return e;
}

const Registration registration(make_matmul_accum());

}  // namespace

}  // namespace roundoff
