"""How much of a graph-replayed decode step is host work: a step as a decoding loop makes it
(``forward_argmax``: inputs to the device, graph launch, argmax back, synchronize) against the same
captured graph launched back to back with one synchronization at the end (the GPU's own time).

    python3 bench/host_overhead.py MODEL.gguf [MODEL.gguf ...] [--order invariant] [--steps 40] [--json F]

The difference per step is what the host adds between two passes (the GPU idles while Python
prepares the next one): the most that chaining passes on the device could save. Prints one line
per model and writes the raw times as JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import replay_seconds, write_rows_json  # noqa: E402

from hiraishin.benchmark import ORDERS  # noqa: E402
from hiraishin.model.qwen3 import Qwen3  # noqa: E402


def measure(path: str, order_name: str, steps: int, profile: bool = False) -> dict:
    order = ORDERS[order_name]
    model = Qwen3.from_gguf(path, device="cuda", n_ctx=512, progress=False)
    model.use_weight_layout_for(order)  # (SUBBLOCK: the Q4_K projections as tiles)
    sync = model.backend.synchronize
    model.forward_argmax(list(range(32)), 0, order=order)
    token = 1
    for _ in range(4):  # eager pass, capture, replays
        token = int(model.forward_argmax([token], model.kv_len, order=order)[-1])
    graphs = model.pass_graphs
    captures = graphs.captures
    loop = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        token = int(model.forward_argmax([token], model.kv_len, order=order)[-1])
        loop.append(time.perf_counter() - t0)
    captures = graphs.captures - captures
    top = None
    if profile:  # where the host time of a step goes (cProfile over more steps, by own time)
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            token = int(model.forward_argmax([token], model.kv_len, order=order)[-1])
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        top = text.getvalue()
    graph = next(reversed(graphs._graphs[(order, 1)].values()))  # the graph the last steps replayed
    stream = graphs.stream
    argmax = model.pass_buffers(1)["argmax"]
    parts = {"launch_sync": [], "launch_download": [], "upload_launch_download": []}
    for _ in range(steps):  # the step's pieces: launch + synchronize; + the argmax copy; + the inputs' copy
        for name in parts:
            stream.synchronize()
            t0 = time.perf_counter()
            with stream:
                if name == "upload_launch_download":
                    graphs._upload(1, np.array([token], np.int32), model.kv_len - 1)
                graph.launch(stream)
                if name == "launch_sync":
                    stream.synchronize()
                else:
                    graphs._download(1, argmax)
            parts[name].append(time.perf_counter() - t0)
    sync()
    replay = replay_seconds(graph, stream, steps)
    step_ms, gpu_ms = 1e3 * statistics.median(loop), 1e3 * min(replay)
    return {"model": Path(path).name, "order": order.name, "steps": steps, "loop_step_ms": step_ms,
            "back_to_back_replay_ms": gpu_ms, "host_ms_per_step": step_ms - gpu_ms,
            "pieces_ms": {k: 1e3 * statistics.median(v) for k, v in parts.items()},
            "captures_during_loop": captures, "profile": top,
            "loop_s": loop, "replay_s_per_step": replay}


def add_arguments(ap: argparse.ArgumentParser, models: str = "+") -> None:
    """The models (``models``: their nargs), the order and the steps of a measurement (also
    bench/ablate_pass.py's)."""
    ap.add_argument("models", nargs=models)
    ap.add_argument("--order", default="invariant", choices=sorted(ORDERS))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--profile", action="store_true", help="also cProfile the loop and print the top functions")
    args = ap.parse_args(argv)
    rows = []
    for path in args.models:
        r = measure(path, args.order, args.steps, args.profile)
        rows.append(r)
        print(f"{r['model']}: loop step {r['loop_step_ms']:.3f} ms, back-to-back replay {r['back_to_back_replay_ms']:.3f} ms, "
              f"host {r['host_ms_per_step'] * 1e3:.0f} us per step; pieces (ms) {r['pieces_ms']}; "
              f"captures in the loop {r['captures_during_loop']}", flush=True)
        if r["profile"]:
            print(r["profile"], flush=True)
    if args.json:
        write_rows_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
