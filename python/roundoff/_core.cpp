// roundoff._core: the C++ core for Python. Every function reaches emu through the same
// code as the emu calculator: each keyword argument is parsed once into its typed value
// by emu's name tables with the CLI's checks and messages (option_value, named by the
// CLI's options), contexts come from its make_context, units from emu::resolve_unit
// through its unit_setup, and dot products and block formats through its unit_dot,
// convert_input and block_gemm. Python-side
// argument handling (dtypes, shapes, broadcasting, the Flags type) lives in __init__.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "number.hpp"
#include "emu/arith.hpp"
#include "emu/block.hpp"
#include "emu/convert.hpp"
#include "emu/format.hpp"
#include "emu/nearest.hpp"
#include "emu/threads.hpp"
#include "emu/unit.hpp"
#include "options.hpp"

namespace py = pybind11;
using emu::cli::UsageError;

namespace {

using Doubles = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Floats = py::array_t<float, py::array::c_style>;

// An integer keyword argument in [0, hi], as the calculator checks its option (same
// message).
std::uint64_t integer_arg(std::string_view option, const py::int_& value, std::uint64_t hi) {
  if (value < py::int_(0) || value > py::int_(hi))
    emu::cli::integer_out_of_range(option, 0, hi, std::string(py::str(static_cast<const py::handle&>(value))));
  return value.cast<std::uint64_t>();
}

// The rounding keyword arguments, each parsed once into its typed value with the
// calculator's checks and messages (named by its options).
emu::cli::RoundingOptions rounding_options(const std::string& rounding, const py::int_& seed, const py::int_& sr_bits,
                                           const std::string& overflow, const std::string& rng,
                                           const std::string& tininess) {
  using emu::cli::option_value;
  emu::cli::RoundingOptions r;
  r.rounding = option_value("--rounding", [&] { return emu::rounding_by_name(rounding); });
  r.overflow = option_value("--overflow", [&] { return emu::overflow_by_name(overflow); });
  r.sr_bits = static_cast<int>(integer_arg("--sr-bits", sr_bits, 64));
  r.tininess = option_value("--tininess", [&] { return emu::tininess_by_name(tininess); });
  r.rng = option_value("--rng", [&] { return emu::rng_kind_by_name(rng); });
  r.seed = r.rng == emu::RngKind::ipu ? integer_arg("--seed (with --rng ipu)", seed, 0xFFFFFFFFu)
                                      : integer_arg("--seed", seed, ~std::uint64_t{0});
  return r;
}

emu::Format format_from(const std::string& name, bool subnormals) {
  return emu::cli::format_named("--format", name).with_subnormals(subnormals);
}

// Whether every value of f is a float32 (then results come back as float32).
bool fits_float32(const emu::Format& f) {
  return f.emax() <= 127 && f.fraction_bits() <= 23 && f.emin() - f.fraction_bits() >= -149;
}

std::vector<py::ssize_t> shape_of(const py::array& a) { return {a.shape(), a.shape() + a.ndim()}; }

// The array the results go to: `out` where given (checked: the result's dtype and x's
// shape, C-contiguous, writeable; reusing one spares the fresh pages of a new array),
// else a new one.
py::array result_target(const emu::Format& f, const std::vector<py::ssize_t>& shape, const std::optional<py::array>& out) {
  const bool single = fits_float32(f);
  if (!out) return single ? py::array(py::array_t<float>(shape)) : py::array(py::array_t<double>(shape));
  const char* wanted = single ? "float32" : "float64";
  const bool dtype_ok = single ? py::isinstance<py::array_t<float>>(*out) : py::isinstance<py::array_t<double>>(*out);
  if (!dtype_ok || shape_of(*out) != shape || !(out->flags() & py::array::c_style) || !out->writeable())
    throw py::value_error(std::string("round: out must be a writeable C-contiguous ") + wanted +
                          " array of x's shape (the result's dtype for " + f.name() + ")");
  return *out;
}

// values (of f) as an array of the result's dtype: `out`, or a new one.
py::array result_array(const emu::Format& f, const std::vector<double>& values, const std::vector<py::ssize_t>& shape,
                       const std::optional<py::array>& out = std::nullopt) {
  py::array target = result_target(f, shape, out);
  if (fits_float32(f)) {
    float* o = static_cast<float*>(target.mutable_data());
    for (std::size_t i = 0; i < values.size(); ++i) o[i] = static_cast<float>(values[i]);
  } else {
    std::memcpy(target.mutable_data(), values.data(), values.size() * sizeof(double));
  }
  return target;
}

// ---- round, bits, from_bits -------------------------------------------------------

// float32 input: the fast fp16/bf16 kernels where they apply (their sr stream is a pure
// function of the seed and the element's index); any other input or format: element by
// element through emu::round in C order, sr drawing from the stream `emu round --seed`
// uses, exactly as the calculator does.
py::tuple round_values(const py::array& x, const std::string& format, const emu::cli::RoundingOptions& r,
                       bool subnormals, const std::optional<py::array>& out) {
  const emu::Format f = format_from(format, subnormals);
  emu::Context ctx = emu::cli::make_context(r);
  const emu::RoundSpec spec = ctx.spec();
  const auto shape = shape_of(x);
  if (py::isinstance<Floats>(x) && r.rng == emu::RngKind::philox && emu::HalfRounding::supports(f, spec)) {
    const emu::HalfRounding how(f, spec, emu::StreamId{r.seed});
    const Floats in = Floats::ensure(x);
    py::array target = result_target(f, shape, out);
    const std::size_t n = static_cast<std::size_t>(in.size());
    emu::Flags flags;
    {
      py::gil_scoped_release release;
      flags = emu::round_to_float(how, {in.data(), n}, {static_cast<float*>(target.mutable_data()), n});
    }
    return py::make_tuple(target, static_cast<int>(flags));
  }
  const Doubles in = Doubles::ensure(x);
  const std::size_t n = static_cast<std::size_t>(in.size());
  std::vector<double> values(n);
  emu::Flags flags;
  {
    py::gil_scoped_release release;
    flags = emu::round_array(f, spec, {in.data(), n}, values, &ctx.rng());
  }
  return py::make_tuple(result_array(f, values, shape, out), static_cast<int>(flags));
}

py::array bits(const Doubles& x, const std::string& format, bool subnormals) {
  const emu::Format f = format_from(format, subnormals);
  const std::size_t n = static_cast<std::size_t>(x.size());
  std::vector<std::uint64_t> b(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x.data()[i];
    if (!f.representable(v))
      throw py::value_error("bits: element " + std::to_string(i) + " (" + emu::cli::json_number(v) + ") is not a value of " +
                            format + ": round it first (roundoff.round)");
    b[i] = f.encode(v);
  }
  const auto shape = shape_of(x);
  auto fill = [&](auto out) -> py::array {
    for (std::size_t i = 0; i < n; ++i) out.mutable_data()[i] = static_cast<typename decltype(out)::value_type>(b[i]);
    return out;
  };
  if (f.width() <= 8) return fill(py::array_t<std::uint8_t>(shape));
  if (f.width() <= 16) return fill(py::array_t<std::uint16_t>(shape));
  if (f.width() <= 32) return fill(py::array_t<std::uint32_t>(shape));
  return fill(py::array_t<std::uint64_t>(shape));
}

py::array from_bits(const py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>& b,
                    const std::string& format, bool subnormals) {
  const emu::Format f = format_from(format, subnormals);
  const std::size_t n = static_cast<std::size_t>(b.size());
  std::vector<double> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t v = b.data()[i];
    if ((v & ~f.all_mask()) != 0)
      throw py::value_error("from_bits: element " + std::to_string(i) + " (" + std::to_string(v) + ") has bits beyond " +
                            format + "'s " + std::to_string(f.width()));
    values[i] = f.decode(v);
  }
  return result_array(f, values, shape_of(b));
}

