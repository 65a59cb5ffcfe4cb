#include "nearest.hpp"

#include <cfenv>

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

void NearestOps::commit(Context& ctx) {
  if (flags_ != 0) ctx.raise_flags(flags_, "nearest", {});
  flags_ = 0;
}

}  // namespace emu
