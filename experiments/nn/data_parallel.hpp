// Data-parallel training's collective arithmetic, emulated (train's dp_replicas): the
// all-reduce that sums the replicas' weight gradients in a given format and summation
// order, the random streams of the replicas, and how far the replicas' weights have
// drifted apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/rng.hpp"

namespace roundoff::train {

// The summation order of the all-reduce (train's allreduce_order):
//  ring: the reduce-scatter of a ring all-reduce (Patarasuk and Yuan, "Bandwidth optimal
//        all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009; NCCL's
//        and Horovod's ring). The n values are cut into R contiguous chunks, chunk c =
//        [c q + min(c, n mod R), (c + 1) q + min(c + 1, n mod R)) with q = n div R (the
//        first n mod R chunks one value longer). In step s = 1 .. R-1 replica r receives
//        from replica r - 1 the partial sum of chunk (r - s) mod R and adds its own
//        values, so chunk c is summed in replica order c, c+1, ..., c+R-1 (mod R):
//        ((v_c + v_{c+1}) + v_{c+2}) + ... Different chunks are summed in different
//        orders, so equal values at different positions can get different sums.
//  tree: a pairwise (binomial) tree reduction: at distance d = 1, 2, 4, ... replica r
//        (a multiple of 2d) adds the partial sum of replica r + d where that exists:
//        ((v_0 + v_1) + (v_2 + v_3)) + ((v_4 + v_5) + ...); R need not be a power of two
//        (R = 3: (v_0 + v_1) + v_2). The same order for every value.
// Either way the sum is then copied to every replica (the all-gather, or the tree's
// broadcast), so all replicas hold the same bits.
enum class AllReduceOrder { ring, tree };
inline constexpr const char* kAllReduceOrderNames[] = {"ring", "tree"};

// The index range [begin, end) of ring chunk c of n values over `replicas` replicas.
struct Chunk {
  std::size_t begin = 0, end = 0;
};
Chunk ring_chunk(std::size_t n, std::size_t replicas, std::size_t c);

// Sums the replicas' copies of one tensor (copies[r] is replica r's, all of one size) and
// writes the sum into every copy. Each replica's values are first rounded into `f` (the
// collective's data type; exact when they are already values of f), then every partial
// sum is rounded once into f, in the order `order` says, by the context of the replica
// that computes it (contexts[r]; several may be the same context); the element of a
// reported flag is the value's flat index. One replica: nothing is computed or rounded.
void all_reduce(std::span<std::vector<double>* const> copies, const emu::Format& f, AllReduceOrder order,
                std::span<emu::Context* const> contexts);

// The stream of data-parallel replica r (from 0) derived from the run's stream `s`: its
// lane plus 256 r, so replica 0 draws exactly what a run without replicas draws and the
// replicas' streams are independent Philox streams (lanes up to 255 are the run's own).
emu::StreamId replica_stream(emu::StreamId s, std::uint32_t r);

// The distance in units in the last place between two values of f: the number of steps
// between their encodings in f's order of values (+0 and -0 are one value); 0 for equal
// values and for two NaNs, infinity when exactly one is NaN or they are unequal and one
// is infinite.
double ulp_distance(const emu::Format& f, double a, double b);

// How far the replicas' copies of the trainable values have drifted apart, over all
// values added. Per value: its spread, from the smallest to the largest copy, in ulps of
// the value's format and relative to the largest magnitude among the copies (0 where all
// copies are 0); the value differs when not every copy equals replica 0's (NaNs equal).
struct ReplicaDivergence {
  double max_ulps = 0.0, max_rel = 0.0;
  std::uint64_t values = 0, differing = 0;
  // copies[r]: replica r's copy of one tensor, values of f.
  void add(const emu::Format& f, std::span<const std::vector<double>* const> copies);
  double frac_differing() const;  // 0 when no values were added
};

}  // namespace roundoff::train