// ---- Context ------------------------------------------------------------------------

struct ContextObject {
  emu::Context ctx;
  bool subnormals;
};

ContextObject make_context(emu::cli::RoundingOptions r, bool esr, const std::string& traps, bool subnormals) {
  if (!traps.empty()) r.traps = emu::cli::trap_flags(traps);
  ContextObject c{emu::cli::make_context(r), subnormals};
  c.ctx.control.esr = esr;
  return c;
}

// Applies op element by element to equally shaped C-order operands (the caller
// broadcasts), each element known to the context (a trap names it).
template <class Op>
py::array elementwise(ContextObject& c, const std::string& format, const std::vector<Doubles>& operands, Op op) {
  const emu::Format f = format_from(format, c.subnormals);
  const auto shape = shape_of(operands.front());
  const std::size_t n = static_cast<std::size_t>(operands.front().size());
  std::vector<const double*> in;
  for (const auto& a : operands) in.push_back(a.data());
  std::vector<double> values(n);
  {
    py::gil_scoped_release release;
    for (std::size_t i = 0; i < n; ++i) {
      emu::ElementGuard element(c.ctx, static_cast<std::int64_t>(i));
      values[i] = op(c.ctx, f, in, i);
    }
  }
  return result_array(f, values, shape);
}

// ---- quantize -----------------------------------------------------------------------

