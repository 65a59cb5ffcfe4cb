#include "cdna.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "round.hpp"

namespace emu {

namespace {

constexpr int kMaxGroup = 64;
constexpr int kFp32Emin = -126;  // c's exponent floor in the fused path

bool same_layout(const Format& f, const Format& preset) { return f.with_subnormals(true) == preset; }

// MFMA rounds to nearest even whatever the context says: its rounding is pinned while
// a dot runs (flags, overflow policy, tininess and traps stay the context's).
class NearestEven {
 public:
  explicit NearestEven(Context& ctx) : ctx_(ctx), rounding_(ctx.control.rounding), esr_(ctx.control.esr) {
    ctx.control.rounding = Rounding::rne;
    ctx.control.esr = false;
  }
  ~NearestEven() {
    ctx_.control.rounding = rounding_;
    ctx_.control.esr = esr_;
  }
  NearestEven(const NearestEven&) = delete;
  NearestEven& operator=(const NearestEven&) = delete;

 private:
  Context& ctx_;
  Rounding rounding_;
  bool esr_;
};

// v / 2^s rounded toward minus infinity (floor) or toward zero, s >= 0.
std::int64_t shift_down(std::int64_t v, int s, bool floor) {
  if (s == 0) return v;
  if (s >= 63) return floor && v < 0 ? -1 : 0;
  if (floor || v >= 0) return v >> s;  // arithmetic shift: floor
  return -((-v) >> s);
}

// The exponent the fused adder aligns a non-zero x with: its own, clamped at emin.
int aligned_exponent(double x, int emin) { return std::max(std::ilogb(std::fabs(x)), emin); }

// x with its 13 low binary32 fraction bits cleared (tf32, toward zero).
double truncate_to_tf32(double x) {
  if (!std::isfinite(x) || x == 0) return x;
  const int e = std::max(std::ilogb(std::fabs(x)), kFp32Emin);
  const double unit = std::ldexp(1.0, e - 10);
  return std::trunc(x / unit) * unit;
}

std::atomic<bool> fast_gemm{true};  // detail::select_cdna_fast_gemm

// ---- The fast passes of serial_gemm -----------------------------------------------------
// They compute kLanes columns of a row of C at once (the compiler vectorises the lane
// loops) on operands checked and decoded once per call, and vouch for an element only
// where its every intermediate value is a zero or a normal fp32 number (no flush, no
// underflow, no overflow, no special value can have happened): then its only possible
// flag is INEXACT, and its value and INEXACT are dot()'s. Every other element is
// recomputed by dot().
constexpr std::size_t kLanes = 16;
constexpr int kZeroExponent = -(1 << 20);      // a zero factor's: its product never sets E
constexpr int kKeptBits = 24, kSumBits = 31, kCBits = 24;  // the presets' fused adder (the fast one's)

// 1 where a rounded fp32 result may have been tiny or may have overflowed: not zero and
// not strictly between 2^-126 and the largest finite value (a result rounded up to 2^-126
// was tiny before rounding: UFLO).
inline std::uint32_t outside_normal(float v) {
  const float magnitude = std::fabs(v);
  return static_cast<std::uint32_t>(!(magnitude < FLT_MAX)) |
         (static_cast<std::uint32_t>(magnitude <= 0x1p-126f) & static_cast<std::uint32_t>(magnitude != 0));
}

// x + y rounded to nearest even, as fp32 does it; `inexact` learns from the TwoSum error
// term whether the sum was rounded, `bad` whether it left the normal range.
inline float add_lane(float x, float y, std::uint32_t& bad, std::uint32_t& inexact) {
  const float s = x + y;
  const float y_part = s - x;
  const float error = (x - (s - y_part)) + (y - y_part);
  inexact |= static_cast<std::uint32_t>(error != 0);
  bad |= outside_normal(s);
  return s;
}

// 2^e as a double, -1022 <= e <= 1023.
inline double power_of_two(int e) { return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52); }

// Operands decoded once per GEMM call. Pairwise: values as floats (flushed where the
// datapath flushes). Fused: |x| = magnitude * 2^(exponent - fraction bits), exponent
// the factor's clamped at its format's emin (kZeroExponent for a zero), sign 0 or -1.
// B is stored by tiles of kLanes columns, each k x kLanes row-major (a tile stays in
// cache while the rows of A pass), its columns padded with zeros to whole tiles.
struct Decoded {
  std::size_t k = 0, n = 0, columns = 0;  // columns: n rounded up to kLanes
  std::vector<float> a, b;                // pairwise: A m x k, B by tiles
  // Where B's (p, j) is: tile j / kLanes, row p, lane j % kLanes.
  std::size_t b_at(std::size_t p, std::size_t j) const { return ((j / kLanes) * k + p) * kLanes + j % kLanes; }
  std::vector<std::int32_t> a_magnitude, a_exponent, a_sign, b_magnitude, b_exponent, b_sign;  // fused
  int shift = 0;                          // fused: 24 - A's fraction bits - B's
  // Per row of A and column of B: a NaN or infinity there; the smallest non-zero
  // magnitude (pairwise: whether a product may leave fp32's normal range below).
  std::vector<std::uint8_t> row_special, column_special;
  std::vector<double> row_min, column_min;
};

class CdnaUnit final : public MatrixUnit {
 public:
  CdnaUnit(UnitKind kind, Format in, Format in_b, Format out, CdnaParams params)
      : kind_(kind), in_(std::move(in)), in_b_(std::move(in_b)), out_(std::move(out)), params_(params) {
    if (params_.group_size < 1 || params_.group_size > kMaxGroup)
      throw std::invalid_argument("AMD MFMA: the group size must be 1.." + std::to_string(kMaxGroup));
    for (int bits : {params_.kept_fraction_bits, params_.sum_fraction_bits, params_.c_fraction_bits})
      if (bits < 1 || bits > 40) throw std::invalid_argument("AMD MFMA: kept fraction bits must be 1..40");
    if (params_.sum_fraction_bits < params_.kept_fraction_bits || params_.sum_fraction_bits < params_.c_fraction_bits)
      throw std::invalid_argument("AMD MFMA: S's kept bits must be at least the products' and c's");
  }

