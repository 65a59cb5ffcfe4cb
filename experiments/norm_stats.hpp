// The three ways the norm_stats experiment computes the mean and the (population)
// variance of one vector, every operation rounded into an accumulation format through an
// emu::Context. Exposed so that tests can run them on vectors they construct.
//
//   naive     E[x^2] - E[x]^2 in one pass: s += x_i and q += x_i^2 (the square rounded,
//             then added) step by step, then mean = s / n, var = q / n - mean * mean.
//   two_pass  subtract the mean first (Poplar's use_stable_statistics): mean = (sum x_i)
//             / n, then var = (sum (x_i - mean)^2) / n.
//   welford   one pass with a running mean (Welford 1962): for k = 1..n,
//             delta = x_k - mean; mean += delta / k; m2 += delta * (x_k - mean);
//             var = m2 / n. The count k enters the division exactly (an integer counter,
//             as hardware keeps it): the quotient is rounded once.
// Sums are sequential (recursive), in index order.
//
// Provenance: the scope is "<algorithm>.<part>" (naive.sum, naive.sum_sq, naive.mean,
// naive.var; two_pass.sum, two_pass.mean, two_pass.sum_sq_dev, two_pass.var;
// welford.update, welford.var); the element is [row, i] for the operations of step i
// (flat row * n + i) and [row] for the final ones (flat row).
//
// Error bounds (round to nearest; no overflow, no underflow; x representable in the
// accumulation format; u its unit roundoff, gamma_k = k u / (1 - k u); mu and V the exact
// mean and variance of x, S = sum |x_i|, R = max x - min x, X = max |x_i|):
//   mean, naive and two_pass: |mean - mu| <= gamma_n S / n    (the recursive sum, Higham,
//     Accuracy and Stability of Numerical Algorithms, 2nd ed., (4.4), and the division)
//   two_pass: let e = mean - mu and W = sum (x_i - mean)^2 / n = V + e^2 exactly. Each
//     term carries the difference's rounding squared (2 factors 1 + delta), the square's
//     (1), n - 1 from the recursive sum of non-negative terms and 1 from the division, so
//     |var - W| <= gamma_{n+3} W and |var - V| <= gamma_{n+3} V + (1 + gamma_{n+3}) e^2.
//     The variance is never negative.
//   welford: the running mean stays between min x and max x (for k >= 2, |delta / k| <
//     |delta| after rounding, and rounding is monotone), so every increment
//     delta * (x_k - mean) is >= 0 and var is never negative. The running mean's error
//     e_k = mean_k - mu_k obeys |e_k| <= (1 - 1/k) |e_{k-1}| + gamma_2 R / k + u X, e_1 = 0,
//     hence |e_k| <= E := gamma_2 R + u X (n + 1) / 2. The computed m2 is
//     sum_k D_k F_k (1 + eta_k) with |eta_k| <= gamma_{n+3} (D_k = x_k - mean_{k-1},
//     F_k = x_k - mean_k, exact), and sum_k (x_k - mu_{k-1})(x_k - mu_k) = n V exactly,
//     so |var - V| <= gamma_{n+3} V + (1 + gamma_{n+3}) (2 E R + E^2).
//   naive: no useful bound: q / n carries an error of about n u E[x^2] that the
//     difference does not cancel, so var can be far off, negative, or (fp16: E[x^2]
//     above 65504, i.e. |x| above 256) inf - inf = NaN with OFLO and INV.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "emu/arith.hpp"
#include "emu/format.hpp"

namespace roundoff::norm_stats {

enum class Algorithm { naive, two_pass, welford };
Algorithm algorithm_by_name(std::string_view name);  // "naive", "two_pass", "welford"
const char* algorithm_name(Algorithm a);

struct Moments {
  double mean = 0;
  double var = 0;  // population variance: divided by n
};

// The mean and variance of x (n >= 1 values) computed by `algorithm`, every operation in
// `accumulation` under ctx (its rounding, overflow policy, counts and traps); `row` is the
// vector's index for the elements of the provenance.
Moments compute(emu::Context& ctx, Algorithm algorithm, const emu::Format& accumulation, std::span<const double> x,
                std::int64_t row);

}  // namespace roundoff::norm_stats
