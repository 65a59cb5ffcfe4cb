// roundoff._core's TorchUnit, MatrixView, torch_round and OptimizerKernel: the C++ half of roundoff.torch
// (python/roundoff/torch/). One GEMM of an emulated layer per call, on the tensors' own
// memory (numpy views of torch tensors, float32 or float64, any strides): the operands
// are read once into the unit's double buffers, rounded into its input format as roundoff.matmul rounds them
// (rne; a block format: rows of A and columns of B quantised along k), the
// unit's gemm runs once on the whole product (so a multi-threaded gemm speeds every
// layer up unchanged), and the result goes straight into the output tensor. Counted
// flags come back per (unit operation, flag) with the first element; an enabled trap
// raises roundoff.FloatingPointTrap (_core.cpp's translator) with the module's scope
// and the GEMM's role as the operation.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "options.hpp"
#include "emu/arith.hpp"
#include "emu/block.hpp"
#include "emu/block_mma.hpp"
#include "emu/convert.hpp"
#include "emu/format.hpp"
#include "emu/nearest.hpp"
#include "emu/rng.hpp"
#include "emu/round.hpp"
#include "emu/unit.hpp"
#include "emu/unit_request.hpp"

namespace py = pybind11;

namespace {

// A matrix inside a numpy array X of rank 2 (P x Q) or 3 (B x P x Q), float32 or float64,
// any strides. Rank 3 stacks B matrices: by rows ((b P + p, q): a batch of inputs to a
// Linear, or the im2col columns of every image as the B operand of a weight gradient) or
// by columns ((p, b Q + q): the im2col columns of every image side by side, as the B
// operand of a convolution, and its N x O x L output).
class MatrixView {
 public:
  // Holds x (the data pointers are taken here, with the GIL: read and write run without).
  MatrixView(const py::array& x, bool stacked_by_columns, const char* name)
      : array_(x), data_(x.data()), by_columns_(stacked_by_columns) {
    if (x.ndim() != 2 && x.ndim() != 3)
      throw std::invalid_argument(std::string(name) + ": a matrix of rank 2 or 3 expected");
    if (py::isinstance<py::array_t<float>>(x))
      single_ = true;
    else if (!py::isinstance<py::array_t<double>>(x))
      throw std::invalid_argument(std::string(name) + ": float32 or float64 expected");
    const bool batched = x.ndim() == 3;
    const py::ssize_t size = single_ ? 4 : 8;
    batches_ = batched ? x.shape(0) : 1;
    p_ = x.shape(batched ? 1 : 0);
    q_ = x.shape(batched ? 2 : 1);
    sb_ = batched ? x.strides(0) / size : 0;
    sp_ = x.strides(batched ? 1 : 0) / size;
    sq_ = x.strides(batched ? 2 : 1) / size;
    if (x.writeable()) writeable_data_ = const_cast<py::array&>(x).mutable_data();
  }
  std::size_t rows() const { return static_cast<std::size_t>(by_columns_ ? p_ : batches_ * p_); }
  std::size_t cols() const { return static_cast<std::size_t>(by_columns_ ? batches_ * q_ : q_); }

  // The matrix (transposed where asked) into `out`, row-major.
  void read(double* out, bool transpose) const {
    if (single_)
      visit<const float>(static_cast<const float*>(data_), transpose, [](double& d, const float& s) { d = s; }, out);
    else
      visit<const double>(static_cast<const double*>(data_), transpose, [](double& d, const double& s) { d = s; }, out);
  }
  // `in` (row-major, rows() x cols()) into the array.
  void write(const double* in) const {
    if (writeable_data_ == nullptr) throw std::invalid_argument("out: a writeable array expected");
    if (single_)
      visit<float>(static_cast<float*>(writeable_data_), false, [](double& d, float& s) { s = static_cast<float>(d); },
                   const_cast<double*>(in));
    else
      visit<double>(static_cast<double*>(writeable_data_), false, [](double& d, double& s) { s = d; },
                    const_cast<double*>(in));
  }

