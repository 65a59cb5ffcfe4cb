// Python experiments: a config with `experiment: python` and `run: TARGET` runs a user's
// callable (declared with roundoff.experiment) under this runner, with its -j, --resume,
// shards, merge, MPI and HDF5 file unchanged. The callable runs in worker processes
// (python3 -m roundoff._worker), one per compute thread, started as they are first needed
// and spoken to over a socket; configs/README.md documents the whole design.
//
// Finding Python: the interpreter is $ROUNDOFF_PYTHON, else /usr/bin/python3. The roundoff
// package is looked for as python/roundoff/_worker.py in the folder of the running
// executable and then in each folder above it (build/sweep finds build/python; a test
// binary in build/tests/sweep finds it too); that folder is put first on the worker's
// PYTHONPATH. Not found: the worker relies on its own sys.path (an installed roundoff).
//
// Protocol (frames on the socket, fd 3 of the worker): a uint64 byte count, then the
// message: one tag byte and fields in wire.hpp's primitives (little-endian numbers; text
// and float64 arrays as a uint64 count, then their bytes or values).
//   worker -> sweep, once, first:
//     'D' declaration: text description, text headline;
//         params: count, each text name, u8 type (0 int, 1 float, 2 str, 3 bool), the
//         default (i64 | f64 | text | u8), text meaning, allowed (count, texts),
//         u8 has_min, f64 min, u8 has_max, f64 max;
//         metrics: count, each text name, text meaning;
//         traces: count, each text name, text meaning, text x_name
//     'E' cannot load the callable: text message (one line)
//   sweep -> worker: 'R' run: u32 point, u32 replica, u64 seed, params: count, each text
//         name, u8 type, the value
//   worker -> sweep, one per 'R':
//     'R' result: metrics: count, each text name, f64; traces: count, each text name,
//         f64 array x, f64 array y; fp_counts: count, each text scope, text op, text flag,
//         u64 count, i64 element (flat index, -1 none), f64 array operands
//     'T' a roundoff.FloatingPointTrap ended the run (its trap outcome, as fp_exceptions:
//         trap): text flag, text scope, text op, i64 element (-1 none), index: count (at
//         most 4), each i64; f64 array operands, f64 result, u8 status (emu::Flags)
//     'F' the run failed: text message (one line), text traceback
//   End: the sweep closes its end; the worker exits.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "experiments/experiment.hpp"

namespace roundoff::sweep {

// The callable cannot be loaded (not found, an import error, no declaration): one line.
class PythonLoadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The experiment `run_target` declares (run: PATH.py:FUNCTION, a path relative to
// `config_folder`, or package.module:FUNCTION, imported with `config_folder` on sys.path).
// Its `run` hands each run to a worker: a callable that raises roundoff.FloatingPointTrap
// throws emu::FpException (the run's trap outcome); one that raises anything else, or a
// worker that dies, throws RunRaised (that run fails); a cancelled run kills its worker. Throws
// PythonLoadError.
std::shared_ptr<const Experiment> load_python_experiment(const std::string& run_target, const std::string& config_folder);

// The seed a Python run receives: the first 64-bit draw of Philox4x32-10 on its stream
// (seed, point, replica, lane 0), as every experiment's random stream starts.
std::uint64_t python_run_seed(const emu::StreamId& stream);

}  // namespace roundoff::sweep
