#include "mma.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "simd.hpp"
#include "threads.hpp"

namespace emu {

namespace {

// How a device runs fp8 inputs.
//  native:        its own fp8 adder (fp8_block products, fp8_kept_bits, fp8_result_bits)
//  fp16_datapath: converted to fp16 and run through the fp16 adder, two blocks per
//                 32-product instruction in alternating pairs, c added afterwards (rne)
enum class Fp8Path { none, native, fp16_datapath };

// The device table. Blocks and extra alignment bits from Khattak and Mikaitis's models
// (V100TC.m ... B200TC.m); the fp8 paths from their measured data (see mma.hpp).
struct DeviceRow {
  UnitKind kind;
  int block;        // fp16 and bf16 inputs
  int extra_bits;   // kept fraction bits = 23 + extra_bits (fp16, bf16, tf32)
  bool bf16;        // takes bf16 inputs
  int tf32_block;   // 0: no tf32 inputs
  Fp8Path fp8_to_fp32, fp8_to_fp16;
  int fp8_block;    // native fp8
  int fp8_kept_bits;
  int fp8_result_bits;  // 13: the e8m13 result (fp32 output); 0: rounded straight
  // bf16 and tf32 products truncated to binary32's subnormal grid (BlockFmaParams::
  // product_lsb = -149): measured on an H100 (mma.hpp); Hopper's H200 shares its
  // tensor cores. false: exact products (no measurement says otherwise).
  bool binary32_products;
};

constexpr int kBinary32SubnormalLsb = -149;  // 2^-149: binary32's smallest subnormal
constexpr int kFp8Instruction = 32;  // products per fp8 instruction on the fp16 datapath

constexpr DeviceRow kDevices[] = {
    // kind          block extra bf16   tf32  fp8 -> fp32           fp8 -> fp16          fp8 block kept result
    //                                                                                                    binary32 products
    {UnitKind::v100, 4, 0, false, 0, Fp8Path::none, Fp8Path::none, 0, 0, 0, false},
    {UnitKind::t4, 8, 1, false, 0, Fp8Path::none, Fp8Path::none, 0, 0, 0, false},  // Turing: fp16 only
    {UnitKind::a100, 8, 1, true, 4, Fp8Path::none, Fp8Path::none, 0, 0, 0, false},
    {UnitKind::ada, 8, 1, true, 4, Fp8Path::native, Fp8Path::native, 16, 13, 13, false},
    {UnitKind::l40s, 8, 1, true, 4, Fp8Path::native, Fp8Path::native, 16, 13, 13, false},
    {UnitKind::h100, 16, 2, true, 8, Fp8Path::native, Fp8Path::fp16_datapath, 32, 13, 13, true},
    {UnitKind::h200, 16, 2, true, 8, Fp8Path::native, Fp8Path::fp16_datapath, 32, 13, 13, true},
    {UnitKind::b200, 16, 2, true, 8, Fp8Path::fp16_datapath, Fp8Path::fp16_datapath, 0, 0, 0, false},
};

// Zeros carry an exponent so low that a product with a zero factor is never the largest
// and is shifted out entirely (no branch on zero in the adder's loops); below
// kNoTerm no term is non-zero.
constexpr int kZeroExponent = -(1 << 20);
constexpr int kNoTerm = -(1 << 19);
constexpr int kMaxBlock = 64;

// 2^e from its bit pattern, for e inside double's normal range.
inline double pow2(int e) { return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52); }

bool same_layout(const Format& f, const Format& preset) { return f.with_subnormals(true) == preset; }

const DeviceRow& device_row(UnitKind device) {
  for (const DeviceRow& row : kDevices)
    if (row.kind == device) return row;
  throw std::invalid_argument(std::string("unit '") + unit_kind_name(device) + "' is not a tensor-core preset");
}

[[gnu::always_inline]] inline double fixed_to_double(const FixedPoint& x) {
  const double value = static_cast<double>(x.magnitude) * pow2(x.lsb);  // lsb well inside double's range
  return x.negative ? -value : value;
}

// round_fixed_point's body, inlined into the adder.
[[gnu::always_inline]] inline void round_fixed(FixedPoint& x, int fraction_bits, int emin, Rounding mode,
                                               Flags& flags) {
  // 1. The exponent of x and q, the weight of the last bit kept (as emu::round, step 1).
  const int exponent = 63 - std::countl_zero(x.magnitude) + x.lsb;
  const int q = std::max(exponent, emin) - fraction_bits;
  const int shift = q - x.lsb;
  if (shift <= 0) return;  // x already fits
  // 2. Split into the kept bits and the remainder. |sum| < 2^49, so shifts of 64 or
  //    more leave nothing and a non-zero remainder below half.
  const std::uint64_t kept = shift < 64 ? x.magnitude >> shift : 0;
  const std::uint64_t remainder = shift < 64 ? x.magnitude & ((std::uint64_t{1} << shift) - 1) : x.magnitude;
  const std::uint64_t half = shift < 64 ? std::uint64_t{1} << (shift - 1) : ~std::uint64_t{0};
  // 3. Whether the magnitude goes up by one unit: emu::round_up's table (round.hpp) on
  //    what the remainder discards (sr is refused by round_fixed_point and the unit's
  //    constructor).
  const Discarded discarded = remainder == 0  ? Discarded::zero
                              : remainder < half ? Discarded::below_half
                              : remainder == half ? Discarded::half
                                                  : Discarded::above_half;
  const bool up = round_up(mode, x.negative, (kept & 1) != 0, discarded);
  if (remainder != 0) flags |= exponent < emin ? (INEXACT | UFLO) : INEXACT;
  x.magnitude = kept + (up ? 1 : 0);
  x.lsb = q;
}

constexpr std::int32_t kInexact = INEXACT, kUnderflow = UFLO;

struct RoundingStep {
  std::int32_t fraction_bits, emin;
};

struct ColumnAdder {
  std::int32_t kept_fraction_bits;
  std::int32_t min_alignment_exponent;
  bool result_step_applies;
  RoundingStep result_step, output_step;
  std::int32_t output_emax, output_emin;
  bool output_subnormals;
  std::int32_t product_shift;
  // Where Wide lanes are needed: the largest |sum of a block's products| that the
  // Narrow finish takes (a sum plus c's term stays below 2^30; mma_columns.inc).
  std::int32_t narrow_sum_limit;
  // The binary32 finish (mma_columns.inc) and the largest |sum of a block's products|
  // it takes (a sum plus c's term stays an int32), checked where a block's sum can
  // reach it.
  bool binary32_finish;
  std::int32_t binary32_sum_limit;
  bool binary32_sums_checked;
};

// The exponent of the lowest set bit of a zero operand: a sum of two of them is above
// any alignment exponent (the products' lost bits, mma_columns.inc).
constexpr std::int32_t kNoLowBit = 1 << 20;

// Operands of the column adder, [row][k] for A and [k][column] in a panel of B:
// significand integers (A's shifted left by product_shift) and exponents; for the float
// products, each value as a float, sig * 2^(exp - offset) (A's without the shift; offset
// the row's or column's largest exponent), and `low`, exp + the trailing zero bits of sig
// (kNoLowBit for zero): a product's bits below the alignment are non-zero exactly when
// a.low + b.low < E.
struct ColumnTerms {
  const std::int32_t* sig;
  const std::int32_t* exp;
  const float* value;
  const std::int32_t* low;
  ColumnTerms operator+(std::size_t j) const { return {sig + j, exp + j, value + j, low + j}; }
};

// One panel (kLanes columns) of gemm_columns for rows 0..m-1.
struct PanelJob {
  std::size_t m, k, block_size;
  ColumnTerms rows, panel;
  // Float products for row i where row_spread[i] <= float_spread_limit (no row where
  // the limit is negative); row_offset and panel_offset are the offsets of the values.
  const std::int32_t* row_offset;
  const std::int32_t* row_spread;
  const std::int32_t* panel_offset;
  std::int32_t float_spread_limit;
  const char* row_special;
  const double* C;
  std::size_t ldc, used;  // used: the panel's columns inside C
  const char* col_special;
  // Per element, row stride result_stride: the result, whether the reference adder must
  // redo it, and its INEXACT and UFLO.
  double* result;
  std::size_t result_stride;
  char* slow;
  Flags* element_flags;
};

// The column adder (mma_columns.inc) at both vector widths: kPanelRows, the columns of
// one panel (kLanes of them) through all blocks of k, by [narrow][result step][nearest].
constexpr std::size_t kLanes = 16;
// Rows of A that gemm_columns takes through all panels of B at a time: their terms (12
// bytes a product) with a panel's fit in a core's L2 at k = 1024.
constexpr std::size_t kChunkRows = 64;
using PanelRows = void (*)(const ColumnAdder&, const PanelJob&);

namespace columns_avx2 {
#define EMU_COLUMN_BYTES 32
#include "mma_columns.inc"
#undef EMU_COLUMN_BYTES
}  // namespace columns_avx2

#if EMU_SIMD
// The AVX-512 copy, compiled for that instruction set here (the build asks only for
// AVX2). gcc's AVX-512 headers trip -W(maybe-)uninitialized under a target pragma, and it
// warns where 64-byte vectors would cross functions compiled without AVX-512 (none do:
// all of them are in this section): silenced for this section only.
#if EMU_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace columns_avx512 {
#define EMU_COLUMN_BYTES 64
#include "mma_columns.inc"
#undef EMU_COLUMN_BYTES
}  // namespace columns_avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
namespace columns_avx512 = columns_avx2;  // never chosen: cpu_has_avx512() is false where EMU_AVX512 is 0 (simd.hpp)
#endif