 private:
  // move(matrix element, array element) for every element, the matrix row-major (or
  // column-major where transposed) in `matrix`; in tiles of 32 x 32, so that a
  // transposed view (a weight's W^T) is read a cache line at a time.
  template <class T, class Move>
  void visit(T* base, bool transpose, Move move, double* matrix) const {
    constexpr py::ssize_t tile = 32;
    const std::size_t r = rows(), c = cols();
    for (py::ssize_t b = 0; b < batches_; ++b)
      for (py::ssize_t p0 = 0; p0 < p_; p0 += tile)
        for (py::ssize_t q0 = 0; q0 < q_; q0 += tile)
          for (py::ssize_t p = p0; p < std::min(p0 + tile, p_); ++p) {
            T* source = base + b * sb_ + p * sp_;
            const std::size_t row = static_cast<std::size_t>(by_columns_ ? p : b * p_ + p);
            const std::size_t col0 = static_cast<std::size_t>(by_columns_ ? b * q_ : 0);
            const py::ssize_t q1 = std::min(q0 + tile, q_);
            if (!transpose && sq_ == 1) {  // a contiguous run: a loop the compiler vectorises
              double* dest = matrix + row * c + col0;
              for (py::ssize_t q = q0; q < q1; ++q) move(dest[q], source[q]);
            } else if (!transpose) {
              double* dest = matrix + row * c + col0;
              for (py::ssize_t q = q0; q < q1; ++q) move(dest[q], source[q * sq_]);
            } else {
              for (py::ssize_t q = q0; q < q1; ++q)
                move(matrix[(col0 + static_cast<std::size_t>(q)) * r + row], source[q * sq_]);
            }
          }
  }

  py::array array_;
  const void* data_;
  void* writeable_data_ = nullptr;
  bool by_columns_;
  bool single_ = false;
  py::ssize_t batches_ = 1, p_ = 0, q_ = 0, sb_ = 0, sp_ = 0, sq_ = 0;
};

// Scratch buffers of this thread, reused from call to call: a fresh buffer of a layer's
// size costs page faults and zeroing comparable to a small GEMM.
struct Scratch {
  std::vector<double> a, b, c;
};
Scratch& scratch() {
  thread_local Scratch buffers;
  return buffers;
}

// One counted (op, flag) of a call, for roundoff.torch's exception table.
py::list counts_of(const emu::Context& ctx) {
  py::list out;
  for (const emu::OpCount& c : ctx.counts()) {
    const emu::Element& first = c.first_element;
    py::tuple element = first.rank > 0 ? py::tuple(py::cast(std::vector<std::int64_t>(
                                             first.index.begin(), first.index.begin() + first.rank)))
                                       : py::make_tuple(first.flat);
    out.append(py::make_tuple(c.op, emu::flag_name(c.flag), c.count, element, py::tuple(py::cast(c.first_operands)),
                              c.first_result));
  }
  return out;
}

// Runs work(ctx) under `scope` ("": the model itself); an enabled trap is rethrown with `op` (the GEMM's role,
// or "round") as its operation and the unit's own in front of its operands' meaning.
template <class Work>
void in_scope(emu::Context& ctx, const std::string& scope, const std::string& op, Work work) {
  std::optional<emu::Scope> named;
  if (!scope.empty()) named.emplace(ctx, scope);
  try {
    work();
  } catch (const emu::FpException& e) {
    emu::TrapReport report = e.report();
    report.op = op;
    throw emu::FpException(report);
  }
}

// What roundoff.torch.emulate calls the unit's fields, for resolve_unit's messages.
constexpr emu::RequestLabels kEmulateLabels{"unit", "in_format", "out_format", "scale_rule", "fused"};

// An emulated layer's matrix unit and FP control: the unit emu::resolve_unit makes of
// the request, as for roundoff.matmul (a block format: b200's block-scaled MMA, or the
// reference units on the dequantised values).
class TorchUnit {
 public:
  TorchUnit(const std::string& unit, const std::optional<std::string>& in, const std::optional<std::string>& out,
            const std::optional<std::string>& scale_rule, const std::string& rounding, std::uint64_t sr_bits,
            const std::string& overflow, const std::string& tininess, bool esr, const std::string& fp_exceptions) {
    using emu::cli::option_value;
    emu::UnitRequest request;
    request.unit = option_value(kEmulateLabels.unit, [&] { return emu::unit_kind_by_name(unit); });
    if (in) request.in = option_value(kEmulateLabels.in, [&] { return emu::unit_input_by_name(*in); });
    if (out) request.out = emu::cli::format_named(kEmulateLabels.out, *out);
    if (scale_rule)
      request.scale_rule = option_value(kEmulateLabels.scale_rule, [&] { return emu::scale_rule_by_name(*scale_rule); });
    ready_ = emu::cli::usage_checked([&] { return emu::resolve_unit(request, kEmulateLabels); });
    control_.rounding = emu::rounding_by_name(rounding);
    control_.overflow = emu::overflow_by_name(overflow);
    control_.tininess = emu::tininess_by_name(tininess);
    if (sr_bits > 64) throw std::invalid_argument("sr_bits: 0 to 64 expected");
    control_.sr_bits = static_cast<int>(sr_bits);
    control_.esr = esr;
    const emu::Flags watched = emu::OFLO | emu::DIV0 | emu::INV;
    switch (emu::exception_mode_by_name(fp_exceptions)) {
      case emu::ExceptionMode::off: break;
      case emu::ExceptionMode::count: control_.counted = watched; break;
      case emu::ExceptionMode::trap: control_.traps = watched; break;
    }
  }