  UnitKind kind() const override { return kind_; }
  const Format& input_format() const override { return in_; }
  const Format& b_input_format() const override { return in_b_; }
  const Format& output_format() const override { return out_; }

  double dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b, std::size_t sb,
             double c) const override {
    const NearestEven rne(ctx);
    const auto group = static_cast<std::size_t>(params_.group_size);
    double x[kMaxGroup], y[kMaxGroup];
    if (params_.flush_subnormals) c = flush_input(c, out_);
    for (std::size_t first = 0; first < k; first += group) {
      const std::size_t n = std::min(group, k - first);
      for (std::size_t i = 0; i < n; ++i) {
        x[i] = operand(a[(first + i) * sa], in_);
        y[i] = operand(b[(first + i) * sb], in_b_);
      }
      switch (params_.path) {
        case CdnaPath::fma_chain:
          for (std::size_t i = 0; i < n; ++i) c = ctx.fma(out_, x[i], y[i], c);
          break;
        case CdnaPath::pairwise: c = flush(ctx.add(out_, c, pairwise(ctx, x, y, n))); break;
        case CdnaPath::fused: c = fused(ctx, x, y, n, c); break;
      }
    }
    return c;
  }

 protected:
  // The fast passes where they apply (Decoded above), else one dot per element. Elements
  // are finished in row-major order with their element set; those the pass vouches for
  // take its result and raise its INEXACT (through dot() where the control counts or
  // traps it), so results, flags, counts, a trap and the elements written before it are
  // dot()'s element by element. An operand dot() would refuse sends the whole call
  // through dot(), which throws where it would.
  void serial_gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
                   const double* B, std::size_t ldb, double* C, std::size_t ldc) const override {
    Decoded d;
    if (!fast_gemm.load(std::memory_order_relaxed) || !decode(d, m, n, k, A, lda, B, ldb)) {
      MatrixUnit::serial_gemm(ctx, m, n, k, A, lda, B, ldb, C, ldc);
      return;
    }
    const Flags watched = ctx.control.counted | ctx.control.traps;
    constexpr std::size_t kBlock = 32;  // rows computed per pass over B's tiles
    const std::size_t block = std::min(m, kBlock);
    std::vector<float> values(block * d.columns);
    std::vector<std::uint32_t> bads(block * d.columns), inexacts(block * d.columns);
    for (std::size_t i0 = 0; i0 < m; i0 += kBlock) {
      const std::size_t rows = std::min(kBlock, m - i0);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t j = 0; j < d.columns; ++j) {
          const double c = j < n ? C[(i0 + r) * ldc + j] : 0.0;
          const auto cf = static_cast<float>(c);
          const std::size_t at = r * d.columns + j;
          bads[at] = static_cast<std::uint32_t>(!std::isfinite(c) || static_cast<double>(cf) != c);
          values[at] = bads[at] != 0 ? 0.0f : params_.flush_subnormals ? static_cast<float>(flush_input(cf, out_)) : cf;
          inexacts[at] = 0;
        }
      for (std::size_t j0 = 0; j0 < d.columns; j0 += kLanes)
        for (std::size_t r = 0; r < rows; ++r) {
          const std::size_t at = r * d.columns + j0;
          if (params_.path == CdnaPath::pairwise)
            pairwise_tile(d, i0 + r, j0, values.data() + at, bads.data() + at, inexacts.data() + at);
          else
            fused_tile(d, i0 + r, j0, values.data() + at, bads.data() + at, inexacts.data() + at);
        }
      for (std::size_t r = 0; r < rows; ++r)
        finish_row(ctx, d, i0 + r, n, k, A, lda, B, ldb, C + (i0 + r) * ldc, watched, values.data() + r * d.columns,
                   bads.data() + r * d.columns, inexacts.data() + r * d.columns);
    }
  }

 private:
  // Row i of C from the fast pass's values, in column order: dot() for the elements the
  // pass does not vouch for.
  void finish_row(Context& ctx, const Decoded& d, std::size_t i, std::size_t n, std::size_t k, const double* A,
                  std::size_t lda, const double* B, std::size_t ldb, double* row, Flags watched, const float* value,
                  const std::uint32_t* bad, const std::uint32_t* inexact) const {
    for (std::size_t j = 0; j < n; ++j) {
      const Flags flags = inexact[j] != 0 ? INEXACT : 0;
      const bool vouched = bad[j] == 0 && d.row_special[i] == 0 && d.column_special[j] == 0 &&
                           (params_.path != CdnaPath::pairwise || d.row_min[i] * d.column_min[j] >= 0x1p-126) &&
                           (flags & watched) == 0;
      if (!vouched) {
        const ElementGuard element(ctx, static_cast<std::int64_t>(i * n + j),
                                   {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
        row[j] = dot(ctx, k, A + i * lda, 1, B + j, ldb, row[j]);
        continue;
      }
      if (flags != 0) ctx.raise_flags(flags, "mma", {});
      row[j] = value[j];
    }
  }

  // Whether operand() takes v (it throws otherwise).
  bool takes(double v, const Format& f) const {
    return !std::isfinite(v) || (params_.truncate_to_tf32 ? fp32() : f).representable(v);
  }

  // The fast passes' operands (Decoded); false where the datapath or its parameters have
  // no fast pass, or an operand would be refused.
  bool decode(Decoded& d, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
              const double* B, std::size_t ldb) const {
    const bool pairwise = params_.path == CdnaPath::pairwise;
    if (pairwise) {
      // Products exact in fp32 (fma(a, b, +0) is a * b + 0 there), values within its range.
      if (in_.precision() + in_b_.precision() > 24 || in_.exponent_bits() > 8 || in_b_.exponent_bits() > 8 ||
          !same_layout(out_, fp32()))
        return false;
    } else if (params_.path == CdnaPath::fused) {
      d.shift = kKeptBits - in_.fraction_bits() - in_b_.fraction_bits();
      if (params_.kept_fraction_bits != kKeptBits || params_.sum_fraction_bits != kSumBits ||
          params_.c_fraction_bits != kCBits || !params_.floor_alignment || params_.group_size > 16 || d.shift < 0 ||
          !same_layout(out_, fp32()))
        return false;
    } else {
      return false;
    }
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t p = 0; p < k; ++p)
        if (!takes(A[i * lda + p], in_)) return false;
    for (std::size_t p = 0; p < k; ++p)
      for (std::size_t j = 0; j < n; ++j)
        if (!takes(B[p * ldb + j], in_b_)) return false;

    d.k = k;
    d.n = n;
    d.columns = (n + kLanes - 1) / kLanes * kLanes;
    d.row_special.assign(m, 0);
    d.column_special.assign(d.columns, 0);
    d.row_min.assign(m, INFINITY);
    d.column_min.assign(d.columns, INFINITY);
    auto note = [](double x, std::uint8_t& special, double& smallest) {
      if (!std::isfinite(x)) special = 1;
      else if (x != 0) smallest = std::min(smallest, std::fabs(x));
    };
    if (pairwise) {
      d.a.resize(m * k);
      d.b.assign(k * d.columns, 0.0f);  // zeros, +0 products, in the padding
    } else {
      d.a_magnitude.resize(m * k);
      d.a_exponent.resize(m * k);
      d.a_sign.resize(m * k);
      d.b_magnitude.assign(k * d.columns, 0);
      d.b_exponent.assign(k * d.columns, kZeroExponent);
      d.b_sign.assign(k * d.columns, 0);
    }
    // One operand into slot `at`; false where the fused decoding does not hold exactly.
    auto put = [&](double v, const Format& f, bool is_a, std::size_t at, std::uint8_t& special, double& smallest) {
      const double x = operand(v, f);
      note(x, special, smallest);
      if (pairwise) {
        (is_a ? d.a : d.b)[at] = static_cast<float>(x);
        return true;
      }
      auto& magnitude = is_a ? d.a_magnitude : d.b_magnitude;
      auto& exponent = is_a ? d.a_exponent : d.b_exponent;
      auto& sign = is_a ? d.a_sign : d.b_sign;
      sign[at] = std::signbit(x) ? -1 : 0;
      if (x == 0 || !std::isfinite(x)) {
        magnitude[at] = 0;
        exponent[at] = kZeroExponent;
        return true;
      }
      const int e = aligned_exponent(x, f.emin());
      const double units = std::ldexp(std::fabs(x), f.fraction_bits() - e);
      if (units != std::trunc(units) || units >= std::ldexp(1.0, f.fraction_bits() + 1)) return false;
      magnitude[at] = static_cast<std::int32_t>(units);
      exponent[at] = e;
      return true;
    };
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t p = 0; p < k; ++p)
        if (!put(A[i * lda + p], in_, true, i * k + p, d.row_special[i], d.row_min[i])) return false;
    for (std::size_t p = 0; p < k; ++p)
      for (std::size_t j = 0; j < n; ++j)
        if (!put(B[p * ldb + j], in_b_, false, d.b_at(p, j), d.column_special[j], d.column_min[j])) return false;
    return true;
  }

  // Pairwise steps 2 and 3 on products [0, count) of a group (A's factors a[0..count),
  // B's in rows of b, stride ld), kLanes columns at once.
  static void pairwise_lanes(const float* a, const float* b, std::size_t ld, std::size_t count, float* out,
                             std::uint32_t* bad, std::uint32_t* inexact) {
    if (count == 1) {
      for (std::size_t l = 0; l < kLanes; ++l) {
        out[l] = a[0] * b[l] + 0.0f;  // exact: fma(a, b, +0), a zero product +0
        bad[l] |= outside_normal(out[l]);
      }
      return;
    }
    const std::size_t half = count / 2;
    float left[kLanes], right[kLanes];
    pairwise_lanes(a, b, ld, half, left, bad, inexact);
    pairwise_lanes(a + half, b + half * ld, ld, count - half, right, bad, inexact);
    for (std::size_t l = 0; l < kLanes; ++l) out[l] = add_lane(left[l], right[l], bad[l], inexact[l]);
  }

  // Row i, columns [j0, j0 + kLanes): acc holds c (flushed) and becomes the result.
  void pairwise_tile(const Decoded& d, std::size_t i, std::size_t j0, float* acc, std::uint32_t* bad,
                     std::uint32_t* inexact) const {
    const auto group = static_cast<std::size_t>(params_.group_size);
    const float* a = d.a.data() + i * d.k;
    float sum[kLanes];
    for (std::size_t first = 0; first < d.k; first += group) {
      pairwise_lanes(a + first, d.b.data() + d.b_at(first, j0), kLanes, std::min(group, d.k - first), sum,
                     bad, inexact);
      for (std::size_t l = 0; l < kLanes; ++l) acc[l] = add_lane(acc[l], sum[l], bad[l], inexact[l]);
    }
  }

  // Fused steps 2 and 3 over products start, start + step, ... < count of the group at
  // `first`: the cut sum S in units of 2^(E - 24) and E per lane.
  void cut_sum_lanes(const Decoded& d, std::size_t i, std::size_t j0, std::size_t first, std::size_t count,
                     std::size_t start, std::size_t step, std::int32_t* sum, std::int32_t* e,
                     std::uint32_t* lost) const {
    const std::size_t at_a = i * d.k + first, at_b = d.b_at(first, j0);
    for (std::size_t l = 0; l < kLanes; ++l) {
      e[l] = 2 * kZeroExponent;
      sum[l] = 0;
    }
    for (std::size_t t = start; t < count; t += step) {
      const std::int32_t ea = d.a_exponent[at_a + t];
      const std::int32_t* eb = d.b_exponent.data() + at_b + t * kLanes;
      for (std::size_t l = 0; l < kLanes; ++l) e[l] = std::max(e[l], ea + eb[l]);
    }
    for (std::size_t t = start; t < count; t += step) {
      const std::int32_t ea = d.a_exponent[at_a + t], ma = d.a_magnitude[at_a + t], sa = d.a_sign[at_a + t];
      const std::size_t row = at_b + t * kLanes;
      const std::int32_t *eb = d.b_exponent.data() + row, *mb = d.b_magnitude.data() + row,
                         *sb = d.b_sign.data() + row;
      for (std::size_t l = 0; l < kLanes; ++l) {
        const std::int32_t product = (ma * mb[l]) << d.shift;  // below 2^26
        const std::int32_t below = std::min(e[l] - (ea + eb[l]), 31);
        const std::int32_t cut = product >> below;  // toward zero: a magnitude
        lost[l] |= static_cast<std::uint32_t>((cut << below) != product);
        const std::int32_t sign = sa ^ sb[l];
        sum[l] += (cut ^ sign) - sign;
      }
    }
  }

  // Row i, columns [j0, j0 + kLanes): acc holds c and becomes the result. GCC vectorises
  // step 4's lanes only where it may evaluate a floating-point operation of a branch not
  // taken (no-trapping-math: this code reads no floating-point exception flags).
  void fused_tile(const Decoded& d, std::size_t i, std::size_t j0, float* acc, std::uint32_t* bad,
                  std::uint32_t* inexact) const {
    const auto group = static_cast<std::size_t>(params_.group_size);
    std::int32_t sum[kLanes], e[kLanes], odd_sum[kLanes], odd_e[kLanes];
    std::uint32_t lost[kLanes];
    for (std::size_t first = 0; first < d.k; first += group) {
      const std::size_t count = std::min(group, d.k - first);
      for (std::size_t l = 0; l < kLanes; ++l) lost[l] = 0;
      if (!params_.split_halves) {
        cut_sum_lanes(d, i, j0, first, count, 0, 1, sum, e, lost);
      } else {
        cut_sum_lanes(d, i, j0, first, count, 0, 2, sum, e, lost);
        cut_sum_lanes(d, i, j0, first, count, 1, 2, odd_sum, odd_e, lost);
        for (std::size_t l = 0; l < kLanes; ++l) {  // each half floored to 2^(E - 24)
          const std::int32_t top = std::max(e[l], odd_e[l]);
          const std::int32_t s0 = std::min(top - e[l], 31), s1 = std::min(top - odd_e[l], 31);
          const std::int32_t even = sum[l] >> s0, odd = odd_sum[l] >> s1;
          lost[l] |= static_cast<std::uint32_t>((even << s0) != sum[l]) | static_cast<std::uint32_t>((odd << s1) != odd_sum[l]);
          sum[l] = even + odd;
          e[l] = top;
        }
      }
      const bool split = params_.split_halves;
      std::int32_t s_units[kLanes], s_scale[kLanes], c_lanes[kLanes], m_lanes[kLanes];
      std::int32_t acc_bits[kLanes];
      std::memcpy(acc_bits, acc, sizeof acc_bits);
      for (std::size_t l = 0; l < kLanes; ++l) {  // int32 lanes (vectorised)
        // Step 4: c = cm * 2^(ec - 23), ec clamped at -126; M = max(E, ec).
        const std::int32_t c_bits = acc_bits[l];
        const std::int32_t field = (c_bits >> 23) & 0xff;
        const std::int32_t cm = (c_bits & 0x7fffff) | (field != 0 ? 1 << 23 : 0);
        const std::int32_t ec = field != 0 ? field - 127 : kFp32Emin;
        const std::int32_t c_sign = c_bits >> 31;
        const std::int32_t m = std::max(e[l], ec);
        // S in units of 2^(M - 31): S * 2^(7 - (M - E)) where that is an integer, else
        // floored.
        const std::int32_t up = 7 - (m - e[l]);
        const std::int32_t down = std::min(std::max(-up, 0), 31);
        const std::int32_t s_floored = sum[l] >> down;
        lost[l] |= static_cast<std::uint32_t>((s_floored << down) != sum[l]);
        s_units[l] = s_floored;
        s_scale[l] = 1 << std::max(up, 0);
        m_lanes[l] = m;
        // c in units of 2^(M - 24), floored: cm * 2^(1 + ec - M); fp8 drops a c below M - 25.
        const std::int32_t c_signed = (cm ^ c_sign) - c_sign;
        const std::int32_t c_down = std::min(m - ec - 1, 31);
        const std::int32_t c_floored = c_signed >> std::max(c_down, 0);
        const std::int32_t kept = -static_cast<std::int32_t>(!split | (ec >= m - (kCBits + 1)));  // 0: dropped
        const std::int32_t c_cut = static_cast<std::int32_t>(c_down < 0) * c_signed * 2 +
                                   static_cast<std::int32_t>(c_down >= 0) * c_floored;
        const std::int32_t c_units = c_cut & kept;
        lost[l] |= static_cast<std::uint32_t>((c_units << std::max(c_down, 0)) != c_signed) &
                   static_cast<std::uint32_t>(c_down >= 0);  // dropped: c_down >= 25
        c_lanes[l] = c_units;
      }
      for (std::size_t l = 0; l < kLanes; ++l) {
        // Step 5: exact in double (integers below 2^40), one rounding into fp32. A group
        // without a non-zero product (S = 0, E far below, M = ec) gives c exactly, +0 for
        // -0, as the datapath does.
        const double total = static_cast<double>(s_units[l]) * static_cast<double>(s_scale[l]) +
                             static_cast<double>(c_lanes[l]) * (1 << (kSumBits - kCBits));
        const double exact = total * power_of_two(m_lanes[l] - kSumBits);
        const auto rounded = static_cast<float>(exact);
        // Compared as bit patterns: integer lanes, which GCC vectorises (floating-point
        // comparisons may trap, and it keeps them in branches).
        const auto exact_bits = std::bit_cast<std::uint64_t>(exact);
        const std::uint32_t group_lost =
            lost[l] | static_cast<std::uint32_t>(std::bit_cast<std::uint64_t>(static_cast<double>(rounded)) != exact_bits);
        // A product of 2^128 or more is an infinity there (a special group): dot() sees to it.
        // Judged on the exact value: one that rounds to zero or up to 2^-126 was tiny.
        const auto magnitude = static_cast<std::int64_t>(exact_bits & ~(std::uint64_t{1} << 63));
        const std::int32_t rounded_magnitude = std::bit_cast<std::int32_t>(rounded) & 0x7fffffff;
        bad[l] |= static_cast<std::uint32_t>(rounded_magnitude >= std::bit_cast<std::int32_t>(FLT_MAX)) |
                  (static_cast<std::uint32_t>(magnitude <= std::bit_cast<std::int64_t>(0x1p-126)) &
                   static_cast<std::uint32_t>(magnitude != 0)) |
                  static_cast<std::uint32_t>(e[l] >= 126);
        inexact[l] |= group_lost;
        acc[l] = rounded;
      }
    }
  }

  // An input as the datapath takes it: checked against its operand's format f (xf32
  // takes any fp32 value and truncates it), flushed where the datapath flushes.
  double operand(double v, const Format& f) const {
    if (params_.truncate_to_tf32) {
      if (std::isfinite(v) && !fp32().representable(v))
        throw std::invalid_argument(unit_kind_name(kind_) + std::string(": ") + std::to_string(v) +
                                    " is not an fp32 value");
      return truncate_to_tf32(v);
    }
    if (std::isfinite(v) && !f.representable(v))
      throw std::invalid_argument(unit_kind_name(kind_) + std::string(": ") + std::to_string(v) + " is not an " +
                                  f.name() + " value");
    return params_.flush_subnormals ? flush_input(v, f) : v;
  }

  // Pairwise step 1: a subnormal input (or a zero of either sign) becomes +0.
  static double flush_input(double v, const Format& f) { return std::fabs(v) < std::ldexp(1.0, f.emin()) ? 0.0 : v; }
  // The flush after pairwise steps 2-4: below 2^-126, a zero of the same sign.
  double flush(double v) const {
    if (!params_.flush_subnormals || !(std::fabs(v) < std::ldexp(1.0, fp32().emin()))) return v;
    return std::copysign(0.0, v);
  }

  // Pairwise steps 2 and 3 on n >= 1 products.
  double pairwise(Context& ctx, const double* x, const double* y, std::size_t n) const {
    if (n == 1) return flush(ctx.fma(fp32(), x[0], y[0], 0.0));
    const std::size_t half = n / 2;
    const double left = pairwise(ctx, x, y, half);
    const double right = pairwise(ctx, x + half, y + half, n - half);
    return flush(ctx.add(fp32(), left, right));
  }

  // A fused group with a NaN or infinite operand, product or c (see the header).
  double fused_special(Context& ctx, const double* x, const double* y, std::size_t n, double c, bool& handled) const {
    bool nan = std::isnan(c), invalid = false, pos = c == INFINITY, neg = c == -INFINITY;
    for (std::size_t i = 0; i < n; ++i) {
      if (std::isnan(x[i]) || std::isnan(y[i])) {
        nan = true;
      } else if ((std::isinf(x[i]) && y[i] == 0) || (std::isinf(y[i]) && x[i] == 0)) {
        invalid = true;
      } else {
        const double p = x[i] * y[i];
        if (std::fabs(p) >= 0x1p128) (p > 0 ? pos : neg) = true;
      }
    }
    invalid = invalid || (pos && neg);
    handled = nan || invalid || pos || neg;
    const double quiet_nan = std::numeric_limits<double>::quiet_NaN();
    if (invalid && !nan) ctx.raise_flags(INV, "mma", {}, quiet_nan);
    if (nan || invalid) return quiet_nan;
    return pos ? INFINITY : -INFINITY;
  }

  // Fused steps 2 and 3 over the products i = first, first + step, ... < n: their cut
  // sum in units of 2^(exp - kept); exp < kNone where every product is zero.
  static constexpr int kNone = std::numeric_limits<int>::min() / 2;
  std::int64_t cut_sum(const double* x, const double* y, std::size_t n, std::size_t first, std::size_t step, int& exp,
                       bool& lost) const {
    const int emin_a = in_.emin(), emin_b = in_b_.emin();
    exp = kNone;
    for (std::size_t i = first; i < n; i += step)
      if (x[i] != 0 && y[i] != 0) exp = std::max(exp, aligned_exponent(x[i], emin_a) + aligned_exponent(y[i], emin_b));
    if (exp == kNone) return 0;
    std::int64_t sum = 0;
    for (std::size_t i = first; i < n; i += step) {
      // Exact: the product has at most 22 significant bits and lies below 2^(exp + 2).
      const double scaled = std::ldexp(x[i] * y[i], params_.kept_fraction_bits - exp);
      const double cut = std::trunc(scaled);
      lost = lost || cut != scaled;
      sum += static_cast<std::int64_t>(cut);
    }
    return sum;
  }

  double fused(Context& ctx, const double* x, const double* y, std::size_t n, double c) const {
    bool special = false;
    const double s = fused_special(ctx, x, y, n, c, special);
    if (special) return s;
    const bool floor = params_.floor_alignment;
    const int kept = params_.kept_fraction_bits, sum_bits = params_.sum_fraction_bits, c_bits = params_.c_fraction_bits;
    bool lost = false;

    // Step 3: S in units of 2^(E - kept).
    int e = kNone;
    std::int64_t sum = 0;
    if (!params_.split_halves) {
      sum = cut_sum(x, y, n, 0, 1, e, lost);
    } else {
      int e0 = kNone, e1 = kNone;
      const std::int64_t s0 = cut_sum(x, y, n, 0, 2, e0, lost), s1 = cut_sum(x, y, n, 1, 2, e1, lost);
      e = std::max(e0, e1);
      for (auto [part, pe] : {std::pair{s0, e0}, std::pair{s1, e1}}) {
        if (pe == kNone) continue;
        const std::int64_t aligned = shift_down(part, e - pe, floor);
        lost = lost || (aligned << std::min(e - pe, 62)) != part;
        sum += aligned;
      }
    }
    if (e == kNone) return c == 0 ? 0.0 : c;  // no non-zero product: c as it is (+0 for -0)

    // Step 4: S and c floored against M, in units of 2^(M - sum_bits).
    const int ec = c == 0 ? kFp32Emin : aligned_exponent(c, kFp32Emin);
    const int m = std::max(e, ec);
    const int shift = (e - kept) - (m - sum_bits);
    std::int64_t total = 0;
    if (shift >= 0) {
      total = sum << shift;
    } else {
      total = shift_down(sum, -shift, floor);
      lost = lost || (total << std::min(-shift, 62)) != sum;
    }
    std::int64_t c_units = 0;
    if (c != 0 && !(params_.split_halves && ec < m - (c_bits + 1))) {
      const double scaled = std::ldexp(c, c_bits - m);  // exact: c has 24 bits at most
      const double cut = floor ? std::floor(scaled) : std::trunc(scaled);
      lost = lost || cut != scaled;
      c_units = static_cast<std::int64_t>(cut);
    } else {
      lost = lost || c != 0;
    }
    total += c_units << (sum_bits - c_bits);

    // Step 5: one rounding into fp32. Exact in double: |total| < 2^40.
    const Flags truncated = lost ? INEXACT : 0;
    if (total == 0) {
      if (truncated != 0) ctx.raise_flags(truncated, "mma", {}, 0.0);
      return 0.0;
    }
    const double value = std::ldexp(static_cast<double>(total), m - sum_bits);
    return ctx.round_with(Rounding::rne, out_, Exact{value}, "mma", {}, truncated);
  }

  UnitKind kind_;
  Format in_, in_b_, out_;  // A's, B's (in_ but for mixed inputs), the output's
  CdnaParams params_;
};

