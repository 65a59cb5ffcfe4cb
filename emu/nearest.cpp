#include "nearest.hpp"

#include <cfenv>
#include <cmath>

#include "simd.hpp"

namespace emu {

bool NearestOps::applies(const Context& ctx) {
#if EMU_SIMD
  const bool host = simd::host_rounds_to_nearest();
#else
  const bool host = std::fegetround() == FE_TONEAREST;
#endif
  return host && ctx.control.effective_rounding() == Rounding::rne &&
         ((ctx.control.counted | ctx.control.traps) & (INEXACT | UFLO)) == 0;
}

std::size_t NearestOps::first_not_value(const Format& f, const double* v, std::size_t from, std::size_t n) {
#if EMU_SIMD
  const bool half = f == fp16(), single = f == fp32();
  if (!half && !single) return from;
  std::size_t i = from;
  for (; i + 4 <= n; i += 4) {
    const __m256d x = _mm256_loadu_pd(v + i);
    if (!simd::every_lane(half ? simd::fp16_values(x) : simd::fp32_values(x))) break;
  }
  for (; i < n; ++i)
    if (!(std::isfinite(v[i]) && f.representable(v[i]))) return i;
  return n;
#else
  (void)f;
  (void)v;
  (void)n;
  return from;
#endif
}

void NearestOps::commit(Context& ctx) {
  if (flags_ != 0) ctx.raise_flags(flags_, "nearest", {});
  flags_ = 0;
}

}  // namespace emu