bool cpu_has_avx512() {
  static const bool has = EMU_AVX512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  return has;
}
#endif

// The width detail::select_panel_adder chose: -1 for the fastest.
std::atomic<int> selected_panel_adder{-1};

const PanelRows* panel_adder() {
#if EMU_SIMD
  if (selected_panel_adder.load(std::memory_order_relaxed) != 0 && cpu_has_avx512())
    return columns_avx512::kPanelRows;
#endif
  return columns_avx2::kPanelRows;
}

// For its lifetime, where `set`: the host's SSE rounding rne (`nearest`) or rz, with no
// flush of subnormal results or operands and every exception masked; the caller's
// control word back at the end.
class HostRounding {
 public:
  HostRounding(bool set, bool nearest) : set_(set) {
#if EMU_SIMD
    if (!set_) return;
    constexpr unsigned kAllMasked = 0x1f80, kTowardZero = 0x6000;
    saved_ = _mm_getcsr();
    _mm_setcsr(kAllMasked | (nearest ? 0 : kTowardZero));
#else
    (void)nearest;
#endif
  }
  ~HostRounding() {
#if EMU_SIMD
    if (set_) _mm_setcsr(saved_);
#endif
  }
  HostRounding(const HostRounding&) = delete;
  HostRounding& operator=(const HostRounding&) = delete;

 private:
  bool set_;
  unsigned saved_ = 0;
};

// How the column adder aligns and sums a block's products (detail::select_product_adder):
// 1, the default, in float (exact products, scaled by 2^-E and truncated by conversion);
// 0, the reference, integer shifts.
std::atomic<int> selected_product_adder{1};

// A term t (in units of the quantum, exact in double) cut to an integer as
// AlignmentRounding says. Every step is exact in double: |t| < 2^43.
template <AlignmentRounding kMode>
[[gnu::always_inline]] inline double cut_term(double t) {
  if constexpr (kMode == AlignmentRounding::truncate_magnitude) {
    return std::trunc(t);
  } else if constexpr (kMode == AlignmentRounding::truncate_twos_complement) {
    return std::floor(t);
  } else {
    // Nearest, ties to even: the floor goes up by one when the rest is above one half,
    // or exactly one half with an odd floor.
    const double floor = std::floor(t);
    const double rest = t - floor;
    return rest > 0.5 || (rest == 0.5 && std::fmod(floor, 2.0) != 0) ? floor + 1 : floor;
  }
}

// c and the n products a_i b_i, each scaled to units of the quantum and cut, added into
// `sum`; `lost` gets non-zero bits where a cut changed a term (a zero difference is
// +0.0, all bits clear). Adding 1.5 * 2^52 puts an integer below 2^51 in the low bits of
// a double's pattern, so the integer is read without a conversion instruction.
// With kProductGrid each product is first truncated toward zero to a multiple of
// 1 / grid (grid = 2^-product_lsb; exact: a product of two inputs has at most 22
// significant bits, and the scalings are powers of two far inside double's range).
template <AlignmentRounding kMode, bool kProductGrid>
void sum_terms(std::size_t n, const double* av, const double* bv, double c, double scale, double grid,
               std::int64_t& sum, std::uint64_t& lost, std::uint64_t& product_lost) {
  constexpr double kMagic = 0x1.8p52;
  const auto magic_bits = std::bit_cast<std::int64_t>(kMagic);
  const double c_term = c * scale;
  const double c_cut = cut_term<kMode>(c_term);
  lost |= std::bit_cast<std::uint64_t>(c_term - c_cut);
  sum += std::bit_cast<std::int64_t>(c_cut + kMagic) - magic_bits;
  for (std::size_t i = 0; i < n; ++i) {
    double product = av[i] * bv[i];
    if constexpr (kProductGrid) {
      const double on_grid = std::trunc(product * grid) / grid;
      product_lost |= std::bit_cast<std::uint64_t>(product - on_grid);
      product = on_grid;
    }
    const double t = product * scale;
    const double cut = cut_term<kMode>(t);
    lost |= std::bit_cast<std::uint64_t>(t - cut);
    sum += std::bit_cast<std::int64_t>(cut + kMagic) - magic_bits;
  }
}

