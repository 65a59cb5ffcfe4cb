#include "slic.hpp"

#include <stdexcept>
#include <string>

namespace emu {

std::vector<double> slic_conv1d(Context& ctx, const AmpConfig& cfg, std::span<const double> signal,
                                std::span<const double> kernel, std::size_t stride,
                                std::span<const double> partials_in) {
  validate(cfg);
  if (kernel.empty()) throw std::invalid_argument("slic_conv1d: empty kernel");
  if (kernel.size() > signal.size()) throw std::invalid_argument("slic_conv1d: kernel longer than the signal");
  if (stride == 0) throw std::invalid_argument("slic_conv1d: stride must be >= 1");
  const std::size_t outputs = (signal.size() - kernel.size()) / stride + 1;
  if (!partials_in.empty() && partials_in.size() != outputs)
    throw std::invalid_argument("slic_conv1d: partials_in needs one value per output (" + std::to_string(outputs) +
                                ")");
  std::vector<double> out(outputs);
  for (std::size_t i = 0; i < outputs; ++i)
    out[i] = amp_dot(ctx, cfg, kernel.size(), signal.data() + i * stride, 1, kernel.data(), 1,
                     partials_in.empty() ? 0.0 : partials_in[i]);
  return out;
}

}  // namespace emu
