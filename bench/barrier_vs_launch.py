"""What one dependent step costs on the device: a kernel launch in a CUDA graph (with and without
programmatic dependent launch) against a grid-wide barrier inside one persistent kernel.

A decode pass is a chain of about ten dependent launches a layer, and the ablations say each costs
its place in the chain whatever it does (session 13: the norm launch replaced by an elementwise one
of the same reads and writes saved 11 of its 98 µs a 0.6B pass). A persistent kernel per layer would
put grid barriers where the launches are; it pays only if a barrier is cheaper than a launch
boundary. Both are timed here with the same trivial step: every CUDA block reads, from L2, the
value another block wrote in the step before and writes its own (so each step depends on the last).

    python3 bench/barrier_vs_launch.py [--steps 256] [--blocks 132,264,528,1056] [--threads 128]
                                       [--only last,one-block] [--json F]

Chains: ``--steps`` launches of a grid of B blocks captured in one graph (PDL: the launches made with
programmatic stream serialization, each block waiting in ``griddepcontrol.wait``), replayed back to
back. Persistent: one cooperative launch of B blocks doing ``--steps`` steps with a barrier after
each (an atomic arrival on a global counter, then a spin on it with acquire loads; or the tree form:
arrivals on one counter per group of TREE_GROUP blocks, the groups' last arrivals on the root, a step
flag raised by the last of all that every block spins on), timed at
``steps`` and ``2 * steps`` so that the launch itself drops out. Prints µs per step; the JSON holds
the raw seconds.

Last block: several launches of a pass are a wide kernel followed by a small one-block step over
what all its blocks wrote (an RMSNorm over a row, an attention combine). Each is a place in the chain,
so fusing the small step into the tail of the wide kernel could save a launch boundary: every block
writes its value, makes it visible (``__threadfence``) and counts itself in (``atomicAdd``); the block
that arrives last does the one-block step and resets the counter (so a graph can replay it). It
still waits for the slowest block, as a second launch would, but pays an atomic a block instead of a
launch boundary. Both are timed as ``--steps`` dependent pairs in one graph, all launches PDL: a
wide step (B blocks, each reading the one-block step's last output) then a one-block step (one block
of ``--threads`` summing the B values) as two launches, against one launch of the wide step whose
last block does the sum.
Before timing, one replay from zeroed buffers must give both the same bits (the same sums in the same
order) and leave the counter at 0. Prints µs per pair; the JSON holds seconds per pair.
``--only`` (substrings of the kind names, comma-separated) times some kinds only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import capture_chain, replay_seconds, write_rows_json  # noqa: E402

KERNELS = r"""
// One step of a chain: block b writes dst[b] = src[(b + 1) % gridDim.x] + 1 (read from L2: another
// block wrote it in the step before).
extern "C" __global__ void hx_chain_step(const float* src, float* dst) {
    HX_PDL_ENTRY();
    if (threadIdx.x == 0) {
        dst[blockIdx.x] = __ldcg(src + (blockIdx.x + 1) % gridDim.x) + 1.0f;
    }
}

__device__ __forceinline__ unsigned int hx_load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The same steps in one launch, a grid barrier after each: thread 0 of every block makes its writes
// visible (__threadfence), arrives (atomicAdd) and spins until all gridDim.x blocks of this step have.
// count[0] is the one counter; with HX_TREE set, blocks arrive in groups of HX_TREE at count[1 + group],
// the last of a group arrives at count[0] for it, and the last group's last block raises the step number
// in count[1 + ngroups], which every block spins on (fewer arrivals on one address).
#ifndef HX_TREE
#define HX_TREE 0
#endif
__device__ __forceinline__ void hx_grid_barrier(unsigned int* count, const int s) {
    const unsigned int g = gridDim.x;
#if HX_TREE == 0
    atomicAdd(count, 1u);
    while (hx_load_acquire(count) < (unsigned int)(s + 1) * g) {
    }
#else
    const unsigned int group = blockIdx.x / HX_TREE;
    const unsigned int ngroups = (g + HX_TREE - 1) / HX_TREE;
    const unsigned int members = min((unsigned int)HX_TREE, g - group * HX_TREE);
    unsigned int* flag = count + 1 + ngroups;
    if (atomicAdd(count + 1 + group, 1u) == (unsigned int)(s + 1) * members - 1) {  // the group's last
        if (atomicAdd(count, 1u) == (unsigned int)(s + 1) * ngroups - 1) {          // the grid's last
            __threadfence();
            atomicExch(flag, (unsigned int)(s + 1));
        }
    }
    while (hx_load_acquire(flag) < (unsigned int)(s + 1)) {
    }
#endif
}