// `product_lost` gets non-zero bits where the product grid cut a product.
template <AlignmentRounding kMode>
void sum_terms(std::size_t n, const double* av, const double* bv, double c, double scale,
               std::optional<double> product_grid, std::int64_t& sum, std::uint64_t& lost,
               std::uint64_t& product_lost) {
  if (product_grid)
    sum_terms<kMode, true>(n, av, bv, c, scale, *product_grid, sum, lost, product_lost);
  else
    sum_terms<kMode, false>(n, av, bv, c, scale, 1.0, sum, lost, product_lost);
}

}  // namespace

namespace {

constexpr Named<AlignmentRounding> kAlignmentRoundings[] = {
    {AlignmentRounding::truncate_magnitude, "truncate-magnitude", "towards zero, sign-magnitude (measured)"},
    {AlignmentRounding::truncate_twos_complement, "truncate-twos-complement",
     "towards minus infinity (an arithmetic right shift)"},
    {AlignmentRounding::nearest_even, "nearest-even", "to nearest, ties to even"},
};
static_assert(in_enum_order(kAlignmentRoundings));

}  // namespace

NameTable<AlignmentRounding> alignment_rounding_table() { return kAlignmentRoundings; }
const char* alignment_rounding_name(AlignmentRounding r) { return kAlignmentRoundings[static_cast<int>(r)].name; }
AlignmentRounding alignment_rounding_by_name(std::string_view name) {
  return value_by_name(alignment_rounding_table(), name, "alignment rounding");
}

BlockFmaParams tensor_core_params(UnitKind device, const Format& in, const Format& out) {
  const DeviceRow& row = device_row(device);
  const std::string name = unit_kind_name(device);
  const bool fp8 = same_layout(in, fp8_e4m3()) || same_layout(in, fp8_e5m2());
  const bool fp16_in = same_layout(in, fp16());
  const bool fp32_out = same_layout(out, fp32());
  if (!fp32_out && !(same_layout(out, fp16()) && (fp16_in || fp8)))
    throw std::invalid_argument(name + " tensor cores do not give " + out.name() + " output for " + in.name() +
                                " inputs (fp32, or fp16 for fp16 and fp8 inputs)");
  const Fp8Path fp8_path = fp32_out ? row.fp8_to_fp32 : row.fp8_to_fp16;

  BlockFmaParams p;
  p.input_subnormals = in.subnormals();
  p.final_rounding = fp32_out ? Rounding::rz : Rounding::rne;
  p.kept_fraction_bits = 23 + row.extra_bits;
  if (fp16_in || (row.bf16 && same_layout(in, bf16()))) {
    p.block_size = row.block;
    if (!fp16_in && row.binary32_products) p.product_lsb = kBinary32SubnormalLsb;
  } else if (row.tf32_block > 0 && same_layout(in, tf32())) {
    p.block_size = row.tf32_block;
    if (row.binary32_products) p.product_lsb = kBinary32SubnormalLsb;
  } else if (fp8 && fp8_path == Fp8Path::native) {
    p.block_size = row.fp8_block;
    p.kept_fraction_bits = row.fp8_kept_bits;
    if (fp32_out) p.result_fraction_bits = row.fp8_result_bits;
  } else if (fp8 && fp8_path == Fp8Path::fp16_datapath) {
    p.block_size = row.block;
    p.fp16_datapath = true;
    p.instruction_k = kFp8Instruction;
    p.pair_interleave = true;
    p.c_after_products = true;
    p.c_rounding = Rounding::rne;
  } else {
    std::string accepted = "fp16";
    if (row.bf16) accepted += ", bf16";
    if (row.tf32_block > 0) accepted += ", tf32";
    if (row.fp8_to_fp32 != Fp8Path::none) accepted += ", fp8-e4m3, fp8-e5m2";
    throw std::invalid_argument(name + " tensor cores do not take " + in.name() + " inputs (they take " +
                                accepted + ")");
  }
  return p;
}

TensorCoreUnit::TensorCoreUnit(UnitKind kind, Format in, Format out, BlockFmaParams params)
    : kind_(kind),
      in_(std::move(in)),
      out_(std::move(out)),
      adder_in_(params.fp16_datapath ? fp16().with_subnormals(in_.subnormals()) : in_),
      params_(params) {
  if (params_.block_size < 1 || params_.block_size > kMaxBlock)
    throw std::invalid_argument("block size must be 1.." + std::to_string(kMaxBlock));
  if (params_.kept_fraction_bits < 1 || params_.kept_fraction_bits > 40)
    throw std::invalid_argument("kept fraction bits must be 1..40");
  if (params_.min_alignment_exponent > 256)
    throw std::invalid_argument("the minimum alignment exponent must be at most 256");
  if (params_.instruction_k < 0 || params_.instruction_k % params_.block_size != 0)
    throw std::invalid_argument("instruction k must be a multiple of the block size");
  if (params_.final_rounding == Rounding::sr)
    throw std::invalid_argument("the block adder's final rounding must be one of rne rna rz ru rd ro (not sr)");
  if (adder_in_.fraction_bits() > 15 || adder_in_.emax() > 127 || adder_in_.emin() < -126)
    throw std::invalid_argument("tensor-core inputs must fit in binary32 with at most 15 fraction bits");
  if (params_.fp16_datapath && !in_.with_subnormals(true).representable(in_.max_finite()))
    throw std::invalid_argument("the fp16 datapath needs inputs that fp16 holds");
  if (out_.fraction_bits() > 23 || out_.emax() > 127)
    throw std::invalid_argument("tensor-core outputs must fit in binary32");
  if (params_.result_fraction_bits > 0)
    result_format_ = Format(8, params_.result_fraction_bits, Encoding::ieee, out_.subnormals());
  // gemm_columns sums a block's truncated products in int32: each is below
  // 2^(kept_fraction_bits + 2), so a block of them fits when that times the block size
  // is at most 2^31.
  const int shift = params_.kept_fraction_bits - 2 * adder_in_.fraction_bits();
  const int block_bits = std::bit_width(static_cast<unsigned>(params_.block_size - 1));
  const bool column_rounding = params_.final_rounding == Rounding::rz || params_.final_rounding == Rounding::rne;
  if (!params_.pair_interleave && !params_.c_after_products && shift >= 0 &&
      params_.kept_fraction_bits + 2 + block_bits <= 31 &&
      params_.alignment_rounding == AlignmentRounding::truncate_magnitude && column_rounding)
    product_shift_ = shift;
}