// x (C order) in consecutive blocks of a block format, as `emu quantize` with the same
// options (--overflow only where given: elements saturate by default): (values,
// elements, element_bits, scales, scale_bits, block_flags, tensor_scale, flags).
py::tuple quantize_values(const Doubles& x, const std::string& format, const std::optional<std::string>& scale_rule,
                          const emu::cli::RoundingOptions& r, bool overflow_given,
                          const std::optional<double>& tensor_scale) {
  using emu::cli::option_value;
  const emu::BlockFormat& block = *option_value("--format", [&] { return &emu::block_format_by_name(format); });
  std::optional<emu::ScaleRule> rule;
  if (scale_rule) rule = option_value("--scale-rule", [&] { return emu::scale_rule_by_name(*scale_rule); });
  emu::cli::QuantizeSetup setup = emu::cli::quantize_setup(
      block, rule, r, overflow_given, tensor_scale, tensor_scale ? emu::cli::json_number(*tensor_scale) : "");
  const emu::BlockFormat& f = *setup.format;
  const std::size_t n = static_cast<std::size_t>(x.size());
  emu::BlockQuantized q;
  {
    py::gil_scoped_release release;
    q = emu::quantize(f, {x.data(), n}, setup.spec, &setup.ctx.rng());
  }
  const auto shape = shape_of(x);
  const auto blocks = static_cast<py::ssize_t>(q.scales.size());
  py::array_t<double> values(shape), elements(shape), scales(blocks);
  py::array_t<std::uint8_t> element_bits(shape), scale_bits(blocks);
  py::array_t<std::int32_t> block_flags(blocks);
  for (std::size_t i = 0; i < n; ++i) {
    values.mutable_data()[i] = q.value(i, f);
    elements.mutable_data()[i] = q.elements[i];
    element_bits.mutable_data()[i] = static_cast<std::uint8_t>(q.element_bits[i]);
  }
  for (std::size_t b = 0; b < q.scales.size(); ++b) {
    scales.mutable_data()[b] = q.scales[b].value;
    scale_bits.mutable_data()[b] = static_cast<std::uint8_t>(q.scales[b].bits);
    block_flags.mutable_data()[b] = static_cast<std::int32_t>(q.scales[b].flags);
  }
  return py::make_tuple(values, elements, element_bits, scales, scale_bits, block_flags, q.tensor_scale,
                        static_cast<int>(q.flags));
}


// ---- dot and matmul -----------------------------------------------------------------

// The unit keyword arguments, each parsed once into the typed request (named by the
// calculator's options in the messages), resolved as emu dot and emu gemm resolve them.
emu::cli::UnitSetup unit_setup(const std::string& unit, const std::optional<std::string>& in,
                               const std::optional<std::string>& out, const std::optional<std::string>& scale_rule,
                               const std::string& rounding) {
  using emu::cli::option_value;
  emu::UnitRequest r;
  r.unit = option_value("--unit", [&] { return emu::unit_kind_by_name(unit); });
  if (in) r.in = option_value("--in", [&] { return emu::unit_input_by_name(*in); });
  if (out) r.out = emu::cli::format_named("--out", *out);
  if (scale_rule) r.scale_rule = option_value("--scale-rule", [&] { return emu::scale_rule_by_name(*scale_rule); });
  return emu::cli::unit_setup(r, rounding);
}