extern "C" __global__ void hx_persistent_steps(float* a, float* b, unsigned int* count, const int steps) {
    const unsigned int g = gridDim.x;
    for (int s = 0; s < steps; ++s) {
        const float* src = (s & 1) ? b : a;
        float* dst = (s & 1) ? a : b;
        if (threadIdx.x == 0) {
            dst[blockIdx.x] = __ldcg(src + (blockIdx.x + 1) % g) + 1.0f;
            __threadfence();
            hx_grid_barrier(count, s);
        }
        __syncthreads();
    }
}

// A wide step then a one-block step over what it wrote. Wide: block b writes many[b] = one[0] + b
// (one[0]: the one-block step before, read from L2).
extern "C" __global__ void hx_wide_step(const float* one, float* many) {
    HX_PDL_ENTRY();
    if (threadIdx.x == 0) {
        many[blockIdx.x] = __ldcg(one) + (float)blockIdx.x;
    }
}

// One block sums many[0..n) (strided loads from L2, then a shared-memory tree over any blockDim.x up
// to HX_ONE_MAX_THREADS); thread 0 writes one[0] = sum * 1e-6 (the values stay small). Called by every
// thread of the block.
#define HX_ONE_MAX_THREADS 1024
__device__ __forceinline__ void hx_one_block_sum(const float* many, float* one, const int n) {
    __shared__ float part[HX_ONE_MAX_THREADS];
    const unsigned int t = threadIdx.x;
    float sum = 0.0f;
    for (int i = t; i < n; i += blockDim.x) {
        sum += __ldcg(many + i);
    }
    part[t] = sum;
    __syncthreads();
    // halve from the power of two at or above blockDim.x, so any block size works
    for (unsigned int w = (1u << (32 - __clz(blockDim.x - 1))) / 2; w > 0; w /= 2) {
        if (t < w && t + w < blockDim.x) {
            part[t] += part[t + w];
        }
        __syncthreads();
    }
    if (t == 0) {
        one[0] = part[0] * 1e-6f;
    }
}

extern "C" __global__ void hx_one_step(const float* many, float* one, const int n) {
    HX_PDL_ENTRY();
    hx_one_block_sum(many, one, n);
}