void TensorCoreUnit::decode(double x, double& value, std::int32_t& exp, bool& special) const {
  value = 0.0;
  exp = kZeroExponent;
  if (!std::isfinite(x)) {
    special = true;
    return;
  }
  if (x == 0) return;
  const double magnitude = std::fabs(x);
  if (!in_.with_subnormals(true).representable(x))
    throw std::invalid_argument("tensor-core input " + std::to_string(x) + " is not a value of " + in_.name() +
                                " (round the inputs first)");
  if (magnitude < in_.min_normal() && !params_.input_subnormals) return;
  value = x;
  exp = std::max(std::ilogb(magnitude), adder_in_.emin());
}

void round_fixed_point(FixedPoint& x, int fraction_bits, int emin, Rounding mode, Flags& flags) {
  if (mode == Rounding::sr) throw std::invalid_argument("round_fixed_point: sr needs random bits");
  round_fixed(x, fraction_bits, emin, mode, flags);
}

double to_double(const FixedPoint& x) { return fixed_to_double(x); }

double TensorCoreUnit::block(Context& ctx, std::size_t n, Operands a, Operands b, double c, Flags& flags) const {
  const int kept = params_.kept_fraction_bits;

  // c's exponent as a binary32 (every output value is one); subnormals have emin.
  int c_exp = kZeroExponent;
  if (c != 0) {
    const int field = static_cast<int>((std::bit_cast<std::uint32_t>(static_cast<float>(c)) >> 23) & 0xff);
    c_exp = field != 0 ? field - 127 : -126;
  }

  // Step 2: the alignment exponent over the products' raw exponents and c's.
  int align = c_exp;
  for (std::size_t i = 0; i < n; ++i) align = std::max(align, a.exp[i] + b.exp[i]);
  // An exact zero sum is +0, as the adder's sign-magnitude integer sum gives (an IEEE
  // adder would keep -0 + -0 = -0).
  if (align < kNoTerm) return 0.0;
  align = std::max(align, params_.min_alignment_exponent);

  // Step 3: cut every term to a multiple of 2^(align - kept) and add exactly. In units of
  // that quantum a term is t = a_i b_i 2^(kept - align), exact in double (a power-of-two
  // scaling of an exact product, far from double's range limits); its cut (sum_terms)
  // is an integer of magnitude at most 2^(kept + 2) <= 2^42, taken into an int64 sum
  // exactly and without a branch per term.
  const double scale = pow2(kept - align);
  // Products cut to 2^product_lsb: skipped where the alignment truncates them,
  // sign-magnitude, to a coarser grid still (nested truncations toward zero compose).
  std::optional<double> product_grid;
  if (align - kept < params_.product_lsb ||
      (params_.product_lsb > kNoTerm && params_.alignment_rounding != AlignmentRounding::truncate_magnitude))
    product_grid = std::ldexp(1.0, -params_.product_lsb);
  std::int64_t sum = 0;
  std::uint64_t lost = 0, product_lost = 0;
  switch (params_.alignment_rounding) {
    case AlignmentRounding::truncate_magnitude:
      sum_terms<AlignmentRounding::truncate_magnitude>(n, a.value, b.value, c, scale, product_grid, sum, lost,
                                                          product_lost);
      break;
    case AlignmentRounding::truncate_twos_complement:
      sum_terms<AlignmentRounding::truncate_twos_complement>(n, a.value, b.value, c, scale, product_grid, sum, lost,
                                                          product_lost);
      break;
    case AlignmentRounding::nearest_even:
      sum_terms<AlignmentRounding::nearest_even>(n, a.value, b.value, c, scale, product_grid, sum, lost,
                                                          product_lost);
      break;
  }
  // A product cut to the grid lies below binary32's normal range and lost bits: an
  // underflow, as converting it to a binary32 subnormal would raise.
  const Flags truncated = (lost != 0 ? INEXACT : 0) | (product_lost != 0 ? (INEXACT | UFLO) : 0);
  if (sum == 0) {
    flags |= truncated;
    return 0.0;
  }

  // Step 4: one normalisation and rounding, on the integer sum.
  const FixedPoint exact{static_cast<std::uint64_t>(sum < 0 ? -sum : sum), align - kept, sum < 0};
  FixedPoint result = exact;
  Flags raised = truncated;
  if (result_format_) round_fixed(result, result_format_->fraction_bits(), result_format_->emin(), Rounding::rz, raised);
  round_fixed(result, out_.fraction_bits(), out_.emin(), params_.final_rounding, raised);
  const double value = fixed_to_double(result);
  const bool tiny = 63 - std::countl_zero(exact.magnitude) + exact.lsb < out_.emin();
  if (std::fabs(value) <= out_.max_finite() && (out_.subnormals() || !tiny)) {
    flags |= raised;
    return value;
  }
  // Overflow, or a flushed subnormal: emu::round under the context. The model truncates
  // the significand but still overflows to infinity (Khattak and Mikaitis: an all-ones
  // exponent field is infinity whatever the rounding), hence rne past the range.
  double wide = fixed_to_double(exact);
  if (result_format_) {
    wide = ctx.round_with(Rounding::rz, *result_format_, Exact{wide}, "mma", {}, truncated);
    raised = 0;
  } else {
    raised = truncated;
  }
  const Rounding mode = std::fabs(wide) >= std::ldexp(1.0, out_.emax() + 1) ? Rounding::rne : params_.final_rounding;
  return ctx.round_with(mode, out_, Exact{wide}, "mma", {}, raised);
}

// One instruction of instruction_k products (fewer at the end of k): its blocks, and c.
double TensorCoreUnit::instruction(Context& ctx, std::size_t k, Operands a, Operands b, double c,
                                   Flags& flags) const {
  const auto block_size = static_cast<std::size_t>(params_.block_size);
  double acc = params_.c_after_products ? 0.0 : c;
  if (!params_.pair_interleave) {
    for (std::size_t j = 0; j < k; j += block_size) {
      acc = block(ctx, std::min(block_size, k - j), a + j, b + j, acc, flags);
      if (!std::isfinite(acc)) return acc;  // an overflow: finite products cannot change it
    }
  } else {
    // Deal the products to the blocks two at a time: pair p goes to block p mod blocks.
    const std::size_t blocks = static_cast<std::size_t>(params_.instruction_k) / block_size;
    double a_value[kMaxBlock], b_value[kMaxBlock];
    std::int32_t a_exp[kMaxBlock], b_exp[kMaxBlock];
    for (std::size_t g = 0; g < blocks; ++g) {
      std::size_t n = 0;
      for (std::size_t i = 2 * g; i < k; i += 2 * blocks)
        for (std::size_t t = i; t < std::min(i + 2, k); ++t) {
          a_value[n] = a.value[t];
          a_exp[n] = a.exp[t];
          b_value[n] = b.value[t];
          b_exp[n] = b.exp[t];
          ++n;
        }
      acc = block(ctx, n, {a_value, a_exp}, {b_value, b_exp}, acc, flags);
      if (!std::isfinite(acc)) return acc;
    }
  }
  if (!params_.c_after_products) return acc;
  const Exact x = exact_add(acc, c);
  if (x.hi == 0 && x.lo == 0) return std::signbit(acc) && std::signbit(c) ? -0.0 : 0.0;
  return ctx.round_with(params_.c_rounding, out_, x, "mma", {});
}