CdnaParams fused_params(int instruction_k, int group_size) {
  CdnaParams p;
  p.path = CdnaPath::fused;
  p.instruction_k = instruction_k;
  p.group_size = group_size;
  return p;
}

CdnaParams pairwise_params(int instruction_k, int group_size, bool flush) {
  CdnaParams p;
  p.path = CdnaPath::pairwise;
  p.instruction_k = instruction_k;
  p.group_size = group_size;
  p.flush_subnormals = flush;
  return p;
}

}  // namespace

namespace detail {
void select_cdna_fast_gemm(bool fast) { fast_gemm.store(fast, std::memory_order_relaxed); }
}  // namespace detail

bool is_cdna_unit(UnitKind unit) {
  return unit == UnitKind::mi100 || unit == UnitKind::mi250x || unit == UnitKind::mi300x;
}

bool takes_mixed_inputs(UnitKind unit) { return unit == UnitKind::mi300x; }

CdnaParams cdna_params(UnitKind unit, const Format& in, const Format& out) {
  if (!is_cdna_unit(unit))
    throw std::invalid_argument(std::string("unit '") + unit_kind_name(unit) + "' is no AMD matrix core");
  const std::string name = unit_kind_name(unit);
  const bool cdna1 = unit == UnitKind::mi100, cdna2 = unit == UnitKind::mi250x, cdna3 = unit == UnitKind::mi300x;
  const bool fp64_in = same_layout(in, fp64());
  CdnaParams p;
  if (same_layout(in, fp16())) {
    p = cdna3 ? fused_params(16, 8) : pairwise_params(16, 4, cdna2);
  } else if (same_layout(in, bf16())) {
    p = cdna3 ? fused_params(16, 8) : cdna2 ? pairwise_params(16, 4, true) : pairwise_params(8, 2, false);
  } else if (same_layout(in, fp32()) || (fp64_in && !cdna1)) {
    p.path = CdnaPath::fma_chain;  // v_mfma_f32_16x16x4f32, v_mfma_f64_16x16x4f64
  } else if (cdna3 && same_layout(in, tf32())) {
    p = fused_params(8, 4);
    p.truncate_to_tf32 = true;
  } else if (cdna3 && (same_layout(in, fp8_e4m3fnuz()) || same_layout(in, fp8_e5m2fnuz()))) {
    p = fused_params(32, 16);
    p.split_halves = true;
  } else {
    const char* accepted = cdna1   ? "fp16, bf16, fp32"
                           : cdna2 ? "fp16, bf16, fp32, fp64"
                                   : "fp16, bf16, tf32, fp8-e4m3fnuz, fp8-e5m2fnuz, fp32, fp64";
    throw std::invalid_argument(name + " matrix cores do not take " + in.name() + " inputs (they take " + accepted +
                                ")");
  }
  if (!same_layout(out, fp64_in ? fp64() : fp32()))
    throw std::invalid_argument(name + " matrix cores do not give " + out.name() + " output for " + in.name() +
                                " inputs (" + (fp64_in ? "fp64" : "fp32") + ")");
  return p;
}

