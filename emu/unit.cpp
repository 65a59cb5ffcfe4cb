#include "unit.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "amp.hpp"
#include "cdna.hpp"
#include "exact_sum.hpp"
#include "mma.hpp"
#include "sequential.hpp"
#include "threads.hpp"

namespace emu {

namespace {

// Indexed by UnitKind.
constexpr Named<UnitKind> kUnits[] = {
    {UnitKind::v100, "v100", "NVIDIA Volta tensor cores (fp16)"},
    {UnitKind::t4, "t4", "NVIDIA Turing tensor cores (fp16)"},
    {UnitKind::a100, "a100", "NVIDIA Ampere tensor cores (fp16, bf16, tf32)"},
    {UnitKind::ada, "ada", "NVIDIA Ada Lovelace tensor cores (fp16, bf16, tf32, fp8)"},
    {UnitKind::l40s, "l40s", "NVIDIA L40S (Ada) tensor cores (fp16, bf16, tf32, fp8)"},
    {UnitKind::h100, "h100", "NVIDIA Hopper tensor cores (fp16, bf16, tf32, fp8)"},
    {UnitKind::h200, "h200", "NVIDIA H200 (Hopper) tensor cores (fp16, bf16, tf32, fp8)"},
    {UnitKind::b200, "b200", "NVIDIA Blackwell tensor cores (fp16, bf16, tf32, fp8; block-scaled MMA)"},
    {UnitKind::mi100, "mi100", "AMD MI100 (CDNA1) matrix cores (fp16, bf16, fp32)"},
    {UnitKind::mi250x, "mi250x", "AMD MI250X (CDNA2) matrix cores (fp16, bf16, fp32, fp64; fp16, bf16 flushed)"},
    {UnitKind::mi300x, "mi300x", "AMD MI300X (CDNA3) matrix cores (fp16, bf16, tf32 as xf32, fp8 fnuz, fp32, fp64)"},
    {UnitKind::ipu_amp, "ipu-amp", "Graphcore IPU AMP, fp16 inputs, fp32 partials (f16v4sisoamp)"},
    {UnitKind::ipu_amp_half, "ipu-amp-half", "Graphcore IPU AMP, fp16 inputs, fp16 partials (f16v4hihoamp)"},
    {UnitKind::exact, "exact", "the exact dot product, rounded once into the output format"},
    {UnitKind::fp32_seq, "fp32-seq", "sequential fused multiply-add in fp32, in index order"},
    {UnitKind::fp16_seq, "fp16-seq", "sequential fused multiply-add in fp16, in index order"},
};
static_assert(in_enum_order(kUnits));

// The reference units: exact (one rounding of the exact dot product) and sequential
// accumulation in index order, fused (one rounding per product-add) or unfused (the
// product rounded, then the sum).
class ReferenceUnit final : public MatrixUnit {
 public:
  ReferenceUnit(UnitKind kind, Format in, Format out, bool fused = true)
      : kind_(kind), in_(std::move(in)), out_(std::move(out)), fused_(fused) {}
  UnitKind kind() const override { return kind_; }
  const Format& input_format() const override { return in_; }
  const Format& output_format() const override { return out_; }

  double dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b, std::size_t sb,
             double c) const override {
    if (kind_ == UnitKind::exact) {
      ExactSum sum;
      sum.add(c);
      for (std::size_t i = 0; i < k; ++i) sum.add_product(a[i * sa], b[i * sb]);
      return exact_result(ctx, sum.value(), k, c);
    }
    if (fused_) {
      for (std::size_t i = 0; i < k; ++i) c = ctx.fma(out_, a[i * sa], b[i * sb], c);
    } else {
      for (std::size_t i = 0; i < k; ++i) c = ctx.add(out_, c, ctx.mul(out_, a[i * sa], b[i * sb]));
    }
    return c;
  }

  // The bands of rows with B scanned and packed for the fast passes once, not per band.
  void gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
            const double* B, std::size_t ldb, double* C, std::size_t ldc) const override {
    const PassColumns columns = pass_columns(n, k, B, ldb);
    gemm_by_rows(ctx, m, n, k, C, ldc, [&](Context& band_ctx, std::size_t first, std::size_t rows) {
      gemm_rows(band_ctx, rows, n, k, A + first * lda, lda, B, ldb, C + first * ldc, ldc, &columns);
    });
  }