double TensorCoreUnit::chain(Context& ctx, std::size_t k, Operands a, Operands b, double c, Flags& flags) const {
  const auto step = static_cast<std::size_t>(params_.instruction_k > 0 ? params_.instruction_k
                                                                       : params_.block_size);
  for (std::size_t j = 0; j < k; j += step) {
    c = instruction(ctx, std::min(step, k - j), a + j, b + j, c, flags);
    if (!std::isfinite(c)) return c;  // an overflow: the remaining (finite) products cannot change it
  }
  return c;
}

void TensorCoreUnit::commit(Context& ctx, Flags flags, double result) const {
  if (flags != 0) ctx.raise_flags(flags, "mma", {}, result);
}

bool TensorCoreUnit::flags_per_element(const Context& ctx) {
  return ((ctx.control.counted | ctx.control.traps) & (INEXACT | UFLO)) != 0;
}

double TensorCoreUnit::special_dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b,
                                   std::size_t sb, double c) const {
  bool nan = std::isnan(c), invalid = false, pos_inf = c == INFINITY, neg_inf = c == -INFINITY;
  for (std::size_t i = 0; i < k; ++i) {
    const double x = a[i * sa], y = b[i * sb];
    if (std::isnan(x) || std::isnan(y)) nan = true;
    else if ((std::isinf(x) && y == 0) || (std::isinf(y) && x == 0)) invalid = true;
    else if (std::isinf(x) || std::isinf(y)) (std::signbit(x) != std::signbit(y) ? neg_inf : pos_inf) = true;
  }
  if (pos_inf && neg_inf) invalid = true;
  if (nan || invalid) {
    const double result = std::numeric_limits<double>::quiet_NaN();
    if (invalid) ctx.round_with(params_.final_rounding, out_, Exact{result}, "mma", {}, INV);
    return result;
  }
  return ctx.round_with(params_.final_rounding, out_, Exact{pos_inf ? INFINITY : -INFINITY}, "mma", {});
}

double TensorCoreUnit::dot_gathering(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b,
                                     std::size_t sb, double c, Flags& flags) const {
  std::vector<double> a_value(k), b_value(k);
  std::vector<std::int32_t> a_exp(k), b_exp(k);
  bool special = !std::isfinite(c);
  for (std::size_t i = 0; i < k; ++i) {
    decode(a[i * sa], a_value[i], a_exp[i], special);
    decode(b[i * sb], b_value[i], b_exp[i], special);
  }
  if (special) return special_dot(ctx, k, a, sa, b, sb, c);
  return chain(ctx, k, {a_value.data(), a_exp.data()}, {b_value.data(), b_exp.data()}, c, flags);
}

double TensorCoreUnit::dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b,
                           std::size_t sb, double c) const {
  Flags flags = 0;
  const double d = dot_gathering(ctx, k, a, sa, b, sb, c, flags);
  commit(ctx, flags, d);
  return d;
}

// B decoded for the column adder, shared by every band of rows of one gemm: significand
// integers and exponents in panels of kLanes columns, [panel][k][column], padded with
// zeros; for the float products, values, low bits, offsets and spreads (ColumnTerms);
// the columns with NaN or infinity, and each column's smallest exponent where the unit
// has a product grid.
struct TensorCoreUnit::ColumnPanels {
  std::size_t count = 0;  // panels
  bool float_products = false;
  std::vector<std::int32_t> sig, exp;
  std::vector<float> value;
  std::vector<std::int32_t> low, offset, spread;
  std::vector<char> special;
  std::vector<std::int32_t> smallest;
};

bool TensorCoreUnit::column_adder_applies(const Context& ctx, std::size_t k) const {
  return product_shift_ >= 0 && k > 0 && !flags_per_element(ctx);
}

void TensorCoreUnit::gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A,
                          std::size_t lda, const double* B, std::size_t ldb, double* C, std::size_t ldc) const {
  if (!column_adder_applies(ctx, k)) {
    MatrixUnit::gemm(ctx, m, n, k, A, lda, B, ldb, C, ldc);
    return;
  }
  // B decoded once for every band. Where B holds an input outside the format, the bands
  // decode it themselves, after their rows of A (the reference's order, so that the same
  // input is reported).
  std::optional<ColumnPanels> panels;
  try {
    panels = decode_panels(n, k, B, ldb);
  } catch (const std::invalid_argument&) {
    MatrixUnit::gemm(ctx, m, n, k, A, lda, B, ldb, C, ldc);
    return;
  }
  gemm_by_rows(ctx, m, n, k, C, ldc, [&](Context& band_ctx, std::size_t first, std::size_t rows) {
    gemm_columns(band_ctx, rows, n, k, A + first * lda, lda, B, ldb, C + first * ldc, ldc, &*panels);
  });
}

void TensorCoreUnit::serial_gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A,
                                 std::size_t lda, const double* B, std::size_t ldb, double* C,
                                 std::size_t ldc) const {
  if (column_adder_applies(ctx, k))
    gemm_columns(ctx, m, n, k, A, lda, B, ldb, C, ldc, nullptr);
  else
    gemm_reference(ctx, m, n, k, A, lda, B, ldb, C, ldc);
}