// Both in one launch: each block writes its value as hx_wide_step, makes it visible and counts itself
// in; the block that arrives last (every other value is then visible to it) does hx_one_step's work
// and resets the counter for the next launch.
extern "C" __global__ void hx_wide_last(const float* one_in, float* many, float* one_out, unsigned int* count) {
    HX_PDL_ENTRY();
    __shared__ bool is_last;
    if (threadIdx.x == 0) {
        many[blockIdx.x] = __ldcg(one_in) + (float)blockIdx.x;
        __threadfence();
        is_last = atomicAdd(count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last) {
        return;
    }
    __threadfence();
    hx_one_block_sum(many, one_out, gridDim.x);
    if (threadIdx.x == 0) {
        *count = 0;
    }
}
"""


def _kernels():
    import cupy

    from hiraishin.kernels.compile import NVRTC_OPTIONS, load_source
    from hiraishin.kernels.pdl import PdlKernel

    code = load_source() + KERNELS
    mod = cupy.RawModule(code=code, options=NVRTC_OPTIONS, backend="nvrtc")
    # cooperative launches: a grid that cannot be co-resident is an error, not a hang
    persistent = {tree: cupy.RawKernel(f"#define HX_TREE {tree}\n" + code, "hx_persistent_steps", options=NVRTC_OPTIONS,
                                       backend="nvrtc", enable_cooperative_groups=True) for tree in (0, TREE_GROUP)}
    tail = {name: PdlKernel(mod.get_function(name), True) for name in ("hx_wide_step", "hx_one_step", "hx_wide_last")}
    return PdlKernel(mod.get_function("hx_chain_step"), True), persistent, tail


# Blocks per first-level counter of the tree barrier (a guess to try, not a tuned figure).
TREE_GROUP = 16


def chain_seconds(step, blocks: int, threads: int, steps: int, pdl: bool, replays: int) -> float:
    """Seconds per launch of ``steps`` dependent launches captured in one graph (replayed back to back)."""
    import cupy

    a = cupy.zeros(blocks, cupy.float32)
    b = cupy.zeros(blocks, cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    graph = capture_chain(stream, lambda s: step((blocks,), (threads,), (a, b) if s % 2 == 0 else (b, a)), steps, pdl)
    graph.launch(stream)
    per_graph = min(replay_seconds(graph, stream, replays))
    return per_graph / steps


def tail_seconds(tail: dict, blocks: int, threads: int, steps: int, last_block: bool, replays: int):
    """Seconds per pair of ``steps`` dependent (wide step, one-block step) pairs captured in one graph
    under PDL: two launches a pair, or one hx_wide_last launch (``last_block``). Also returns both
    one-block outputs after one replay from zeroed buffers (the two ways must agree bit for bit)."""
    import cupy

    one_a = cupy.zeros(1, cupy.float32)
    one_b = cupy.zeros(1, cupy.float32)
    many = cupy.zeros(blocks, cupy.float32)
    count = cupy.zeros(1, cupy.uint32)

    def pair(s):
        src, dst = (one_a, one_b) if s % 2 == 0 else (one_b, one_a)
        if last_block:
            tail["hx_wide_last"]((blocks,), (threads,), (src, many, dst, count))
        else:
            tail["hx_wide_step"]((blocks,), (threads,), (src, many))
            tail["hx_one_step"]((1,), (threads,), (many, dst, cupy.int32(blocks)))

    stream = cupy.cuda.Stream(non_blocking=True)
    graph = capture_chain(stream, pair, steps)
    with stream:
        for buf in (one_a, one_b, many, count):
            buf.fill(0)
        graph.launch(stream)
        stream.synchronize()
        outputs = cupy.concatenate([one_a, one_b]).get()
        if int(count.get()[0]) != 0:
            raise RuntimeError(f"hx_wide_last left its counter at {int(count.get()[0])}, not 0")
    per_graph = min(replay_seconds(graph, stream, replays))
    return per_graph / steps, outputs


def persistent_seconds(kernel, blocks: int, threads: int, steps: int, repeats: int = 5) -> float:
    """Seconds per step of the persistent kernel: (time of 2 * steps - time of steps) / steps, best of
    ``repeats`` each."""
    import cupy

    a = cupy.zeros(blocks, cupy.float32)
    b = cupy.zeros(blocks, cupy.float32)
    count = cupy.zeros(2 + blocks, cupy.uint32)  # the root, one counter per group, the step flag

    def once(n: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            count.fill(0)
            cupy.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            kernel((blocks,), (threads,), (a, b, count, cupy.int32(n)))
            cupy.cuda.runtime.deviceSynchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    once(steps)  # load
    return (once(2 * steps) - once(steps)) / steps


KINDS = ("launch chain", "launch chain, PDL", "persistent, grid barrier",
         f"persistent, tree barrier ({TREE_GROUP})")
# timed per pair (a wide step and a one-block step), not per step
TAIL_KINDS = ("wide + one-block step, two PDL launches", "wide step, last block does the one-block step")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--blocks", default="132,264,528,1056")
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated substrings of the kind names to time (default all)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    only = [o for o in args.only.split(",") if o]
    wanted = [k for k in KINDS + TAIL_KINDS if not only or any(o in k for o in only)]
    if not wanted:
        ap.error(f"--only {args.only!r} matches none of: {', '.join(KINDS + TAIL_KINDS)}")
    width = max(len(k) for k in wanted)
    step, persistent, tail = _kernels()
    rows = []
    for blocks in (int(b) for b in args.blocks.split(",")):
        outputs = {}
        for kind in wanted:
            if kind in TAIL_KINDS:
                s, outputs[kind] = tail_seconds(tail, blocks, args.threads, args.steps, "last block" in kind,
                                                args.replays)
                rows.append({"kind": kind, "blocks": blocks, "threads": args.threads, "steps": args.steps,
                             "seconds_per_pair": s})
                print(f"{blocks:5d} blocks x {args.threads} threads  {kind:{width}s} {1e6 * s:6.2f} us a pair",
                      flush=True)
                continue
            if kind.startswith("persistent"):
                tree = TREE_GROUP if "tree" in kind else 0
                s = persistent_seconds(persistent[tree], blocks, args.threads, args.steps)
            else:
                s = chain_seconds(step, blocks, args.threads, args.steps, kind.endswith("PDL"), args.replays)
            rows.append({"kind": kind, "blocks": blocks, "threads": args.threads, "steps": args.steps,
                         "seconds_per_step": s})
            print(f"{blocks:5d} blocks x {args.threads} threads  {kind:{width}s} {1e6 * s:6.2f} us a step", flush=True)
        if len(outputs) == 2 and (outputs[TAIL_KINDS[0]] != outputs[TAIL_KINDS[1]]).any():
            raise RuntimeError(f"{blocks} blocks: the last-block kernel gave {outputs[TAIL_KINDS[1]]}, "
                               f"the two launches {outputs[TAIL_KINDS[0]]}")
    if args.json:
        write_rows_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
