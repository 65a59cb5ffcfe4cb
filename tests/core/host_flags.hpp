// The host CPU's IEEE exception flags as emu's: from fenv (fetestexcept) and from the
// SSE control and status register MXCSR (Intel SDM vol. 1, 10.2.3), for tests that use
// the CPU as an oracle.
#pragma once

#include <cfenv>

#include "emu/status.hpp"

namespace host_flags {

inline emu::Flags from_fenv(int fe) {
  emu::Flags f = 0;
  if (fe & FE_INEXACT) f |= emu::INEXACT;
  if (fe & FE_OVERFLOW) f |= emu::OFLO;
  if (fe & FE_UNDERFLOW) f |= emu::UFLO;
  if (fe & FE_INVALID) f |= emu::INV;
  if (fe & FE_DIVBYZERO) f |= emu::DIV0;
  return f;
}

// MXCSR's flag bits; 0x02 is DE (denormal operand), not an IEEE flag.
constexpr unsigned kMxcsrFlags = 0x3f;
constexpr unsigned kMxcsrInvalid = 0x01, kMxcsrDivZero = 0x04, kMxcsrOverflow = 0x08, kMxcsrUnderflow = 0x10,
                   kMxcsrInexact = 0x20;

inline emu::Flags from_mxcsr(unsigned mxcsr) {
  emu::Flags f = 0;
  if (mxcsr & kMxcsrInexact) f |= emu::INEXACT;
  if (mxcsr & kMxcsrOverflow) f |= emu::OFLO;
  if (mxcsr & kMxcsrUnderflow) f |= emu::UFLO;
  if (mxcsr & kMxcsrInvalid) f |= emu::INV;
  if (mxcsr & kMxcsrDivZero) f |= emu::DIV0;
  return f;
}

}  // namespace host_flags