void TensorCoreUnit::gemm_reference(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A,
                                    std::size_t lda, const double* B, std::size_t ldb, double* C,
                                    std::size_t ldc) const {
  // Decode once: rows of A and columns of B, each contiguous.
  std::vector<double> row_value(m * k), col_value(n * k);
  std::vector<std::int32_t> row_exp(m * k), col_exp(n * k);
  std::vector<char> row_special(m, 0), col_special(n, 0);
  for (std::size_t i = 0; i < m; ++i) {
    bool special = false;
    for (std::size_t p = 0; p < k; ++p) decode(A[i * lda + p], row_value[i * k + p], row_exp[i * k + p], special);
    row_special[i] = special;
  }
  for (std::size_t j = 0; j < n; ++j) {
    bool special = false;
    for (std::size_t p = 0; p < k; ++p) decode(B[p * ldb + j], col_value[j * k + p], col_exp[j * k + p], special);
    col_special[j] = special;
  }
  const Operands rows{row_value.data(), row_exp.data()}, cols{col_value.data(), col_exp.data()};
  // Per element where INEXACT or UFLO are counted or trapped, or where a trap may fire
  // (its report then shows the status of the elements before it).
  const bool per_element = flags_per_element(ctx) || ctx.control.traps != 0;
  Flags flags = 0;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      const ElementGuard element(ctx, static_cast<std::int64_t>(i * n + j),
                                 {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
      double& c = C[i * ldc + j];
      if (row_special[i] || col_special[j] || !std::isfinite(c))
        c = special_dot(ctx, k, A + i * lda, 1, B + j, ldb, c);
      else
        c = chain(ctx, k, rows + i * k, cols + j * k, c, flags);
      if (per_element) {
        commit(ctx, flags, c);
        flags = 0;
      }
    }
  commit(ctx, flags);
}

namespace {

// Offsets and spreads of kCount sequences of `count` values, element p of sequence l at
// p * kCount + l (A's rows one by one, a panel's columns together); then the values and
// low bits (see ColumnTerms). A sequence without a non-zero value keeps offset 0 and
// spread 0. In loops the compiler vectorises.
template <std::size_t kCount>
void float_terms(const std::int32_t* sig, const std::int32_t* exp, std::size_t count, int shift, float* value,
                 std::int32_t* low, std::int32_t* offset, std::int32_t* spread) {
  std::int32_t largest[kCount], smallest[kCount];
  std::fill_n(largest, kCount, kNoTerm);
  std::fill_n(smallest, kCount, -kNoTerm);
  for (std::size_t p = 0; p < count; ++p)
    for (std::size_t l = 0; l < kCount; ++l) {
      const std::size_t at = p * kCount + l;
      largest[l] = std::max(largest[l], sig[at] != 0 ? exp[at] : kNoTerm);
      smallest[l] = std::min(smallest[l], sig[at] != 0 ? exp[at] : -kNoTerm);
    }
  for (std::size_t l = 0; l < kCount; ++l) {
    if (largest[l] == kNoTerm) largest[l] = smallest[l] = 0;
    offset[l] = largest[l];
    spread[l] = largest[l] - smallest[l];
  }
  for (std::size_t p = 0; p < count; ++p)
    for (std::size_t l = 0; l < kCount; ++l) {
      const std::size_t at = p * kCount + l;
      // sig * 2^(exp - offset - shift): exact where the sequence takes the float
      // products (its exponent is at least -126 there; clamped elsewhere, unused).
      const std::int32_t scale = std::clamp(exp[at] - largest[l] - shift, -126, 0);
      value[at] = static_cast<float>(sig[at]) * std::bit_cast<float>((scale + 127) << 23);
      // The lowest set bit, sig & -sig, a power of two: its exponent as a float.
      const auto lowest_bit = std::bit_cast<std::int32_t>(static_cast<float>(sig[at] & -sig[at]));
      low[at] = sig[at] == 0 ? kNoLowBit : exp[at] + ((lowest_bit >> 23) & 0xff) - 127;
    }
}

// The smallest exponent of `count` values at `stride`, zeros apart (int32's largest where
// every one is zero).
std::int32_t smallest_exponent(const std::int32_t* begin, std::size_t count, std::size_t stride) {
  std::int32_t smallest = std::numeric_limits<std::int32_t>::max();
  for (std::size_t p = 0; p < count; ++p)
    if (begin[p * stride] != kZeroExponent) smallest = std::min(smallest, begin[p * stride]);
  return smallest;
}

// Decodes as decode() does, from the bits where a value is zero or a normal value of the
// input format (the inputs of a training step nearly always), else through `fallback`
// (decode(): it reports inputs outside the format): significand integers, shifted left
// by `shift`, and exponents.
template <class Fallback>
class IntegerDecoder {
 public:
  IntegerDecoder(const Format& in, const Format& adder_in, Fallback fallback)
      : in_(in),
        fraction_bits_(adder_in.fraction_bits()),
        below_input_precision_((std::uint64_t{1} << (52 - in.fraction_bits())) - 1),
        fallback_(fallback) {
#if EMU_SIMD
    emin_ = _mm256_set1_epi64x(in.emin());
    emax_ = _mm256_set1_epi64x(in.emax());
    low_mask_ = _mm256_set1_epi64x(static_cast<long long>(below_input_precision_));
    max_finite_ = _mm256_set1_pd(in.max_finite());
#endif
  }

  void decode(double x, std::int32_t& sig, std::int32_t& exp, bool& special, int shift) const {
    if (x == 0) {  // as decode() gives it; zeros are common (padding, ReLU, dilated gradients)
      sig = 0;
      exp = kZeroExponent;
      return;
    }
    const auto bits = std::bit_cast<std::uint64_t>(x);
    const int e = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
    if (e >= in_.emin() && e <= in_.emax() && (bits & below_input_precision_) == 0 &&
        std::fabs(x) <= in_.max_finite()) {
      const auto magnitude = static_cast<std::int32_t>(((bits & 0xfffffffffffff) | (std::uint64_t{1} << 52)) >>
                                                       (52 - fraction_bits_));
      sig = (x < 0 ? -magnitude : magnitude) * (std::int32_t{1} << shift);
      exp = e;
      return;
    }
    double value;
    fallback_(x, value, exp, special);
    sig = value == 0 ? 0 : static_cast<std::int32_t>(value * pow2(fraction_bits_ - exp + shift));
  }

#if EMU_SIMD
  // Four consecutive values at once where each is zero or a normal value of the input
  // format (decode()'s first two branches): false, with nothing written, where one is not.
  bool decode4(const double* x, std::int32_t* sig, std::int32_t* exp, int shift) const {
    const __m256i emin = emin_, emax = emax_, low_mask = low_mask_;
    const __m256d max_finite = max_finite_;
    const __m128i fraction_shift = _mm_cvtsi32_si128(52 - fraction_bits_);
    const __m256d v = _mm256_loadu_pd(x);
    const __m256i bits = _mm256_castpd_si256(v);
    const __m256i e = _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff)),
                                       _mm256_set1_epi64x(1023));
    const __m256i outside = _mm256_or_si256(
        _mm256_or_si256(_mm256_cmpgt_epi64(e, emax), _mm256_cmpgt_epi64(emin, e)),
        _mm256_xor_si256(_mm256_cmpeq_epi64(_mm256_and_si256(bits, low_mask), _mm256_setzero_si256()),
                         _mm256_set1_epi64x(-1)));
    const __m256d normal = _mm256_andnot_pd(_mm256_castsi256_pd(outside),
                                            _mm256_cmp_pd(simd::magnitude(v), max_finite, _CMP_LE_OQ));
    const __m256d zero = _mm256_cmp_pd(v, _mm256_setzero_pd(), _CMP_EQ_OQ);
    if (!simd::every_lane(_mm256_or_pd(normal, zero))) return false;
    const __m256i magnitude = _mm256_srl_epi64(
        _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0xfffffffffffff)), _mm256_set1_epi64x(1LL << 52)),
        fraction_shift);
    // Per lane in int32 as decode_integer: the significand's low half, negated where the
    // sign (bit 31 of the high half) is set, shifted; zeros as significand 0, kZeroExponent.
    auto halves = [](__m256i x, int high) {
      return _mm256_castsi256_si128(
          _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(high, 2 + high, 4 + high, 6 + high, 0, 0, 0, 0)));
    };
    const __m128i sign = _mm_or_si128(halves(bits, 1), _mm_set1_epi32(1));  // < 0 iff x < 0
    const __m128i sig32 = _mm_sll_epi32(_mm_sign_epi32(halves(magnitude, 0), sign), _mm_cvtsi32_si128(shift));
    const __m128i zero32 = halves(_mm256_castpd_si256(zero), 0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sig), _mm_andnot_si128(zero32, sig32));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(exp), _mm_blendv_epi8(halves(e, 0), _mm_set1_epi32(kZeroExponent), zero32));
    return true;
  }
