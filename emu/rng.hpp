// Random numbers whose values depend only on a stream name, never on threads or
// scheduling: a stream is (seed, point, replica, lane).
#pragma once

#include <array>
#include <cstdint>

#include "status.hpp"

namespace emu {

struct StreamId {
  std::uint64_t seed = 0;
  std::uint32_t point = 0;    // grid point index
  std::uint32_t replica = 0;  // repeat index
  std::uint16_t lane = 0;     // independent sub-stream within one run (e.g. data vs rounding)
};

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
// Key = seed; counter = (block index low 32 bits, block index high 16 bits | lane << 16,
// point, replica). Each stream has 2^48 blocks of 128 bits.
class Philox4x32 {
 public:
  using Block = std::array<std::uint32_t, 4>;
  static Block block(std::array<std::uint32_t, 2> key, Block counter);  // 10 rounds

  explicit Philox4x32(StreamId id = {});
  std::uint64_t next_u64();

 private:
  std::array<std::uint32_t, 2> key_;
  std::uint32_t lane_, point_, replica_;
  std::uint64_t block_index_ = 0;
  Block buffer_{};
  int used_ = 4;  // 32-bit words of buffer_ consumed
};

// The IPU's hardware generator (Hanlon and Felix, "A Fast Hardware Pseudorandom Number
// Generator Based on xoroshiro128", IEEE Trans. Computers 72(5), 2023): xoroshiro128
// state update with the AND-OR-XOR ("AOX") output function.
class Xoroshiro128aox {
 public:
  Xoroshiro128aox(std::uint64_t s0, std::uint64_t s1) : s0_(s0), s1_(s1) {}
  // The documented $PRNG_SEED expansion of a 32-bit seed v (32-bit arithmetic):
  //   s0 = v | (~v << 32)
  //   s1 = ((v << 13) | (~v >> 19)) | (((~v << 13) | (v >> 19)) << 32)
  static Xoroshiro128aox from_prng_seed(std::uint32_t v);
  std::uint64_t next_u64();
  std::uint64_t s0() const { return s0_; }
  std::uint64_t s1() const { return s1_; }

 private:
  std::uint64_t s0_, s1_;
};

// The 32-bit $PRNG_SEED value that an ipu Rng of stream `id` is seeded with: the low 32
// bits of the stream's first Philox output (Philox4x32(id).next_u64()). The hardware
// takes only 32 bits, so two distinct streams share a seed, and then the whole ipu
// sequence, with probability 2^-32 per pair (a sweep of 10^4 runs: about 1%).
std::uint32_t ipu_prng_seed(StreamId id);

// The source of random bits for stochastic rounding and experiments, seeded as the
// hardware would be: philox from the StreamId directly; ipu (xoroshiro128aox) through
// the documented $PRNG_SEED expansion, Xoroshiro128aox::from_prng_seed, of a 32-bit
// value: ipu_prng_seed(id) for a stream, or a value given by the user
// (Rng::ipu_from_prng_seed, as `emu round --rng ipu --seed S` does).
class Rng {
 public:
  explicit Rng(StreamId id = {}, RngKind kind = RngKind::philox);
  // An ipu Rng whose xoroshiro128aox state is the $PRNG_SEED expansion of v.
  static Rng ipu_from_prng_seed(std::uint32_t v);
  RngKind kind() const { return kind_; }
  std::uint64_t next_u64() { return kind_ == RngKind::philox ? philox_.next_u64() : ipu_.next_u64(); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1p-53; }
  // Standard normal (Box-Muller on two uniforms; deterministic for a stream).
  double normal();

 private:
  Rng(RngKind kind, StreamId id, Xoroshiro128aox ipu) : kind_(kind), philox_(id), ipu_(ipu) {}
  RngKind kind_;
  Philox4x32 philox_;
  Xoroshiro128aox ipu_;
};

}  // namespace emu