  std::string output_format() const { return ready_.output_format().name(); }
  std::string input_format() const { return ready_.in_name(); }
  int counted() const { return control_.counted; }
  int traps() const { return control_.traps; }

  // out = A B + C with C[i, j] = bias[j] (bias_axis 1) or bias[i] (0), zero without bias;
  // as roundoff.matmul(A, B, C, unit=..., seed=seed). Returns (flags, counts). An empty
  // A (m = 0, an empty batch) or B (n = 0) gives an empty out.
  py::tuple gemm(const MatrixView& A, const MatrixView& B, const std::optional<py::array>& bias, int bias_axis,
                 const MatrixView& out, std::uint64_t seed, const std::string& scope, const std::string& op) const {
    const std::size_t m = A.rows(), k = A.cols(), n = B.cols();
    if (B.rows() != k || out.rows() != m || out.cols() != n)
      throw std::invalid_argument(scope + " " + op + ": shapes do not agree (" + std::to_string(m) + "x" +
                                  std::to_string(k) + " times " + std::to_string(B.rows()) + "x" + std::to_string(n) +
                                  " into " + std::to_string(out.rows()) + "x" + std::to_string(out.cols()) + ")");
    std::vector<double> bias_values;
    if (bias) {
      const auto b = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(*bias);
      bias_values.assign(b.data(), b.data() + b.size());
      if (bias_values.size() != (bias_axis == 1 ? n : m)) throw std::invalid_argument(scope + ": bias of the wrong length");
    }
    emu::Context ctx(control_, emu::Rng(emu::StreamId{seed}));
    if (m == 0 || n == 0) return py::make_tuple(0, counts_of(ctx));  // no element: nothing to compute or raise
    std::vector<double>& c = scratch().c;
    c.assign(m * n, 0.0);
    emu::Flags input_flags = 0;
    {
      py::gil_scoped_release release;
      in_scope(ctx, scope, op, [&] {
        const emu::Format& c_format = ready_.output_format();
        if (!bias_values.empty())
          for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = 0; j < n; ++j)
              c[i * n + j] = convert(ctx, c_format, bias_values[bias_axis == 1 ? j : i], input_flags);
        if (ready_.block)
          block_gemm(ctx, A, B, c, input_flags);
        else
          unit_gemm(ctx, A, B, c, input_flags);
      });
      out.write(c.data());
    }
    return py::make_tuple(static_cast<int>(ctx.status() | input_flags), counts_of(ctx));
  }