py::tuple dot(const Doubles& a, const Doubles& b, double c_value, const emu::cli::UnitSetup& setup,
              const emu::cli::RoundingOptions& r) {
  if (a.size() != b.size())
    throw UsageError("emu dot: --a has " + std::to_string(a.size()) + " values but --b has " + std::to_string(b.size()));
  emu::Context ctx = emu::cli::make_context(r);
  const std::size_t k = static_cast<std::size_t>(a.size());
  std::vector<emu::Exact> av(k), bv(k);
  for (std::size_t i = 0; i < k; ++i) {
    av[i] = emu::Exact{a.data()[i]};
    bv[i] = emu::Exact{b.data()[i]};
  }
  emu::cli::DotResult result;
  {
    py::gil_scoped_release release;
    result = emu::cli::unit_dot(setup, ctx, av, bv, emu::Exact{c_value});
  }
  return py::make_tuple(result.value, static_cast<int>(ctx.status()), static_cast<int>(result.input_flags),
                        setup.ready.output_format().name());
}

// x's values rounded into f as `emu gemm` rounds its inputs (convert_input): x's own
// data where every value is already one of f (checked by whole vectors for fp16 and
// fp32), else a converted copy.
const double* unit_input(const emu::Format& f, const Doubles& x, std::vector<double>& copy, const emu::Context& ctx,
                         emu::Flags& flags) {
  const double* values = x.data();
  const auto n = static_cast<std::size_t>(x.size());
  if (emu::NearestOps::first_not_value(f, values, 0, n) == n) return values;
  copy.resize(n);
  for (std::size_t e = 0; e < n; ++e) copy[e] = emu::cli::convert_input(f, emu::Exact{values[e]}, ctx, flags);
  return copy.data();
}

// A block format through the CLI's own block_gemm.
py::tuple block_matmul(const emu::cli::UnitSetup& setup, emu::Context& ctx, const Doubles& A, const Doubles& B,
                       const std::optional<Doubles>& C) {
  const std::size_t m = A.shape(0), k = A.shape(1), n = B.shape(1);
  std::vector<emu::Exact> c;
  if (C)
    for (std::size_t e = 0; e < m * n; ++e) c.push_back(emu::Exact{C->data()[e]});
  emu::cli::BlockGemmResult r;
  {
    py::gil_scoped_release release;
    r = emu::cli::block_gemm(setup, ctx, m, n, k, A.data(), B.data(), c);
  }
  emu::Flags flags = 0, input_flags = 0;
  for (std::size_t e = 0; e < m * n; ++e) {
    flags |= r.flags[e];
    input_flags |= r.input_flags[e];
  }
  const emu::Format& out = setup.ready.output_format();
  return py::make_tuple(result_array(out, r.values, {static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(n)}),
                        static_cast<int>(flags), static_cast<int>(input_flags));
}

py::tuple matmul(const Doubles& A, const Doubles& B, const std::optional<Doubles>& C, const emu::cli::UnitSetup& setup,
                 const emu::cli::RoundingOptions& r) {
  emu::Context ctx = emu::cli::make_context(r);
  if (A.ndim() != 2 || B.ndim() != 2 || (C && C->ndim() != 2))
    throw py::value_error("matmul: A, B and C must be matrices (2 dimensions)");
  const std::size_t m = A.shape(0), k = A.shape(1), n = B.shape(1);
  if (static_cast<std::size_t>(B.shape(0)) != k)
    throw UsageError("matmul: B has " + std::to_string(B.shape(0)) + " rows, but A*B with A (" + std::to_string(k) +
                     " columns) needs " + std::to_string(k));
  if (C && (static_cast<std::size_t>(C->shape(0)) != m || static_cast<std::size_t>(C->shape(1)) != n))
    throw UsageError("matmul: C is " + std::to_string(C->shape(0)) + " x " + std::to_string(C->shape(1)) +
                     ", but A*B + C needs " + std::to_string(m) + " x " + std::to_string(n));
  emu::cli::check_matrix_size("matmul: A @ B", m, n);
  if (setup.ready.block) return block_matmul(setup, ctx, A, B, C);
  const emu::MatrixUnit& unit = *setup.ready.unit;
  const emu::Format& out = unit.output_format();
  std::vector<double> a_copy, b_copy, c(m * n, 0.0);
  emu::Flags input_flags = 0;
  {
    py::gil_scoped_release release;
    const double* a = unit_input(unit.input_format(), A, a_copy, ctx, input_flags);
    const double* b = unit_input(unit.b_input_format(), B, b_copy, ctx, input_flags);
    if (C)
      for (std::size_t e = 0; e < m * n; ++e) c[e] = emu::cli::convert_input(out, emu::Exact{C->data()[e]}, ctx, input_flags);
    unit.gemm(ctx, m, n, k, a, k, b, n, c.data(), n);
  }
  return py::make_tuple(result_array(out, c, {static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(n)}),
                        static_cast<int>(ctx.status()), static_cast<int>(input_flags));
}

