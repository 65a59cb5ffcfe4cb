#include "data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace roundoff::train {

Chunk ring_chunk(std::size_t n, std::size_t replicas, std::size_t c) {
  const std::size_t q = n / replicas, rem = n % replicas;
  const auto begin = [&](std::size_t k) { return k * q + std::min(k, rem); };
  return Chunk{begin(c), begin(c + 1)};
}

void all_reduce(std::span<std::vector<double>* const> copies, const emu::Format& f, AllReduceOrder order,
                std::span<emu::Context* const> contexts) {
  const std::size_t replicas = copies.size();
  if (contexts.size() != replicas) throw std::logic_error("all_reduce: one context per replica");
  if (replicas < 2) return;
  const std::size_t n = copies[0]->size();
  for (const std::vector<double>* c : copies)
    if (c->size() != n) throw std::logic_error("all_reduce: copies of different sizes");

  // Each replica's values in the collective's format.
  std::vector<std::vector<double>> in(replicas, std::vector<double>(n));
  for (std::size_t r = 0; r < replicas; ++r) {
    emu::Context& ctx = *contexts[r];
    for (std::size_t i = 0; i < n; ++i) {
      ctx.set_element(static_cast<std::int64_t>(i));
      in[r][i] = ctx.convert(f, (*copies[r])[i]);
    }
    ctx.clear_element();
  }

  std::vector<double> sum(n);
  if (order == AllReduceOrder::ring) {
    // Step 0: replica c holds chunk c's first term; step s: replica (c + s) mod R adds its
    // values to the partial sum of chunk c it received.
    for (std::size_t c = 0; c < replicas; ++c) {
      const Chunk k = ring_chunk(n, replicas, c);
      std::copy(in[c].begin() + static_cast<std::ptrdiff_t>(k.begin), in[c].begin() + static_cast<std::ptrdiff_t>(k.end),
                sum.begin() + static_cast<std::ptrdiff_t>(k.begin));
    }
    for (std::size_t s = 1; s < replicas; ++s)
      for (std::size_t c = 0; c < replicas; ++c) {
        const std::size_t r = (c + s) % replicas;
        emu::Context& ctx = *contexts[r];
        const Chunk k = ring_chunk(n, replicas, c);
        for (std::size_t i = k.begin; i < k.end; ++i) {
          ctx.set_element(static_cast<std::int64_t>(i));
          sum[i] = ctx.add(f, sum[i], in[r][i]);
        }
        ctx.clear_element();
      }
  } else {
    for (std::size_t d = 1; d < replicas; d *= 2)
      for (std::size_t r = 0; r + d < replicas; r += 2 * d) {
        emu::Context& ctx = *contexts[r];
        for (std::size_t i = 0; i < n; ++i) {
          ctx.set_element(static_cast<std::int64_t>(i));
          in[r][i] = ctx.add(f, in[r][i], in[r + d][i]);
        }
        ctx.clear_element();
      }
    sum = std::move(in[0]);
  }
  for (std::vector<double>* c : copies) *c = sum;
}

emu::StreamId replica_stream(emu::StreamId s, std::uint32_t r) {
  const std::uint32_t lane = s.lane + 256u * r;
  if (s.lane > 255 || lane > std::numeric_limits<std::uint16_t>::max())
    throw std::invalid_argument("replica_stream: lane " + std::to_string(s.lane) + " of replica " + std::to_string(r) +
                                " is out of range");
  s.lane = static_cast<std::uint16_t>(lane);
  return s;
}

namespace {

// The position of a value of f among f's values in increasing order (+0 and -0 at 0):
// the encoding's magnitude bits, which grow with the value, signed by its sign.
std::int64_t ordinal(const emu::Format& f, double v) {
  const std::uint64_t bits = f.encode(v);
  const auto magnitude = static_cast<std::int64_t>(bits & ~f.sign_mask());
  return (bits & f.sign_mask()) ? -magnitude : magnitude;
}

}  // namespace

double ulp_distance(const emu::Format& f, double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return 0.0;
  if (a == b) return 0.0;
  if (!std::isfinite(a) || !std::isfinite(b)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(std::llabs(ordinal(f, a) - ordinal(f, b)));
}

void ReplicaDivergence::add(const emu::Format& f, std::span<const std::vector<double>* const> copies) {
  if (copies.empty()) return;
  const std::size_t n = copies[0]->size();
  values += n;
  for (std::size_t i = 0; i < n; ++i) {
    const double first = (*copies[0])[i];
    double lo = first, hi = first, largest = std::fabs(first);
    bool differs = false, nan = std::isnan(first);
    for (const std::vector<double>* c : copies.subspan(1)) {
      const double v = (*c)[i];
      differs = differs || !(v == first || (std::isnan(v) && std::isnan(first)));
      nan = nan || std::isnan(v);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      largest = std::max(largest, std::fabs(v));
    }
    if (!differs) continue;
    ++differing;
    if (nan) {  // some copies NaN, some not: as far apart as values can be
      max_ulps = max_rel = std::numeric_limits<double>::infinity();
      continue;
    }
    max_ulps = std::max(max_ulps, ulp_distance(f, lo, hi));
    max_rel = std::max(max_rel, std::isfinite(largest) ? (hi - lo) / largest : std::numeric_limits<double>::infinity());
  }
}

double ReplicaDivergence::frac_differing() const {
  return values ? static_cast<double>(differing) / static_cast<double>(values) : 0.0;
}

}  // namespace roundoff::train