 private:
  // x rounded into f as roundoff.matmul's inputs are (emu::cli::convert_input); a
  // watched flag is raised into ctx (counted or trapped as "convert"), the others only
  // into input_flags.
  double convert(emu::Context& ctx, const emu::Format& f, double x, emu::Flags& input_flags) const {
    emu::Flags flags = 0;
    const double r = emu::cli::convert_input(f, emu::Exact{x}, ctx, flags);
    input_flags |= flags;
    if (flags & (control_.counted | control_.traps)) ctx.raise_flags(flags, "convert", {x}, r);
    return r;
  }

  // A view's matrix in f, A's or B's input format (values of it pass as they are), into values.
  void unit_input(emu::Context& ctx, const MatrixView& v, const emu::Format& f, std::vector<double>& values,
                  emu::Flags& input_flags) const {
    values.resize(v.rows() * v.cols());
    v.read(values.data(), false);
    for (std::size_t e = emu::NearestOps::first_not_value(f, values.data(), 0, values.size()); e < values.size(); ++e) {
      emu::ElementGuard element(ctx, static_cast<std::int64_t>(e));
      values[e] = convert(ctx, f, values[e], input_flags);
    }
  }

  void unit_gemm(emu::Context& ctx, const MatrixView& A, const MatrixView& B, std::vector<double>& c,
                 emu::Flags& input_flags) const {
    const std::size_t m = A.rows(), k = A.cols(), n = B.cols();
    std::vector<double>&a = scratch().a, &b = scratch().b;
    unit_input(ctx, A, ready_.unit->input_format(), a, input_flags);
    unit_input(ctx, B, ready_.unit->b_input_format(), b, input_flags);
    ready_.unit->gemm(ctx, m, n, k, a.data(), k, b.data(), n, c.data(), n);
  }

  // As roundoff.matmul with a block format (emu::cli::block_gemm): A's rows and B's
  // columns quantised along k (ReadyUnit::quantize_operands), then the block-scaled MMA
  // with nvfp4's epilogue, or the reference unit on the dequantised values. A watched
  // flag of a row's (column's) quantisation is raised as "quantize" with its index.
  void block_gemm(emu::Context& ctx, const MatrixView& A, const MatrixView& B, std::vector<double>& c,
                  emu::Flags& input_flags) const {
    const std::size_t m = A.rows(), k = A.cols(), n = B.cols();
    std::vector<double>&a = scratch().a, &b = scratch().b;
    a.resize(m * k);
    b.resize(k * n);
    A.read(a.data(), false);
    B.read(b.data(), false);
    const emu::QuantizedOperands q = ready_.quantize_operands(a, b, m, n, k);
    for (const std::vector<emu::BlockQuantized>* operand : {&q.rows, &q.cols})
      for (std::size_t i = 0; i < operand->size(); ++i) {
        const emu::Flags flags = (*operand)[i].flags;
        if (flags & (control_.counted | control_.traps)) {
          emu::ElementGuard element(ctx, static_cast<std::int64_t>(i));
          ctx.raise_flags(flags, "quantize", {});
        }
        input_flags |= flags;
      }
    if (ready_.mma) {
      input_flags |= q.epilogue.alpha_flags;
      ready_.mma->gemm(ctx, q.rows, q.cols, c.data(), n, q.epilogue);
    } else {
      ready_.unit->gemm(ctx, m, n, k, a.data(), k, b.data(), n, c.data(), n);
    }
  }

  emu::FpControl control_;
  emu::ReadyUnit ready_;
};

