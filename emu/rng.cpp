#include "rng.hpp"

#include <cmath>
#include <numbers>

namespace emu {

Philox4x32::Block Philox4x32::block(std::array<std::uint32_t, 2> key, Block ctr) {
  // Constants from Salmon et al. (Random123): multipliers and Weyl key increments.
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{kM0} * ctr[0];
    const std::uint64_t p1 = std::uint64_t{kM1} * ctr[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

Philox4x32::Philox4x32(StreamId id)
    : key_{static_cast<std::uint32_t>(id.seed), static_cast<std::uint32_t>(id.seed >> 32)},
      lane_(id.lane),
      point_(id.point),
      replica_(id.replica) {}

std::uint64_t Philox4x32::next_u64() {
  if (used_ >= 4) {
    const Block counter = {static_cast<std::uint32_t>(block_index_),
                           static_cast<std::uint32_t>((block_index_ >> 32) & 0xFFFFu) | (lane_ << 16),
                           point_, replica_};
    buffer_ = block(key_, counter);
    ++block_index_;  // 2^48 blocks per stream: far beyond any experiment here
    used_ = 0;
  }
  const std::uint64_t v = std::uint64_t{buffer_[used_]} | (std::uint64_t{buffer_[used_ + 1]} << 32);
  used_ += 2;
  return v;
}

Xoroshiro128aox Xoroshiro128aox::from_prng_seed(std::uint32_t v) {
  const std::uint32_t nv = ~v;
  const std::uint64_t s0 = std::uint64_t{v} | (std::uint64_t{nv} << 32);
  const std::uint32_t lo = (v << 13) | (nv >> 19);
  const std::uint32_t hi = (nv << 13) | (v >> 19);
  const std::uint64_t s1 = std::uint64_t{lo} | (std::uint64_t{hi} << 32);
  return {s0, s1};
}

std::uint64_t Xoroshiro128aox::next_u64() {
  auto rotl = [](std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const std::uint64_t sx = s0_ ^ s1_;
  const std::uint64_t sa = s0_ & s1_;
  const std::uint64_t result = sx ^ (rotl(sa, 1) | rotl(sa, 2));  // the AOX output step
  s0_ = rotl(s0_, 55) ^ sx ^ (sx << 14);
  s1_ = rotl(sx, 36);
  return result;
}

std::uint32_t ipu_prng_seed(StreamId id) { return static_cast<std::uint32_t>(Philox4x32(id).next_u64()); }

// The expansion never gives the all-zero state (the LFSR's fixed point): s0 holds v and ~v.
Rng::Rng(StreamId id, RngKind kind)
    : Rng(kind, id, Xoroshiro128aox::from_prng_seed(kind == RngKind::ipu ? ipu_prng_seed(id) : 0)) {}

Rng Rng::ipu_from_prng_seed(std::uint32_t v) { return Rng(RngKind::ipu, StreamId{}, Xoroshiro128aox::from_prng_seed(v)); }

double Rng::normal() {
  double u1 = uniform();
  while (u1 == 0.0) u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace emu
