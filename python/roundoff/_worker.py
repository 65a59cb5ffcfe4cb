"""The worker process that runs a Python experiment's callable for build/sweep.

Started by sweep as ``python3 -m roundoff._worker FD TARGET CONFIG_FOLDER``, one per compute
thread; it speaks the framed protocol of experiments/sweep/python_experiment.hpp on file
descriptor FD: first the declaration ('D') or why the callable cannot be loaded ('E'), then
one reply per run request ('R' result, 'T' the roundoff.FloatingPointTrap that ended the
run, or 'F' failure with its traceback), until sweep closes its end. It ignores SIGINT and SIGTERM: sweep owns its lifetime (it kills a worker
whose run is cancelled). Before each run it sets torch's intra-op threads to 1 where torch
is imported, so that a run is a pure function of its parameters, replica and seed, and -j1
and -j2 give the same bits.
"""

import importlib
import importlib.util
import os
import signal
import struct
import sys
import traceback

import roundoff
from roundoff import experiment as _experiment

_TYPE_CODES = {"int": 0, "float": 1, "str": 2, "bool": 3}


class _Writer:
    def __init__(self, tag):
        self.parts = [tag.encode()]

    def u8(self, v): self.parts.append(struct.pack("<B", v))
    def u32(self, v): self.parts.append(struct.pack("<I", v))
    def u64(self, v): self.parts.append(struct.pack("<Q", v))
    def i64(self, v): self.parts.append(struct.pack("<q", v))
    def f64(self, v): self.parts.append(struct.pack("<d", v))

    def text(self, s):
        data = s.encode("utf-8", "replace")
        self.u64(len(data))
        self.parts.append(data)

    def doubles(self, values):
        self.u64(len(values))
        self.parts.append(struct.pack(f"<{len(values)}d", *values))

    def value(self, type_code, v):
        [self.i64, self.f64, self.text, lambda b: self.u8(1 if b else 0)][type_code](v)

    def frame(self):
        body = b"".join(self.parts)
        return struct.pack("<Q", len(body)) + body


class _Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def _take(self, n):
        if self.at + n > len(self.data):
            raise EOFError("truncated message from sweep")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk

    def u8(self): return self._take(1)[0]
    def u32(self): return struct.unpack("<I", self._take(4))[0]
    def u64(self): return struct.unpack("<Q", self._take(8))[0]
    def text(self): return self._take(self.u64()).decode("utf-8")

    def value(self):
        code = self.u8()
        if code == 0:
            return struct.unpack("<q", self._take(8))[0]
        if code == 1:
            return struct.unpack("<d", self._take(8))[0]
        if code == 2:
            return self.text()
        return self.u8() != 0


def _read_exactly(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _send(fd, writer):
    data = writer.frame()
    while data:
        data = data[os.write(fd, data):]


def _one_line(text):
    return " ".join(str(text).split())


def _load(target, config_folder):
    """The callable TARGET names: PATH.py:FUNCTION (relative to the config's folder) or
    package.module:FUNCTION (imported with the config's folder on sys.path)."""
    where, sep, function = target.rpartition(":")
    if not sep or not where or not function:
        raise ValueError(f"run: {target!r} is not PATH.py:FUNCTION or package.module:FUNCTION")
    sys.path.insert(0, config_folder)
    if where.endswith(".py"):
        path = os.path.join(config_folder, where)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no file {path}")
        name = "_roundoff_experiment_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    if not hasattr(module, function):
        raise AttributeError(f"{where} has no {function!r}")
    callable_ = getattr(module, function)
    declaration = getattr(callable_, "__roundoff_experiment__", None)
    if declaration is None:
        raise TypeError(f"{function} is not declared with @roundoff.experiment.experiment(...)")
    return callable_, declaration


def _declaration_message(d):
    w = _Writer("D")
    w.text(d.description)
    w.text(d.headline)
    w.u64(len(d.params))
    for p in d.params:
        code = _TYPE_CODES[_experiment._TYPES[p.type]]
        w.text(p.name)
        w.u8(code)
        w.value(code, p.default)
        w.text(p.meaning)
        w.u64(len(p.allowed))
        for a in p.allowed:
            w.text(a)
        for bound in (p.min, p.max):
            w.u8(bound is not None)
            w.f64(float(bound) if bound is not None else 0.0)
    w.u64(len(d.metrics))
    for m in d.metrics:
        w.text(m.name)
        w.text(m.meaning)
    w.u64(len(d.traces))
    for t in d.traces:
        w.text(t.name)
        w.text(t.meaning)
        w.text(t.x_name)
    return w


def _result_message(metrics, traces, rows):
    w = _Writer("R")
    w.u64(len(metrics))
    for name, value in metrics.items():
        w.text(name)
        w.f64(value)
    w.u64(len(traces))
    for name, (x, y) in traces.items():
        w.text(name)
        w.doubles(x)
        w.doubles(y)
    w.u64(len(rows))
    for scope, op, flag, count, element, operands in rows:
        w.text(scope)
        w.text(op)
        w.text(flag)
        w.u64(count)
        w.i64(element)
        w.doubles(operands)
    return w


def _trap_message(trap):
    """A roundoff.FloatingPointTrap the callable raised: the run's trap outcome."""
    w = _Writer("T")
    w.text(trap.flag)
    w.text(trap.scope)
    w.text(trap.op)
    w.i64(-1 if trap.element is None else int(trap.element))
    index = () if trap.index is None else tuple(trap.index)
    w.u64(len(index))
    for i in index:
        w.i64(int(i))
    w.doubles([float(v) for v in trap.operands])
    w.f64(float(trap.result))
    w.u8(int(trap.status))
    return w


def _one_thread():
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def main(argv):
    fd, target, config_folder = int(argv[1]), argv[2], argv[3]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # One worker per sweep thread (-j): emu's GEMMs in it take one thread too.
    roundoff.set_num_threads(1)
    try:
        function, declaration = _load(target, config_folder)
    except BaseException as e:  # noqa: BLE001 (any failure to load is reported, one line)
        w = _Writer("E")
        w.text(f"cannot load {target!r}: {type(e).__name__}: {_one_line(e)}")
        _send(fd, w)
        return 0
    _send(fd, _declaration_message(declaration))
    types = {p.name: p.type for p in declaration.params}
    while True:
        header = _read_exactly(fd, 8)
        if header is None:
            return 0
        body = _read_exactly(fd, struct.unpack("<Q", header)[0])
        if body is None:
            return 0
        r = _Reader(body)
        if r.u8() != ord("R"):
            raise RuntimeError("unexpected message from sweep")
        r.u32()  # the point: the callable sees its parameters, not its index
        replica, seed = r.u32(), r.u64()
        params = {}
        for _ in range(r.u64()):
            name = r.text()
            params[name] = types[name](r.value())
        _one_thread()
        try:
            result = function(params, replica, seed)
            _one_thread()
            message = _result_message(*_experiment.check_result(declaration, result))
        except roundoff.FloatingPointTrap as trap:  # an enabled trap ends the run: its outcome, not a failure
            message = _trap_message(trap)
        except Exception as e:  # noqa: BLE001 (the run fails, the worker goes on)
            message = _Writer("F")
            message.text(f"{type(e).__name__}: {_one_line(e)}")
            message.text(traceback.format_exc())
        _send(fd, message)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