// x (C-contiguous float32 or float64) rounded into `format` element by element into out
// (x's shape and dtype; may be x), as roundoff.round(x, format, rounding, seed=seed)
// rounds it: a float32 x into fp16/bf16 (rne, sr) through emu's kernels (element i's
// random bits a function of (seed, i)), else emu::round in C order on one stream. Flags
// that `counted` or `traps` name are raised per element (op "round", scope) in a
// context with that control. Returns (flags, counts).
py::tuple round_tensor(const py::array& x, py::array& out, const std::string& format, const std::string& rounding,
                       std::uint64_t seed, int sr_bits, const std::string& overflow, const std::string& tininess,
                       bool subnormals, int counted, int traps, const std::string& scope) {
  const emu::Format f = emu::format_by_name(format).with_subnormals(subnormals);
  emu::FpControl control;
  control.counted = static_cast<emu::Flags>(counted);
  control.traps = static_cast<emu::Flags>(traps);
  const emu::RoundSpec spec{emu::rounding_by_name(rounding), emu::overflow_by_name(overflow), sr_bits,
                            emu::tininess_by_name(tininess)};
  const bool single = py::isinstance<py::array_t<float>>(x);
  if (!(x.flags() & py::array::c_style) || !(out.flags() & py::array::c_style) || x.size() != out.size() ||
      x.dtype().not_equal(out.dtype()) || !out.writeable() || (!single && !py::isinstance<py::array_t<double>>(x)))
    throw std::invalid_argument("round: C-contiguous float32 or float64 arrays of one shape and dtype expected");
  const std::size_t n = static_cast<std::size_t>(x.size());
  emu::Context ctx(control);
  const emu::Flags watched = control.counted | control.traps;
  emu::Flags flags = 0;
  {
    py::gil_scoped_release release;
    in_scope(ctx, scope, "round", [&] {
      auto report = [&](std::size_t i, emu::Flags raised, double operand, double result) {
        if (!(raised & watched)) return;
        emu::ElementGuard element(ctx, static_cast<std::int64_t>(i));
        ctx.raise_flags(raised & watched, "round", {operand}, result);
      };
      if (single && emu::HalfRounding::supports(f, spec)) {
        const emu::HalfRounding how(f, spec, emu::StreamId{seed});
        const float* in = static_cast<const float*>(x.data());
        float* o = static_cast<float*>(out.mutable_data());
        if (!watched) {
          flags = emu::round_to_float(how, {in, n}, {o, n});
          return;
        }
        // Element by element (the same random bits: they depend on the index alone).
        for (std::size_t i = 0; i < n; ++i) {
          const float operand = in[i];
          const emu::Flags raised = emu::round_to_float(how, {&operand, 1}, {o + i, 1}, i);
          flags |= raised;
          report(i, raised, operand, o[i]);
        }
        return;
      }
      emu::Rng rng(emu::StreamId{seed});
      for (std::size_t i = 0; i < n; ++i) {
        const double operand = single ? static_cast<const float*>(x.data())[i] : static_cast<const double*>(x.data())[i];
        emu::Flags raised = 0;
        const double r = emu::round(f, emu::Exact{operand}, spec, &rng, raised);
        if (single)
          static_cast<float*>(out.mutable_data())[i] = static_cast<float>(r);
        else
          static_cast<double*>(out.mutable_data())[i] = r;
        flags |= raised;
        report(i, raised, operand, r);
      }
    });
  }
  return py::make_tuple(static_cast<int>(flags), counts_of(ctx));
}

// ---- the optimizers' update rules (python/roundoff/torch/_optim.py) ------------------------

