"""Where the CPU replay's time goes: the replay of measure.py run in-process with a timer around each
op's emulator, plus cProfile's top functions by own time.

    python bench/results/2026-12-01-cpu-replay/profile_replay.py MODEL.gguf > profile_after.txt
"""

from __future__ import annotations

import collections
import cProfile
import importlib
import io
import pstats
import sys
import time

from hiraishin.decode.replay import replay
from hiraishin.kernels import mmvq
from hiraishin.model.qwen3 import Qwen3
from hiraishin.order import ReductionOrder

IDS = [100 + 7 * i for i in range(64)]  # measure.py's 64 positions
SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()


def timed(module, name: str, key) -> None:
    f = getattr(module, name)

    def wrapper(*a, **kw):
        t = time.perf_counter()
        r = f(*a, **kw)
        SECONDS[key(a)] += time.perf_counter() - t
        CALLS[key(a)] += 1
        return r

    setattr(module, name, wrapper)


def main() -> None:
    # the CPU backend calls these through the op packages (hiraishin.kernels.<op>.emulate)
    timed(mmvq, "emulate", lambda a: f"mmvq {a[1]} {a[2].shape[0]} col")
    for op in ("attention", "rmsnorm", "quantize", "rope"):
        timed(importlib.import_module(f"hiraishin.kernels.{op}"), "emulate", lambda a, op=op: op)
    order = ReductionOrder.BATCH_INVARIANT
    model = Qwen3.from_gguf(sys.argv[1], device="cpu", n_ctx=64, progress=False)
    model.reset()
    model.forward(IDS[:1], 0, order=order)  # compile / load the Numba cache
    SECONDS.clear()
    CALLS.clear()
    prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    rep = replay(model, IDS, [2, 3, 5, 9, 16], order=order)
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"replay: wall {wall:.1f} s, CPU {cpu:.1f} s, bit-identical {rep.identical}; phases (s) "
          + ", ".join(f"{k} {v:.1f}" for k, v in rep.timings.items()))
    print("per op (wall s, calls):")
    for k, v in sorted(SECONDS.items(), key=lambda kv: -kv[1]):
        print(f"  {v:7.2f}  {CALLS[k]:6d}  {k}")
    print(f"  {sum(SECONDS.values()):7.2f}  timed ops together")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
    print("cProfile, top 12 by own time:")
    print(s.getvalue()[s.getvalue().index("   ncalls"):].rstrip())


if __name__ == "__main__":
    main()
