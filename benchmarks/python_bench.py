"""The Python module's speed (issue 12), as ratios to references measured in the same run,
single thread, thread CPU time, best of N after a warm-up call:
  - 10^7 float32 values rounded to fp16 through roundoff.round, rne and sr, into a new
    array (against numpy's astype(np.float16)) and into an existing one with out=
    (against numpy's copyto into a float16 array, and against emu's C++ kernel
    round_to_float alone, which writes into an existing array); targets, like against
    like: rne at least 5x numpy's speed, both within 1.25x of the kernel's time;
  - a 256^3 matmul through every unit (roundoff.matmul: input conversion, the unit's
    gemm, the result array) against the unit's C++ gemm alone on the same fp16 inputs,
    as benchmarks/gemm_bench.cpp times it; target: within 1.1x.
Run: meson test -C build --benchmark --verbose python   (or with PYTHONPATH=build/python)
"""
import time

import numpy as np

import roundoff
from roundoff import _core


def best_time(work, repeats):
    work()
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        work()
        best = min(best, time.thread_time() - start)
    return best


def main():
    roundoff.set_num_threads(1)  # thread CPU time, here and in _core's timers: one thread
    n = 10**7
    x = (np.random.default_rng(1).standard_normal(n) * 100).astype(np.float32)
    numpy_s = best_time(lambda: x.astype(np.float16), 5)
    half = np.empty(n, np.float16)
    numpy_into_s = best_time(lambda: np.copyto(half, x, casting="same_kind"), 5)
    print(f"round 10^7 float32 -> fp16, single thread (thread CPU time, best of 5)")
    print(f"  numpy astype(np.float16), a new array:   {numpy_s * 1e3:8.2f} ms  {n / numpy_s / 1e9:6.3f} Gelem/s")
    print(f"  numpy copyto, into an existing array:    {numpy_into_s * 1e3:8.2f} ms  {n / numpy_into_s / 1e9:6.3f} Gelem/s")
    failed = []
    out = np.empty(n, np.float32)
    for mode in ["rne", "sr"]:
        kernel_s = _core.time_round_kernel(x, "fp16", _core.Rounding(mode, 0, 0, "inf", "philox", "before"), 5)
        # A new result array each call, as numpy's astype; and into one array (out=), as
        # the kernel and numpy's copyto write.
        new_s = best_time(lambda: roundoff.round(x, "fp16", mode), 5)
        into_s = best_time(lambda: roundoff.round(x, "fp16", mode, out=out), 5)
        print(f"  roundoff.round {mode}, a new array:        {new_s * 1e3:8.2f} ms  {n / new_s / 1e9:6.3f} Gelem/s;"
              f"  {numpy_s / new_s:5.2f}x astype's speed")
        print(f"  roundoff.round {mode}, out=:               {into_s * 1e3:8.2f} ms  {n / into_s / 1e9:6.3f} Gelem/s;"
              f"  {numpy_into_s / into_s:5.2f}x copyto's speed; time {into_s / kernel_s:5.3f}x the C++ kernel's"
              f" ({kernel_s * 1e3:.2f} ms, into an existing array)")
        if mode == "rne" and numpy_into_s / into_s < 5:
            failed.append(f"round rne {numpy_into_s / into_s:.2f}x numpy (target >= 5x)")
        if into_s / kernel_s > 1.25:
            failed.append(f"round {mode} {into_s / kernel_s:.3f}x the kernel (target <= 1.25x)")
    print("  (a new array costs its fresh memory, which the kernel zeroes page by page: for 10^7\n"
          "   float32 values more time than the rounding itself, in numpy's astype as in roundoff.round)")

    size = 256
    rng = np.random.default_rng(2)
    A = roundoff.round(rng.standard_normal((size, size)), "fp16")[0].astype(np.float64)
    B = roundoff.round(rng.standard_normal((size, size)), "fp16")[0].astype(np.float64)
    print(f"\nmatmul {size}^3 on fp16 inputs, single thread: roundoff.matmul against the unit's C++ gemm")
    for unit in roundoff.units():
        repeats = 3
        cpp_s = _core.time_unit_gemm(A, B, unit, repeats)
        python_s = best_time(lambda: roundoff.matmul(A, B, unit=unit), repeats)
        ratio = python_s / cpp_s
        print(f"  {unit:13s} C++ {cpp_s * 1e3:9.2f} ms  Python {python_s * 1e3:9.2f} ms  {ratio:6.3f}x")
        if ratio > 1.1:
            failed.append(f"matmul {unit} {ratio:.3f}x (target <= 1.1x)")
    print("\ntargets: " + ("all met" if not failed else "NOT MET: " + "; ".join(failed)))


if __name__ == "__main__":
    main()
