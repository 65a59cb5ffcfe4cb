// Random numbers: Philox4x32-10 known answers from Random123, the stream layout
// documented in emu/rng.hpp, and xoroshiro128aox against a reference written here from
// the published algorithm.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "emu/rng.hpp"

namespace {

// Xoroshiro128aox as published (Hanlon and Felix, "A Fast Hardware Pseudorandom Number
// Generator Based on xoroshiro128", IEEE Trans. Computers 72(5), 2023): the xoroshiro128
// state update (a = 55, b = 14, c = 36) with the AND-OR-XOR output function.
struct ReferenceAox {
  std::uint64_t s0, s1;
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t next() {
    const std::uint64_t sx = s0 ^ s1;
    const std::uint64_t sa = s0 & s1;
    const std::uint64_t out = sx ^ (rotl(sa, 1) | rotl(sa, 2));
    s0 = rotl(s0, 55) ^ sx ^ (sx << 14);
    s1 = rotl(sx, 36);
    return out;
  }
  // The IPU's $PRNG_SEED expansion of a 32-bit value v, in 32-bit arithmetic:
  // s0 = v | (~v << 32); s1 = ((v << 13) | (~v >> 19)) | (((~v << 13) | (v >> 19)) << 32).
  static ReferenceAox from_seed(std::uint32_t v) {
    const std::uint32_t nv = ~v;
    const std::uint32_t s1_low = (v << 13) | (nv >> 19);
    const std::uint32_t s1_high = (nv << 13) | (v >> 19);
    return {std::uint64_t{v} | (std::uint64_t{nv} << 32), std::uint64_t{s1_low} | (std::uint64_t{s1_high} << 32)};
  }
};

std::vector<std::uint64_t> first(emu::Rng rng, int n) {
  std::vector<std::uint64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(rng.next_u64());
  return v;
}

}  // namespace

TEST_CASE("Philox4x32-10 reproduces Random123's known-answer vectors", "[rng]") {
  // Random123 1.09, tests/kat_vectors, "philox4x32 10" lines (counter, key -> output).
  using B = emu::Philox4x32::Block;
  CHECK(emu::Philox4x32::block({0, 0}, B{0, 0, 0, 0}) == B{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(emu::Philox4x32::block({0xffffffff, 0xffffffff}, B{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}) ==
        B{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(emu::Philox4x32::block({0xa4093822, 0x299f31d0}, B{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}) ==
        B{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("a Philox stream follows the documented key and counter layout", "[rng]") {
  // emu/rng.hpp: key = seed; counter = (block low 32, block high 16 | lane << 16, point,
  // replica); each 64-bit output is two consecutive 32-bit words, low word first.
  const emu::StreamId id{0x0123456789abcdefULL, 11, 22, 3};
  emu::Philox4x32 p(id);
  const std::array<std::uint32_t, 2> key{0x89abcdef, 0x01234567};
  for (std::uint32_t block = 0; block < 3; ++block) {
    const auto b = emu::Philox4x32::block(key, {block, 3u << 16, 11, 22});
    CHECK(p.next_u64() == (std::uint64_t{b[0]} | (std::uint64_t{b[1]} << 32)));
    CHECK(p.next_u64() == (std::uint64_t{b[2]} | (std::uint64_t{b[3]} << 32)));
  }
}

TEST_CASE("xoroshiro128aox matches the published algorithm and $PRNG_SEED expansion", "[rng]") {
  for (std::uint32_t seed : {0u, 1u, 0xdeadbeefu, 0xffffffffu, 0x12345678u}) {
    const auto model = emu::Xoroshiro128aox::from_prng_seed(seed);
    ReferenceAox ref = ReferenceAox::from_seed(seed);
    CHECK(model.s0() == ref.s0);
    CHECK(model.s1() == ref.s1);
    auto gen = model;
    int differing = 0;
    for (int i = 0; i < 10'000; ++i) differing += gen.next_u64() != ref.next();
    INFO("seed 0x" << std::hex << seed);
    CHECK(differing == 0);
  }
  // A worked value, by hand from the expansion: v = 1 gives s0 = 0xfffffffe'00000001,
  // s1 low = (1 << 13) | (0xfffffffe >> 19) = 0x2000 | 0x1fff = 0x3fff,
  // s1 high = (0xfffffffe << 13) | 0 = 0xffffc000.
  const auto one = emu::Xoroshiro128aox::from_prng_seed(1);
  CHECK(one.s0() == 0xfffffffe00000001ULL);
  CHECK(one.s1() == 0xffffc00000003fffULL);
}

TEST_CASE("the ipu rng is xoroshiro128aox seeded through $PRNG_SEED, as the hardware is", "[rng]") {
  // A stream's ipu rng: $PRNG_SEED = the low 32 bits of the stream's first Philox output
  // (emu/rng.hpp), expanded as the hardware does.
  for (const emu::StreamId& id : {emu::StreamId{99, 1, 2, 3}, emu::StreamId{0}, emu::StreamId{~0ULL, 7, 0, 1}}) {
    const std::uint32_t v = static_cast<std::uint32_t>(emu::Philox4x32(id).next_u64());
    CHECK(emu::ipu_prng_seed(id) == v);
    ReferenceAox ref = ReferenceAox::from_seed(v);
    emu::Rng rng(id, emu::RngKind::ipu);
    CHECK(rng.kind() == emu::RngKind::ipu);
    for (int i = 0; i < 100; ++i) REQUIRE(rng.next_u64() == ref.next());
  }
  // A seed given directly (emu round --rng ipu --seed S).
  for (std::uint32_t v : {0u, 1u, 42u, 0xffffffffu}) {
    ReferenceAox ref = ReferenceAox::from_seed(v);
    emu::Rng rng = emu::Rng::ipu_from_prng_seed(v);
    CHECK(rng.kind() == emu::RngKind::ipu);
    for (int i = 0; i < 100; ++i) REQUIRE(rng.next_u64() == ref.next());
  }
}

TEST_CASE("streams: same name, same numbers; any field changed, different numbers", "[rng]") {
  for (emu::RngKind kind : {emu::RngKind::philox, emu::RngKind::ipu}) {
    const emu::StreamId base{7, 1, 2, 3};
    CHECK(first(emu::Rng(base, kind), 8) == first(emu::Rng(base, kind), 8));
    std::set<std::vector<std::uint64_t>> seen;
    for (const emu::StreamId& id : {base, emu::StreamId{8, 1, 2, 3}, emu::StreamId{7, 2, 2, 3},
                                    emu::StreamId{7, 1, 3, 3}, emu::StreamId{7, 1, 2, 4},
                                    emu::StreamId{7ULL << 32, 1, 2, 3}})
      seen.insert(first(emu::Rng(id, kind), 4));
    INFO(emu::rng_kind_name(kind));
    CHECK(seen.size() == 6);
  }
  // uniform() lies in [0, 1) and has a sane mean.
  emu::Rng rng(emu::StreamId{5});
  double sum = 0;
  for (int i = 0; i < 100'000; ++i) {
    const double u = rng.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
  }
  CHECK(std::abs(sum / 100'000 - 0.5) < 5 * std::sqrt(1.0 / 12 / 100'000));
}