CdnaParams cdna_params(UnitKind unit, const Format& a, const Format& b, const Format& out) {
  if (same_layout(a, b)) return cdna_params(unit, a, out);
  const std::string name = unit_kind_name(unit);
  if (!takes_mixed_inputs(unit))
    throw std::invalid_argument(name + " matrix cores take one input format for A and B");
  const bool e4m3_a = same_layout(a, fp8_e4m3fnuz()), e5m2_a = same_layout(a, fp8_e5m2fnuz());
  const bool e4m3_b = same_layout(b, fp8_e4m3fnuz()), e5m2_b = same_layout(b, fp8_e5m2fnuz());
  if (!((e4m3_a && e5m2_b) || (e5m2_a && e4m3_b)))
    throw std::invalid_argument(name + " matrix cores mix fp8-e4m3fnuz with fp8-e5m2fnuz only (either as A), not " +
                                a.name() + " with " + b.name());
  return cdna_params(unit, a, out);  // the fp8 path: one decoder per operand (CdnaUnit)
}

std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, Format in, Format in_b, Format out, CdnaParams params) {
  return std::make_unique<CdnaUnit>(unit, std::move(in), std::move(in_b), std::move(out), params);
}

std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, std::optional<Format> in, std::optional<Format> out) {
  Format input = in.value_or(fp16());
  Format output = out.value_or(same_layout(input, fp64()) ? fp64() : fp32());
  const CdnaParams params = cdna_params(unit, input, output);
  return make_cdna_unit(unit, input, input, std::move(output), params);
}

std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, Format a, Format b, std::optional<Format> out) {
  if (same_layout(a, b)) return make_cdna_unit(unit, std::optional<Format>(std::move(a)), out);
  Format output = out.value_or(fp32());
  const CdnaParams params = cdna_params(unit, a, b, output);
  return make_cdna_unit(unit, std::move(a), std::move(b), std::move(output), params);
}

}  // namespace emu