// The scalar operations of the update rules, each the exact result rounded once to
// nearest into a format, as emu::Context computes it (train's Updater): NearestOps'
// inline arithmetic where it applies and takes the operands, Context otherwise (NaN,
// infinities, overflow, results at the edges of the format). Flags are not kept.
class UpdateArith {
 public:
  UpdateArith() : fast_(emu::NearestOps::applies(ctx_)) {}
  double add(const emu::Format& f, double a, double b) {
    double r;
    return fast_ && nearest_.add(f, a, b, r) ? r : ctx_.add(f, a, b);
  }
  double sub(const emu::Format& f, double a, double b) {
    double r;
    return fast_ && nearest_.sub(f, a, b, r) ? r : ctx_.sub(f, a, b);
  }
  double mul(const emu::Format& f, double a, double b) {
    double r;
    return fast_ && nearest_.mul(f, a, b, r) ? r : ctx_.mul(f, a, b);
  }
  double div(const emu::Format& f, double a, double b) {
    double r;
    return fast_ && nearest_.div(f, a, b, r) ? r : ctx_.div(f, a, b);
  }
  double fma(const emu::Format& f, double a, double b, double c) {
    double r;
    return fast_ && nearest_.fma(f, a, b, c, r) ? r : ctx_.fma(f, a, b, c);
  }
  double sqrt(const emu::Format& f, double a) {
    double r;
    return fast_ && nearest_.sqrt(f, a, r) ? r : ctx_.sqrt(f, a);
  }
  double convert(const emu::Format& f, double a) {
    double r;
    return fast_ && nearest_.convert(f, a, r) ? r : ctx_.convert(f, a);
  }

 private:
  emu::Context ctx_;
  emu::NearestOps nearest_;
  bool fast_;
};

// A C-contiguous float32 array's elements (a numpy view of a float32 tensor).
std::span<float> floats(const py::array& x, const char* name) {
  if (!py::isinstance<py::array_t<float>>(x) || !(x.flags() & py::array::c_style) || !x.writeable())
    throw std::invalid_argument(std::string(name) + ": a writeable C-contiguous float32 array expected");
  return {static_cast<float*>(const_cast<py::array&>(x).mutable_data()), static_cast<std::size_t>(x.size())};
}

// a - b rounded to odd into double (the exact difference where it is a double): the
// operand of fp16-sr's stochastic rounding.
double difference_to_odd(double a, double b) {
  const double s = a - b, bb = s - a;
  const double error = (a - (s - bb)) + (-b - bb);  // TwoSum's: exact
  if (error == 0 || std::isnan(error) || (std::bit_cast<std::uint64_t>(s) & 1) != 0) return s;
  return std::nextafter(s, error > 0 ? INFINITY : -INFINITY);
}

// One optimizer's update rule (train's Updater) on float32 arrays shared with torch:
// per element, in one pass, every operation rounded once (UpdateArith) and the
// parameter's new value stored. The formats are fixed at construction, the
// hyperparameters (already rounded into their formats) come with each step.
class OptimizerKernel {
 public:
  OptimizerKernel(const std::string& update, const std::string& direction, const std::string& weight_format,
                  const std::string& arith_format, const std::string& state_format, const std::string& master_format)
      : rule_(rule_by_name(update)),
        direction_(direction_by_name(direction)),
        storage_(format_of(weight_format)),
        arith_(format_of(arith_format)),
        state_(format_of(state_format)),
        master_(format_of(master_format)) {}