// ---- references for benchmarks/python_bench.py -----------------------------------

// The thread's CPU time (as benchmarks/gemm_bench.cpp measures).
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Best of `repeats` CPU times of `work` after one untimed call.
template <class Work>
double best_time(int repeats, Work work) {
  work();
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const double start = cpu_seconds();
    work();
    best = std::min(best, cpu_seconds() - start);
  }
  return best;
}

// The C++ kernel alone: round_to_float on x into a preallocated array.
double time_round_kernel(const Floats& x, const std::string& format, const emu::cli::RoundingOptions& r,
                         int repeats) {
  const emu::Format f = format_from(format, true);
  const emu::Context ctx = emu::cli::make_context(r);
  const emu::HalfRounding how(f, ctx.spec(), emu::StreamId{r.seed});
  const std::size_t n = static_cast<std::size_t>(x.size());
  std::vector<float> out(n);
  py::gil_scoped_release release;
  return best_time(repeats, [&] { emu::round_to_float(how, {x.data(), n}, out); });
}

// The unit's gemm alone on inputs already in its formats (as benchmarks/gemm_bench.cpp).
double time_unit_gemm(const Doubles& A, const Doubles& B, const std::string& unit, int repeats) {
  const emu::cli::UnitSetup setup = unit_setup(unit, std::nullopt, std::nullopt, std::nullopt, "rne");
  emu::Context ctx = emu::cli::make_context({});
  const std::size_t m = A.shape(0), k = A.shape(1), n = B.shape(1);
  std::vector<double> c(m * n);
  py::gil_scoped_release release;
  return best_time(repeats, [&] {
    std::fill(c.begin(), c.end(), 0.0);
    setup.ready.unit->gemm(ctx, m, n, k, A.data(), k, B.data(), n, c.data(), n);
  });
}

// A table's names, for formats(), units() and block_formats().
template <class T>
std::vector<std::string> names(emu::NameTable<T> table) {
  std::vector<std::string> out;
  for (const emu::Named<T>& row : table) out.emplace_back(row.name);
  return out;
}

}  // namespace

void bind_torch(py::module_& m);  // roundoff.torch's C++ half: _torch_core.cpp

