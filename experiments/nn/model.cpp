#include "model.hpp"

#include <algorithm>
#include <cmath>

#include "layers.hpp"

namespace roundoff::train {

Evaluation Model::evaluate(emu::Context& ctx, const data::Dataset& d) const {
  const std::size_t n = d.size(), features = d.features, classes = d.classes, chunk = rows_per_chunk();
  const Shape all = input_shape(n);
  double loss_sum = 0.0;
  std::size_t correct = 0;
  std::vector<double> e;
  for (std::size_t first = 0; first < n; first += chunk) {
    const std::size_t rows = std::min(chunk, n - first);
    std::vector<double> x(rows * features);
    {
      const emu::Scope scope(ctx, "input");
      for (std::size_t k = 0; k < x.size(); ++k) {
        set_element(ctx, all, first * features + k);
        x[k] = ctx.convert(formats().act, d.x[first * features + k]);
      }
      ctx.clear_element();
    }
    const std::vector<double> z = logits(ctx, x, first);
    const emu::Scope scope(ctx, "loss");
    for (std::size_t i = 0; i < rows; ++i) {
      const double* row = &z[i * classes];
      const int label = d.y[first + i];
      loss_sum += softmax_terms(ctx, formats().loss, row, classes, label, e, first + i).loss;
      bool all_finite = true;
      for (std::size_t j = 0; j < classes; ++j) all_finite = all_finite && std::isfinite(row[j]);
      const auto best = std::max_element(row, row + classes) - row;
      if (all_finite && best == label) ++correct;
    }
    ctx.clear_element();
  }
  return Evaluation{loss_sum / static_cast<double>(n), static_cast<double>(correct) / static_cast<double>(n)};
}

Evaluation evaluate_logits_fp64(const std::vector<double>& logits, const std::vector<int>& labels,
                                std::size_t classes) {
  Evaluation e;
  const std::size_t n = labels.size();
  std::size_t correct = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double* row = &logits[i * classes];
    const std::size_t best = static_cast<std::size_t>(std::max_element(row, row + classes) - row);
    double sum = 0.0;
    for (std::size_t j = 0; j < classes; ++j) sum += std::exp(row[j] - row[best]);
    e.loss += row[best] + std::log(sum) - row[labels[i]];
    bool all_finite = true;
    for (std::size_t j = 0; j < classes; ++j) all_finite = all_finite && std::isfinite(row[j]);
    if (all_finite && static_cast<int>(best) == labels[i]) ++correct;
  }
  e.loss /= static_cast<double>(n);
  e.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  return e;
}

}  // namespace roundoff::train