  // The new parameter `w` from its gradient, updating the state arrays that the rule
  // and direction have (the others None): `master` (fp32-master), `compensation`
  // (fp16-kahan), `first` (momentum_buffer, exp_avg) and `second` (exp_avg_sq).
  // lr, weight_decay (None: no decay term) and the coefficients, momentum (momentum) or
  // beta1, 1 - beta1, beta2, 1 - beta2, 1 - beta1^t, 1 - beta2^t, eps (adam), are each a
  // value of the format they are used in. sr_seed: fp16-sr's stream (emu::round in C
  // order on one stream, as roundoff.round rounds a float64 array).
  void step(const py::array& w_array, const py::array& grad_array, const std::optional<py::array>& master_array,
            const std::optional<py::array>& compensation_array, const std::optional<py::array>& first_array,
            const std::optional<py::array>& second_array, double lr, std::optional<double> weight_decay,
            const std::vector<double>& coefficients, std::uint64_t sr_seed) const {
    const std::span<float> w = floats(w_array, "w"), grad = floats(grad_array, "grad");
    const auto optional_floats = [&](const std::optional<py::array>& a, bool wanted, const char* name) {
      if (a.has_value() != wanted) throw std::invalid_argument(std::string(name) + (wanted ? ": expected" : ": unexpected"));
      std::span<float> s = a ? floats(*a, name) : std::span<float>();
      if (a && s.size() != w.size()) throw std::invalid_argument(std::string(name) + ": of w's size expected");
      return s;
    };
    const std::span<float> master = optional_floats(master_array, rule_ == Rule::master, "master");
    const std::span<float> compensation = optional_floats(compensation_array, rule_ == Rule::kahan, "compensation");
    const std::span<float> first = optional_floats(first_array, direction_ != Direction::sgd, "first");
    const std::span<float> second = optional_floats(second_array, direction_ == Direction::adam, "second");
    const std::size_t wanted = direction_ == Direction::adam ? 7 : direction_ == Direction::momentum ? 1 : 0;
    if (grad.size() != w.size() || coefficients.size() != wanted)
      throw std::invalid_argument("OptimizerKernel.step: grad of w's size and " + std::to_string(wanted) +
                                  " coefficients expected");
    const std::vector<double>& c = coefficients;
    const emu::Format &ws = storage_, &ar = arith_, &st = state_;
    py::gil_scoped_release release;
    UpdateArith op;
    emu::Rng rng(emu::StreamId{sr_seed});
    const emu::RoundSpec sr{emu::Rounding::sr, emu::Overflow::inf, 0, emu::Tininess::before};
    for (std::size_t i = 0; i < w.size(); ++i) {
      double g = op.convert(ar, grad[i]);
      if (weight_decay) g = op.fma(ar, *weight_decay, rule_ == Rule::master ? master[i] : w[i], g);
      double d = g;
      if (direction_ == Direction::momentum) {
        first[i] = static_cast<float>(op.fma(st, c[0], first[i], g));
        d = op.convert(ar, first[i]);
      } else if (direction_ == Direction::adam) {
        const double b1 = c[0], one_minus_b1 = c[1], b2 = c[2], one_minus_b2 = c[3], c1 = c[4], c2 = c[5], eps = c[6];
        const double m = op.fma(st, b1, first[i], op.mul(st, one_minus_b1, g));
        const double v = op.fma(st, b2, second[i], op.mul(st, one_minus_b2, op.mul(st, g, g)));
        first[i] = static_cast<float>(m);
        second[i] = static_cast<float>(v);
        const double m_hat = op.div(ar, m, c1), v_hat = op.div(ar, v, c2);
        d = op.div(ar, m_hat, op.add(ar, op.sqrt(ar, v_hat), eps));
      }
      const double delta = op.mul(ar, lr, d);
      switch (rule_) {
        case Rule::nearest: w[i] = static_cast<float>(op.sub(ws, w[i], delta)); break;
        case Rule::stochastic: {
          emu::Flags ignored = 0;
          w[i] = static_cast<float>(emu::round(ws, difference_to_odd(w[i], delta), sr, &rng, ignored));
          break;
        }
        case Rule::master:
          master[i] = static_cast<float>(op.sub(master_, master[i], delta));
          w[i] = static_cast<float>(op.convert(ws, master[i]));
          break;
        case Rule::kahan: {
          const double y = op.sub(ws, -delta, compensation[i]);
          const double s = op.add(ws, w[i], y);
          compensation[i] = static_cast<float>(op.sub(ws, op.sub(ws, s, w[i]), y));
          w[i] = static_cast<float>(s);
          break;
        }
      }
    }
  }