PYBIND11_MODULE(_core, m) {
  m.doc() = "roundoff's C++ core (use the roundoff package, not this module)";
  m.attr("sweep_path") = ROUNDOFF_SWEEP;

  // The CLI's bad-input errors (exit status 2 there) are ValueErrors here, same message.
  py::register_exception<UsageError>(m, "UsageError", PyExc_ValueError);

  // An enabled trap: FloatingPointTrap (defined in roundoff/__init__.py, a
  // FloatingPointError) built from the C++ TrapReport's fields.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const emu::FpException& e) {
      const emu::TrapReport& r = e.report();
      const py::object element = r.element.known() ? py::object(py::int_(r.element.flat)) : py::object(py::none());
      const py::object trap = py::module_::import("roundoff").attr("FloatingPointTrap")(
          emu::flag_name(r.flag), r.scope, r.op, element, py::tuple(py::cast(r.operands)), r.result,
          static_cast<int>(r.status), r.fp_sts());
      PyErr_SetObject(trap.get_type().ptr(), trap.ptr());
    }
  });

  py::class_<emu::cli::RoundingOptions>(m, "Rounding")
      .def(py::init(&rounding_options), py::arg("rounding"), py::arg("seed"), py::arg("sr_bits"), py::arg("overflow"),
           py::arg("rng"), py::arg("tininess"));
  py::class_<emu::cli::UnitSetup>(m, "Unit")
      .def(py::init(&unit_setup), py::arg("unit"), py::arg("in_format"), py::arg("out_format"), py::arg("scale_rule"),
           py::arg("rounding"));

  m.def("round", &round_values, py::arg("x"), py::arg("format"), py::arg("rounding"), py::arg("subnormals"),
        py::arg("out") = py::none());
  m.def("bits", &bits, py::arg("x"), py::arg("format"), py::arg("subnormals"));
  m.def("from_bits", &from_bits, py::arg("b"), py::arg("format"), py::arg("subnormals"));
  m.def("info_json", [](const std::string& format, bool subnormals) {
    return emu::cli::info_json(format_from(format, subnormals));
  });
  m.def("formats", [] { return names(emu::format_table()); });
  m.def("units", [] { return names(emu::unit_table()); });
  m.def("dot", &dot);
  m.def("matmul", &matmul);
  m.def("quantize", &quantize_values);
  m.def("set_num_threads", &emu::set_gemm_threads);
  m.def("block_formats", [] { return names(emu::block_format_table()); });
  m.def("flag_names", [] {
    std::vector<std::pair<std::string, int>> out;
    for (emu::Flag f : emu::kAllFlags) out.emplace_back(emu::flag_name(f), static_cast<int>(f));
    return out;
  });
  m.def("time_round_kernel", &time_round_kernel);
  m.def("time_unit_gemm", &time_unit_gemm);
  bind_torch(m);

  py::class_<ContextObject>(m, "Context")
      .def(py::init(&make_context))
      .def_property_readonly("status", [](const ContextObject& c) { return static_cast<int>(c.ctx.status()); })
      .def("clear_status", [](ContextObject& c) { c.ctx.clear_status(); })
      .def("add", [](ContextObject& c, const std::string& f, const Doubles& a, const Doubles& b) {
        return elementwise(c, f, {a, b}, [](emu::Context& x, const emu::Format& f, auto& in, std::size_t i) {
          return x.add(f, in[0][i], in[1][i]);
        });
      })
      .def("sub", [](ContextObject& c, const std::string& f, const Doubles& a, const Doubles& b) {
        return elementwise(c, f, {a, b}, [](emu::Context& x, const emu::Format& f, auto& in, std::size_t i) {
          return x.sub(f, in[0][i], in[1][i]);
        });
      })
      .def("mul", [](ContextObject& c, const std::string& f, const Doubles& a, const Doubles& b) {
        return elementwise(c, f, {a, b}, [](emu::Context& x, const emu::Format& f, auto& in, std::size_t i) {
          return x.mul(f, in[0][i], in[1][i]);
        });
      })
      .def("div", [](ContextObject& c, const std::string& f, const Doubles& a, const Doubles& b) {
        return elementwise(c, f, {a, b}, [](emu::Context& x, const emu::Format& f, auto& in, std::size_t i) {
          return x.div(f, in[0][i], in[1][i]);
        });
      })
      .def("fma", [](ContextObject& c, const std::string& f, const Doubles& a, const Doubles& b, const Doubles& d) {
        return elementwise(c, f, {a, b, d}, [](emu::Context& x, const emu::Format& f, auto& in, std::size_t i) {
          return x.fma(f, in[0][i], in[1][i], in[2][i]);
        });
      })
      .def("sqrt", [](ContextObject& c, const std::string& f, const Doubles& a) {
        return elementwise(c, f, {a}, [](emu::Context& x, const emu::Format& f, auto& in, std::size_t i) {
          return x.sqrt(f, in[0][i]);
        });
      })
      .def("convert", [](ContextObject& c, const std::string& f, const Doubles& a) {
        return elementwise(c, f, {a}, [](emu::Context& x, const emu::Format& f, auto& in, std::size_t i) {
          return x.convert(f, in[0][i]);
        });
      });
}