#endif

 private:
  const Format& in_;
  int fraction_bits_;
  std::uint64_t below_input_precision_;
  Fallback fallback_;
#if EMU_SIMD
  __m256i emin_, emax_, low_mask_;  // decode4's, per lane
  __m256d max_finite_;
#endif
};

}  // namespace

TensorCoreUnit::ColumnPanels TensorCoreUnit::decode_panels(std::size_t n, std::size_t k, const double* B,
                                                           std::size_t ldb) const {
  const IntegerDecoder decoder(in_, adder_in_, [this](double x, double& value, std::int32_t& exp, bool& special) {
    decode(x, value, exp, special);
  });
  ColumnPanels b;
  b.count = (n + kLanes - 1) / kLanes;
  const std::size_t size = b.count * k * kLanes;
  b.sig.assign(size, 0);
  b.exp.assign(size, kZeroExponent);
  b.special.assign(n, 0);
  // B by rows, four columns at a time where every value is zero or normal, else one by
  // one; by columns, in the reference's order, where n is not a multiple of four or a
  // value is outside the format (so that the same one is reported). (By columns, B's
  // rows are far apart: a single subnormal used to send all of B that way.)
  bool b_decoded = false;
#if EMU_SIMD
  if (n % 4 == 0 && kLanes % 4 == 0) {
    try {
      for (std::size_t p = 0; p < k; ++p)
        for (std::size_t j = 0; j < n; j += 4) {
          const std::size_t at = ((j / kLanes) * k + p) * kLanes + j % kLanes;
          if (decoder.decode4(B + p * ldb + j, &b.sig[at], &b.exp[at], 0)) continue;
          for (std::size_t q = 0; q < 4; ++q) {
            bool special = false;
            decoder.decode(B[p * ldb + j + q], b.sig[at + q], b.exp[at + q], special, 0);
            if (special) b.special[j + q] = 1;
          }
        }
      b_decoded = true;
    } catch (const std::invalid_argument&) {
      // reported below, by columns
    }
  }
#endif
  if (!b_decoded)
    for (std::size_t j = 0; j < n; ++j) {
      bool special = false;
      for (std::size_t p = 0; p < k; ++p) {
        const std::size_t at = ((j / kLanes) * k + p) * kLanes + j % kLanes;
        decoder.decode(B[p * ldb + j], b.sig[at], b.exp[at], special, 0);
      }
      b.special[j] = special;
    }

  // The float products' operands (see ColumnTerms); allocated for the integer shifts too
  // (the column adder offsets their pointers).
  b.float_products = selected_product_adder.load(std::memory_order_relaxed) != 0;
  b.value.resize(size);
  b.low.resize(size);
  b.offset.assign(b.count * kLanes, 0);
  b.spread.assign(b.count * kLanes, 0);
  if (b.float_products)
    for (std::size_t panel = 0; panel < b.count; ++panel) {
      const std::size_t at = panel * k * kLanes;
      float_terms<kLanes>(b.sig.data() + at, b.exp.data() + at, k, 0, b.value.data() + at, b.low.data() + at,
                          &b.offset[panel * kLanes], &b.spread[panel * kLanes]);
    }
  if (params_.product_lsb > kNoTerm) {  // see gemm_columns
    b.smallest.resize(n);
    for (std::size_t j = 0; j < n; ++j)
      b.smallest[j] = smallest_exponent(b.exp.data() + (j / kLanes) * k * kLanes + j % kLanes, k, kLanes);
  }
  return b;
}