 private:
  enum class Rule { nearest, stochastic, master, kahan };
  enum class Direction { sgd, momentum, adam };
  static Rule rule_by_name(const std::string& name) {
    if (name == "fp32" || name == "fp16-rn") return Rule::nearest;
    if (name == "fp16-sr") return Rule::stochastic;
    if (name == "fp32-master") return Rule::master;
    if (name == "fp16-kahan") return Rule::kahan;
    throw std::invalid_argument("update: unknown update rule " + name);
  }
  static Direction direction_by_name(const std::string& name) {
    if (name == "sgd") return Direction::sgd;
    if (name == "momentum") return Direction::momentum;
    if (name == "adam") return Direction::adam;
    throw std::invalid_argument("direction: sgd, momentum or adam expected, not " + name);
  }
  // As roundoff.round reads a format name (subnormals on).
  static emu::Format format_of(const std::string& name) { return emu::format_by_name(name).with_subnormals(true); }

  Rule rule_;
  Direction direction_;
  emu::Format storage_, arith_, state_, master_;
};

// g = g / divisor rounded to nearest into `format`, in place (LossScaler's unscaling).
void divide_into(const std::string& format, const py::array& g_array, double divisor) {
  const std::span<float> g = floats(g_array, "g");
  const emu::Format f = emu::format_by_name(format).with_subnormals(true);
  py::gil_scoped_release release;
  UpdateArith op;
  for (float& x : g) x = static_cast<float>(op.div(f, x, divisor));
}

}  // namespace

void bind_torch(py::module_& m) {
  // In _core itself (a submodule would be one more module in sys.modules at `import roundoff`).
  py::module_& t = m;
  py::class_<MatrixView>(t, "MatrixView").def(py::init<const py::array&, bool, const char*>());
  py::class_<TorchUnit>(t, "TorchUnit")
      .def(py::init<std::string, std::optional<std::string>, std::optional<std::string>, std::optional<std::string>,
                    std::string, std::uint64_t, std::string, std::string, bool, std::string>(),
           py::arg("unit"), py::arg("in_format"), py::arg("out_format"), py::arg("scale_rule"), py::arg("rounding"),
           py::arg("sr_bits"), py::arg("overflow"), py::arg("tininess"), py::arg("esr"), py::arg("fp_exceptions"))
      .def_property_readonly("input_format", &TorchUnit::input_format)
      .def_property_readonly("output_format", &TorchUnit::output_format)
      .def_property_readonly("counted", &TorchUnit::counted)
      .def_property_readonly("traps", &TorchUnit::traps)
      .def("gemm", &TorchUnit::gemm, py::arg("A"), py::arg("B"), py::arg("bias"), py::arg("bias_axis"), py::arg("out"),
           py::arg("seed"), py::arg("scope"), py::arg("op"));
  t.def("torch_round", &round_tensor, py::arg("x"), py::arg("out"), py::arg("format"), py::arg("rounding"), py::arg("seed"),
        py::arg("sr_bits"), py::arg("overflow"), py::arg("tininess"), py::arg("subnormals"), py::arg("counted"),
        py::arg("traps"), py::arg("scope"));
  py::class_<OptimizerKernel>(t, "OptimizerKernel")
      .def(py::init<std::string, std::string, std::string, std::string, std::string, std::string>(),
           py::arg("update"), py::arg("direction"), py::arg("weight_format"), py::arg("arith_format"),
           py::arg("state_format"), py::arg("master_format"))
      .def("step", &OptimizerKernel::step, py::arg("w"), py::arg("grad"), py::arg("master"), py::arg("compensation"),
           py::arg("first"), py::arg("second"), py::arg("lr"), py::arg("weight_decay"), py::arg("coefficients"),
           py::arg("sr_seed"));
  t.def("torch_divide", &divide_into, py::arg("format"), py::arg("g"), py::arg("divisor"));
}