 protected:
  void serial_gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
                   const double* B, std::size_t ldb, double* C, std::size_t ldc) const override {
    gemm_rows(ctx, m, n, k, A, lda, B, ldb, C, ldc, nullptr);
  }

 private:
  // The fast passes of emu/sequential.hpp where they apply, else one dot per element.
  // Elements are finished in row-major order with their element set (flat i * n + j,
  // index {i, j}) while they raise flags: those the pass vouches for take its result
  // and raise its flags (none that the control counts or traps), the others go through
  // dot(); so results, flags, counts and a trap (with the elements written before it)
  // are those of dot() element by element. columns: B prepared for the passes, or
  // nullptr (the pass prepares it).
  void gemm_rows(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
                 const double* B, std::size_t ldb, double* C, std::size_t ldc, const PassColumns* columns) const {
    auto element = [&](std::size_t i, std::size_t j) {
      return ElementGuard(ctx, static_cast<std::int64_t>(i * n + j),
                          {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
    };
    auto by_dot = [&](std::size_t i, std::size_t j) {
      const ElementGuard guard = element(i, j);
      return dot(ctx, k, A + i * lda, 1, B + j, ldb, C[i * ldc + j]);
    };
    if (kind_ == UnitKind::exact) {
      ExactPass pass;
      if (exact_pass(m, n, k, A, lda, B, ldb, C, ldc, pass, columns)) {
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < n; ++j) {
            double& c = C[i * ldc + j];
            if (pass.redo[i * n + j]) {
              c = by_dot(i, j);
              continue;
            }
            const ElementGuard guard = element(i, j);
            c = exact_result(ctx, pass.sum[i * n + j], k, c);
          }
        return;
      }
    } else {
      SequentialPass pass;
      if (sequential_pass(ctx, out_, fused_, m, n, k, A, lda, B, ldb, C, ldc, pass, columns)) {
        const char* op = fused_ ? "fma" : "add";
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < n; ++j) {
            const Flags flags = pass.flags[i * n + j];
            if (flags == SequentialPass::kRedo) {
              C[i * ldc + j] = by_dot(i, j);
              continue;
            }
            if (flags != 0) ctx.raise_flags(flags, op, {});
            C[i * ldc + j] = pass.value[i * n + j];
          }
        if (pass.raised != 0) ctx.raise_flags(pass.raised, op, {});
        return;
      }
    }
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) C[i * ldc + j] = by_dot(i, j);
  }

  // The exact unit's result from the exact value x of c + sum a_i b_i: x rounded once
  // into the output format. An exact zero keeps c's zero where c is zero (a zero c
  // plus zero products), and is otherwise +0 (-0 rounding toward -inf), the sign IEEE
  // 754 (6.3) gives an exact zero sum of non-zero terms.
  double exact_result(Context& ctx, const Exact& x, std::size_t k, double c) const {
    if (x.hi == 0 && x.lo == 0 && !x.beyond_double)
      return c == 0 ? c : (ctx.control.effective_rounding() == Rounding::rd ? -0.0 : 0.0);
    return ctx.round(out_, x, "dot", {static_cast<double>(k)});
  }

  UnitKind kind_;
  Format in_, out_;
  bool fused_;
};

}  // namespace

NameTable<UnitKind> unit_table() { return kUnits; }
const char* unit_kind_name(UnitKind k) { return kUnits[static_cast<int>(k)].name; }
const char* const* unit_names() {
  static const std::vector<const char*> names = name_array(unit_table());
  return names.data();
}

UnitKind unit_kind_by_name(std::string_view name) { return value_by_name(unit_table(), name, "unit"); }

BlockOperands block_operands(UnitKind k) {
  switch (k) {
    case UnitKind::b200: return BlockOperands::mma;
    case UnitKind::exact:
    case UnitKind::fp32_seq:
    case UnitKind::fp16_seq: return BlockOperands::dequantised;
    default: return BlockOperands::none;
  }
}

void MatrixUnit::gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
                      const double* B, std::size_t ldb, double* C, std::size_t ldc) const {
  gemm_by_rows(ctx, m, n, k, C, ldc, [&](Context& band_ctx, std::size_t first, std::size_t rows) {
    serial_gemm(band_ctx, rows, n, k, A + first * lda, lda, B, ldb, C + first * ldc, ldc);
  });
}

void MatrixUnit::serial_gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A,
                             std::size_t lda, const double* B, std::size_t ldb, double* C, std::size_t ldc) const {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      const ElementGuard element(ctx, static_cast<std::int64_t>(i * n + j),
                                 {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
      C[i * ldc + j] = dot(ctx, k, A + i * lda, 1, B + j, ldb, C[i * ldc + j]);
    }
}

std::unique_ptr<MatrixUnit> make_unit(UnitKind kind, std::optional<Format> in, std::optional<Format> out) {
  switch (kind) {
    case UnitKind::exact:
      return std::make_unique<ReferenceUnit>(kind, in.value_or(fp16()), out.value_or(fp32()));
    case UnitKind::fp32_seq:
    case UnitKind::fp16_seq:
      return make_sequential_unit(kind, true, in, out);
    case UnitKind::ipu_amp:
    case UnitKind::ipu_amp_half:
      return make_ipu_amp_unit(kind == UnitKind::ipu_amp_half, in, out);
    case UnitKind::mi100:
    case UnitKind::mi250x:
    case UnitKind::mi300x:
      return make_cdna_unit(kind, in, out);
    default:
      return make_tensor_core_unit(kind, in, out);
  }
}

std::unique_ptr<MatrixUnit> make_sequential_unit(UnitKind kind, bool fused, std::optional<Format> in,
                                                 std::optional<Format> out) {
  if (kind != UnitKind::fp32_seq && kind != UnitKind::fp16_seq)
    throw std::invalid_argument(std::string("unit '") + unit_kind_name(kind) +
                                "' is not sequential (fused or unfused applies to fp32-seq and fp16-seq)");
  const Format natural = kind == UnitKind::fp32_seq ? fp32() : fp16();
  return std::make_unique<ReferenceUnit>(kind, in.value_or(fp16()), out.value_or(natural), fused);
}

}  // namespace emu