void TensorCoreUnit::gemm_columns(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A,
                                  std::size_t lda, const double* B, std::size_t ldb, double* C, std::size_t ldc,
                                  const ColumnPanels* shared) const {
  // Decode as gemm_reference does, in its order (A by rows, then B by columns, unless
  // `shared` holds B decoded already), so that an input outside the format is reported
  // the same: A's significands shifted by product_shift_.
  const int fraction_bits = adder_in_.fraction_bits();
  const IntegerDecoder decoder(in_, adder_in_, [this](double x, double& value, std::int32_t& exp, bool& special) {
    decode(x, value, exp, special);
  });
  std::vector<std::int32_t> a_sig(m * k), a_exp(m * k);
  std::vector<char> row_special(m, 0);
  for (std::size_t i = 0; i < m; ++i) {
    bool special = false;
    std::size_t p = 0;
#if EMU_SIMD
    auto decode4 = [&](std::size_t q) {
      return decoder.decode4(A + i * lda + q, &a_sig[i * k + q], &a_exp[i * k + q], product_shift_);
    };
    while (p + 4 <= k && decode4(p)) p += 4;
#endif
    for (; p < k; ++p) {
      decoder.decode(A[i * lda + p], a_sig[i * k + p], a_exp[i * k + p], special, product_shift_);
#if EMU_SIMD
      if (p % 4 == 3)  // back to whole vectors after a group taken one by one
        while (p + 5 <= k && decode4(p + 1)) p += 4;
#endif
    }
    row_special[i] = special;
  }
  const ColumnPanels local = shared != nullptr ? ColumnPanels{} : decode_panels(n, k, B, ldb);
  const ColumnPanels& b = shared != nullptr ? *shared : local;
  const std::size_t panels = b.count;

  // The float products for A's rows. A product of two values is exact in float and at
  // least 2^-(row spread + column spread): a normal float while that is at most 126; the
  // scale 2^(product_shift + row offset + column offset - E) stays below 2^128 while it
  // is at most 127 - product_shift (mma_columns.inc). Rows and panels beyond the limit
  // (wide bf16 data) take the integer shifts.
  const bool float_products = b.float_products;
  const std::int32_t float_spread = 126 - product_shift_;

  ColumnAdder adder{};
  adder.product_shift = product_shift_;
  adder.kept_fraction_bits = params_.kept_fraction_bits;
  adder.min_alignment_exponent = params_.min_alignment_exponent;
  adder.result_step_applies = result_format_.has_value();
  if (result_format_) adder.result_step = {result_format_->fraction_bits(), result_format_->emin()};
  adder.output_step = {out_.fraction_bits(), out_.emin()};
  adder.output_emax = out_.emax();
  adder.output_emin = out_.emin();
  adder.output_subnormals = out_.subnormals();

  // The int32 finish holds sums below 2^30: a block's terms are below 2^(kept + 2) each
  // and c's below 2^(kept + 1).
  const auto block_size = static_cast<std::size_t>(params_.block_size);
  const std::int64_t kept_unit = std::int64_t{1} << params_.kept_fraction_bits;
  const bool narrow = static_cast<std::int64_t>(block_size) * 4 * kept_unit + 2 * kept_unit <= (std::int64_t{1} << 30);
  auto sum_limit = [&](int bits) {  // 2^bits less c's largest term, at least 0
    return static_cast<std::int32_t>(std::max<std::int64_t>((std::int64_t{1} << bits) - 2 * kept_unit, 0));
  };
  adder.narrow_sum_limit = sum_limit(30);
  // On the host's conversion to float, rounding as the unit's final rounding with no
  // flush: fp32 output (subnormal results go to the reference adder).
  adder.binary32_finish = EMU_SIMD && float_products && !adder.result_step_applies && out_.fraction_bits() == 23 &&
                          out_.emin() == -126 && out_.emax() == 127 && out_.subnormals();
  adder.binary32_sum_limit = sum_limit(31);
  adder.binary32_sums_checked = static_cast<std::int64_t>(block_size) * 4 * kept_unit > adder.binary32_sum_limit;
  const bool nearest = params_.final_rounding == Rounding::rne;  // rne or rz (product_shift_ >= 0)
  const unsigned variant = (narrow ? 4u : 0u) | (adder.result_step_applies ? 2u : 0u) | (nearest ? 1u : 0u);
  const PanelRows* const kVariants = panel_adder();
  // Rows in chunks, each through every panel, then written to C: a chunk's rows of A
  // stay in cache across the panels (all of A per panel streamed from memory), its rows
  // of C span few pages, and the float terms of A and the results take buffers of one
  // chunk, reused.
  const std::size_t chunk_rows = std::min(kChunkRows, m);
  std::vector<float> a_value(chunk_rows * k);
  std::vector<std::int32_t> a_low(chunk_rows * k), row_offset(chunk_rows, 0), row_spread(chunk_rows, 0);
  // Per element of the chunk: the column adder's result and its INEXACT and UFLO, or
  // `slow` where the reference adder must redo it (columns with NaN or infinity, c
  // outside binary32, overflow), in the pass that writes C.
  std::vector<double> result(chunk_rows * n);
  std::vector<char> slow(chunk_rows * n);
  std::vector<Flags> element_flags(chunk_rows * n);
  Flags flags = 0;
  for (std::size_t first = 0; first < m; first += kChunkRows) {
    const std::size_t rows = std::min(kChunkRows, m - first);
    if (float_products)
      for (std::size_t r = 0; r < rows; ++r)
        float_terms<1>(a_sig.data() + (first + r) * k, a_exp.data() + (first + r) * k, k, product_shift_,
                       a_value.data() + r * k, a_low.data() + r * k, &row_offset[r], &row_spread[r]);
    std::fill_n(slow.begin(), rows * n, 0);
    for (std::size_t panel = 0; panel < panels; ++panel) {
      const std::size_t j0 = panel * kLanes;
      PanelJob job{};
      job.m = rows;
      job.k = k;
      job.block_size = block_size;
      job.rows = {a_sig.data() + first * k, a_exp.data() + first * k, a_value.data(), a_low.data()};
      job.panel = ColumnTerms{b.sig.data(), b.exp.data(), b.value.data(), b.low.data()} + panel * k * kLanes;
      job.row_offset = row_offset.data();
      job.row_spread = row_spread.data();
      job.panel_offset = b.offset.data() + j0;
      const auto panel_spread = b.spread.begin() + static_cast<std::ptrdiff_t>(j0);
      job.float_spread_limit =
          float_products ? float_spread - *std::max_element(panel_spread, panel_spread + kLanes) : -1;
      job.row_special = row_special.data() + first;
      job.C = C + first * ldc + j0;
      job.ldc = ldc;
      job.used = std::min(kLanes, n - j0);
      job.col_special = b.special.data() + j0;
      job.result = result.data() + j0;
      job.result_stride = n;
      job.slow = slow.data() + j0;
      job.element_flags = element_flags.data() + j0;
      const HostRounding host_rounding(adder.binary32_finish, nearest);  // the panel adder's only, not the reference's
      kVariants[variant](adder, job);
    }
    // The integer adder keeps products exact: an element with a product that may lie off
    // the 2^product_lsb grid goes to the reference adder, which cuts it. A product of
    // significand integers is a multiple of 2^(e_a + e_b - 2 * fraction_bits), so the
    // smallest exponents of A's row and B's column bound it (rare: products below 2^-126).
    if (params_.product_lsb > kNoTerm)
      for (std::size_t r = 0; r < rows; ++r) {
        const std::int64_t row_smallest = smallest_exponent(a_exp.data() + (first + r) * k, k, 1);
        for (std::size_t j = 0; j < n; ++j)
          if (row_smallest + b.smallest[j] - 2 * fraction_bits < params_.product_lsb) slow[r * n + j] = 1;
      }
    // Write C in the reference's order: the elements left to the reference adder may
    // trap, with the status the elements before them raised (the later chunks' rows of C
    // untouched).
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t i = first + r;
        double& c = C[i * ldc + j];
        if (slow[r * n + j] == 0) {
          c = result[r * n + j];
          flags |= element_flags[r * n + j];
          continue;
        }
        commit(ctx, flags);
        flags = 0;
        const ElementGuard element(ctx, static_cast<std::int64_t>(i * n + j),
                                   {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
        c = dot_gathering(ctx, k, A + i * lda, 1, B + j, ldb, c, flags);
      }
  }
  commit(ctx, flags);
}

void TensorCoreUnit::mma_4x4x4(Context& ctx, const double* A, const double* B, const double* C, double* D) const {
  std::copy(C, C + 16, D);
  gemm(ctx, 4, 4, 4, A, 4, B, 4, D, 4);
}

std::unique_ptr<MatrixUnit> make_tensor_core_unit(UnitKind preset, std::optional<Format> in,
                                                  std::optional<Format> out) {
  Format input = in.value_or(fp16());
  Format output = out.value_or(fp32());
  BlockFmaParams params = tensor_core_params(preset, input, output);
  return std::make_unique<TensorCoreUnit>(preset, std::move(input), std::move(output), params);
}

namespace detail {

bool select_product_adder(int implementation) {
  if (implementation != 0 && implementation != 1) return false;
  selected_product_adder.store(implementation, std::memory_order_relaxed);
  return true;
}

bool select_panel_adder(int implementation) {
  if (implementation != 0 && implementation != 1) return false;
#if EMU_SIMD
  if (implementation == 1 && !cpu_has_avx512()) return false;
#else
  if (implementation == 1) return false;
#endif
  selected_panel_adder.store(implementation, std::memory_order_relaxed);
  return true;
}

}  // namespace detail

}  // namespace emu
