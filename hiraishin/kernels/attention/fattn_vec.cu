// Split-KV vector flash attention over an f16 K/V cache, and the combine of its partial results.
//
// The geometry is llama.cpp's flash_attn_ext_vec<D, ncols, F16, F16> (ggml/src/ggml-cuda/fattn-vec.cuh,
// reference section 6.3) with IEEE arithmetic instead of fast-math:
//   * block (32, 4): 4 warps; lane = 8*g + r (4 groups g of 8 threads r);
//   * grid (ceil(n_tokens / NCOLS), P, n_head); query head h reads KV head h / (n_head / n_head_kv);
//   * block y walks chunks y, y+P, y+2P, ... of `chunk_cells` cells (a multiple of 128) over
//     [0, kv_attended), 128 cells per step, one cell per thread;
//   * K.Q of a cell: each of the 8 threads r of a group does 16 (D=128) fmas over dims
//     [8r, 8r+8) then [64+8r, 64+8r+8), then an xor 4, 2, 1 butterfly; thread tid keeps cell k0+tid;
//   * one running max per warp (with FATTN_KQ_MAX_OFFSET), one running sum per thread;
//   * V: group g of warp w accumulates cells 32w + g + 4t, t = 0..7, into its 16 output dims;
//   * end of block: block max over the 4 warps, rescale, per-warp then cross-warp butterfly sums,
//     then o[d] = sum of the 16 (warp, group) partials, warp-major, group-minor.
// P == 1: dst = o / S (compiled after quantize/quantize_q8_1.cu with HX_ATTN_Q8_1: also, or only, its
// q8_1 in the output projection's layout, as quantize_q8_1 would write it: one launch fewer a layer).
// P > 1: parts = o, meta = (block max, S), merged by fattn_combine in block order.
//
// fattn_vec_shared (SHARE_KV): the same arithmetic per query, but a block holds FV_SHARED_Q queries
// of ONE KV head (grid (ceil(n_tokens * G / FV_SHARED_Q), P, n_head_kv), G = n_head / n_head_kv;
// query i of KV head kh is token i / G of query head kh*G + i % G), so every K/V element a thread
// loads serves all of them: a verify pass reads each KV head's cells ceil(T*G / FV_SHARED_Q) times
// instead of T*G times. Per query the float operations and their order are those of fattn_vec_q1
// (the loop over the block's queries is innermost and no value crosses queries); the scaled queries
// live in shared memory (or, FV_SHARED_QREG, in registers), which changes no value. The queries'
// accumulator state (16 x D partials each, in registers) is what bounds FV_SHARED_Q.
//
// Every rounding-relevant float op is an explicit intrinsic; exp is hx_expf (fp.cuh). The Numba
// emulator (emulate.py) performs the same operations in the same order, for every kernel here.
// Needs fp.cuh prepended and HX_D (64 or 128) defined.

#ifndef HX_D
#error "define HX_D (head dimension, 64 or 128)"
#endif
static_assert(HX_D == 64 || HX_D == 128, "fattn_vec supports head dimensions 64 and 128");

#ifndef FV_SKIP_PAST_FILLED
#define FV_SKIP_PAST_FILLED 1
#endif
#define FV_NWARPS 4
#define FV_NTHREADS 128
#define FV_DIM_SLICES (HX_D / 64)  // 8-dim slices a thread owns: dims 64*b + 8*r + e, e = 0..7
#define FV_DIMS (8 * FV_DIM_SLICES)
// llama.cpp FATTN_KQ_MAX_OFFSET = 3.0f*0.6931f (fattn-common.cuh, since PR #18614)
#define FV_KQ_MAX_OFFSET 2.0792999267578125f
#define FV_NEG_HALF_FLT_MAX __int_as_float(0xfeffffff)  // -FLT_MAX/2, the initial running max
#define FV_NEG_INF __int_as_float(0xff800000)

// 8 consecutive halves (16 bytes, one load) -> 8 floats, in memory order.
__device__ __forceinline__ void fv_unpack8(const uint4 raw, float* __restrict__ out) {
    const unsigned int words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        out[2 * k + 0] = hx_h2f((unsigned short)(words[k] & 0xffffu));
        out[2 * k + 1] = hx_h2f((unsigned short)(words[k] >> 16));
    }
}

// Thread r's dims of cell n of one KV head (K or V rows from `head`), 0.0f past the filled cells, in two
// halves: the loads (fv_load_cell_raw) and the values (fv_unpack_cell), so a caller may issue the loads
// early and convert later (FV_V_WITH_K). Branch-free: a cell past kv_len loads the last filled cell
// instead and selects zeros, so the loads of a step's 8 cells carry no branch between them and are issued
// together (with a branch per cell, nvcc sm_90 put each load in its own reconvergence region: 16
// dependent memory round trips per 128-cell step). The values are those of a guarded load: no float
// operation changes.
__device__ __forceinline__ void fv_load_cell_raw(const unsigned short* __restrict__ head, const int n, const int kv_len,
                                                 const size_t cell_stride, const int r, uint4* __restrict__ raw) {
    const size_t cell = (size_t)(n < kv_len ? n : kv_len - 1);
#pragma unroll
    for (int b = 0; b < FV_DIM_SLICES; ++b) {
        raw[b] = *reinterpret_cast<const uint4*>(head + cell * cell_stride + 64 * b + 8 * r);
    }
}
__device__ __forceinline__ void fv_unpack_cell(const uint4* __restrict__ raw, const bool live, float* __restrict__ out) {
#pragma unroll
    for (int b = 0; b < FV_DIM_SLICES; ++b) fv_unpack8(raw[b], out + 8 * b);
#pragma unroll
    for (int i = 0; i < FV_DIMS; ++i) out[i] = live ? out[i] : 0.0f;
}
__device__ __forceinline__ void fv_load_cell(const unsigned short* __restrict__ head, const int n, const int kv_len,
                                             const size_t cell_stride, const int r, float* __restrict__ out) {
    uint4 raw[FV_DIM_SLICES];
    fv_load_cell_raw(head, n, kv_len, cell_stride, r, raw);
    fv_unpack_cell(raw, n < kv_len, out);
}

// FV_V_WITH_K (fused/launch.py ATTN_EARLY): fattn_vec_q1_rope issues a step's V loads together with its K
// loads, holding V's raw halves in registers across K.Q and the softmax, where it loaded V after the
// softmax (asking L2 for it first): one memory round trip fewer a step, on a one-token pass's critical
// path. Scheduling only: the same values and float operations. Not in fattn_vec_q1: its registers
// (153 -> 218 at D = 128, nvcc sm_90) would lower its occupancy, from which BATCH_VARIANT's plans size
// their parallel blocks, and so change that order's bits.
#ifndef FV_V_WITH_K
#define FV_V_WITH_K 0
#endif

// FV_CACHE_EARLY (fused/launch.py ATTN_EARLY 3; PDL triggering after the wait): fattn_vec_q1_rope loads the K
// (and, with FV_V_WITH_K, V) cells of its first 128-cell step before it waits for the previous kernel, and takes
// the pass's own cells, which it writes itself, from shared memory as it stored them. The cells before the
// pass's were written by earlier passes; every kernel triggers its dependents only after its own wait, so when
// this kernel's blocks start, every kernel two or more back in the chain (all of those writers) has finished.
// Cells past the pass's are never written in it and their values are selected to 0 as before (a select, not a
// product, so what they hold cannot matter). A pass's cells are consecutive and end at kv_len - 1; any of them
// in a block's first step lies in the block's first chunk, so the block stored it (fattn_vec_q1_rope). The same
// values and float operations.
#ifndef FV_CACHE_EARLY
#define FV_CACHE_EARLY 0
#endif
// The tokens whose k rows fattn_vec_q1_rope's block may norm (a verify pass: at most 16). FV_CACHE_EARLY builds
// are made for their pass's width (fused/launch.py attn_early_build): its per-token arrays are live while the
// preloaded cells are, and 16 tokens' worth beside those would not fit the registers. Only one-token builds
// preload the first step's V cells as well (FV_PRELOAD_V): nvcc sm_90 fits them at 252 registers there, and
// spilled at two tokens and more.
#ifndef FV_ROPE_MAX_TOKENS
#define FV_ROPE_MAX_TOKENS 16
#endif
#define FV_PRELOAD_V (FV_V_WITH_K && FV_ROPE_MAX_TOKENS == 1)
struct fv_preloaded {              // a thread's cells of its block's first step (FV_CACHE_EARLY)
    uint4 k[8][FV_DIM_SLICES];     // K phase cells 32w + 8g + t
    uint4 v[FV_PRELOAD_V ? 8 : 1][FV_DIM_SLICES];  // V phase cells 32w + g + 4t (FV_PRELOAD_V)
    const unsigned short* own_k;   // shared memory: the pass's cells (token-major, D halves each) as the block
    const unsigned short* own_v;   // stored them
};
// Thread r's raw halves of a preloaded cell, or, where it is the pass's cell j (0 <= j < tokens), of the block's
// copy in shared memory.
__device__ __forceinline__ void fv_pick_cell(const uint4* __restrict__ pre, const unsigned short* own, const int j,
                                             const int tokens, const int r, uint4* __restrict__ raw) {
    const bool is_own = FV_ROPE_MAX_TOKENS == 1 ? j == 0 : j >= 0 && j < tokens;
    // in bounds whichever is read (a one-token build's copy is the only one: no index, fewer registers)
    const unsigned short* cell = own + (FV_ROPE_MAX_TOKENS == 1 ? 0 : (size_t)(is_own ? j : 0) * HX_D);
#pragma unroll
    for (int b = 0; b < FV_DIM_SLICES; ++b) {
        raw[b] = is_own ? *reinterpret_cast<const uint4*>(cell + 64 * b + 8 * r) : pre[b];
    }
}

// fattn_vec_shared's queries per block and cell-loop unroll (launch.py passes both)
#ifndef FV_SHARED_Q
#define FV_SHARED_Q 4
#endif
#ifndef FV_SHARED_UNROLL
#define FV_SHARED_UNROLL 1
#endif
#ifndef FV_SHARED_QREG  // 1: fattn_vec_shared keeps its scaled queries in registers, not shared memory
#define FV_SHARED_QREG 0
#endif

// Q_HEAD (fattn_vec_q1_rope): Q is the block's one query row itself (D floats, in shared memory), not
// the (n_tokens, n_head, D) array; NCOLS 1, n_tokens 1.
template <int NCOLS, bool SHARE_KV, bool Q_HEAD = false>
__device__ __forceinline__ void fattn_vec_impl(
    const float* __restrict__ Q,            // (n_tokens, n_head, D) float32
    const unsigned short* __restrict__ K,   // (n_ctx, n_head_kv, D) f16 bits
    const unsigned short* __restrict__ V,   // (n_ctx, n_head_kv, D) f16 bits
    const int* __restrict__ q_pos,          // (n_tokens,) absolute positions
    float* __restrict__ dst,                // (n_tokens, n_head, D), written when P == 1
    float* __restrict__ parts,              // (n_tokens, n_head, P, D), written when P > 1
    float* __restrict__ meta,               // (n_tokens, n_head, P, 2), written when P > 1
    const int n_tokens, const int n_head, const int n_head_kv, const int kv_len_arg,
    const int kv_attended, const int chunk_cells, const float scale,
    unsigned char* __restrict__ yq,         // HX_ATTN_Q8_1, P == 1: the rows (n_tokens, n_head*D) as q8_1
    const fv_preloaded* pre = nullptr) {    // FV_CACHE_EARLY (fattn_vec_q1_rope): the first step's cells
    // (dst, when not null, is written as well; without HX_ATTN_Q8_1 yq is not read)
    constexpr int D = HX_D;
    // kv_len_arg < 0: the KV length is the last query's position + 1, read from q_pos (a forward
    // pass's queries are the cache's last cells), so a CUDA graph of the pass replays at any position.
    const int kv_len = kv_len_arg >= 0 ? kv_len_arg : q_pos[n_tokens - 1] + 1;
    constexpr int KQ_SHARED = (NCOLS * FV_NTHREADS > 16 * D) ? NCOLS * FV_NTHREADS : 16 * D;
    __shared__ float KQ[KQ_SHARED];  // softmax weights of the current step, later the 16 partials
    __shared__ float KQ_max_sh[NCOLS][32];
    __shared__ float KQ_sum_sh[NCOLS][32];
    // cells per step a thread unrolls: all 8 for one or two queries; fewer for the shared kernel,
    // whose queries' accumulators already fill the registers (scheduling only, same operations)
    constexpr int CELL_UNROLL = SHARE_KV ? FV_SHARED_UNROLL : 8;
    constexpr bool Q_REGS = !SHARE_KV || FV_SHARED_QREG;
    constexpr bool V_EARLY = FV_V_WITH_K && Q_HEAD;  // a step's V loaded with its K (fattn_vec_q1_rope)
    constexpr bool PRELOADED = FV_CACHE_EARLY && Q_HEAD;  // the first step's cells loaded before the wait
    // the pass's cells, the last own_tokens (a one-token build: its constant 1, which saves registers)
    const int own_tokens = FV_ROPE_MAX_TOKENS == 1 ? 1 : n_tokens;
    const int own_first = kv_len - own_tokens;
    // SHARE_KV keeps more in shared memory to leave registers to the accumulators: the scaled
    // queries, their positions, and each thread's own score of the step (in its KQ slot)
    alignas(16) __shared__ float Q_sh[Q_REGS ? 1 : NCOLS][D];
    __shared__ int pos_sh[SHARE_KV ? NCOLS : 1];

    const int lane = threadIdx.x;
    const int w = threadIdx.y;
    const int tid = 32 * w + lane;
    const int g = lane / 8;
    const int r = lane % 8;
    const int P = gridDim.y;
    const int y = blockIdx.y;
    const int ratio = n_head / n_head_kv;
    const int kv_head = SHARE_KV ? (int)blockIdx.z : (int)blockIdx.z / ratio;
    // Query j of the block: its token and query head.
    const int i0 = blockIdx.x * NCOLS;
    auto token_of = [&](int j) { return SHARE_KV ? (i0 + j) / ratio : i0 + j; };
    auto head_of = [&](int j) { return SHARE_KV ? kv_head * ratio + (i0 + j) % ratio : (int)blockIdx.z; };
    const size_t cell_stride = (size_t)n_head_kv * D;
    const unsigned short* Kh = K + (size_t)kv_head * D;
    const unsigned short* Vh = V + (size_t)kv_head * D;

    // Q of this thread's dims, scaled (one RN product each). A missing query (odd n_tokens in a
    // 2-query block, the tail of the last shared block) sees no cell: position -1.
    float q[Q_REGS ? NCOLS : 1][FV_DIMS];
    int pos[NCOLS];
#pragma unroll
    for (int j = 0; j < NCOLS; ++j) {
        const int t = token_of(j);
        pos[j] = t < n_tokens ? q_pos[t] : -1;
        if constexpr (SHARE_KV) {
            if (tid == 0) pos_sh[j] = pos[j];
        }
        if constexpr (Q_REGS) {
            const float* Qt = Q_HEAD ? Q : Q + ((size_t)(t < n_tokens ? t : 0) * n_head + head_of(j)) * D;
#pragma unroll
            for (int b = 0; b < FV_DIM_SLICES; ++b) {
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    q[j][8 * b + e] = t < n_tokens ? __fmul_rn(Qt[64 * b + 8 * r + e], scale) : 0.0f;
                }
            }
        }
    }
    if constexpr (!Q_REGS) {
        for (int l = tid; l < NCOLS * D; l += FV_NTHREADS) {
            const int j = l / D;
            const int t = token_of(j);
            Q_sh[j][l % D] = t < n_tokens ? __fmul_rn(Q[((size_t)t * n_head + head_of(j)) * D + l % D], scale)
                                          : 0.0f;
        }
    }
    if constexpr (SHARE_KV) __syncthreads();  // pos_sh (and Q_sh) written

    float M[NCOLS];     // running max of this warp (all lanes hold the same value)
    float Ssum[NCOLS];  // running sum of this thread's cells
    float VKQ[NCOLS][FV_DIMS];
#pragma unroll
    for (int j = 0; j < NCOLS; ++j) {
        M[j] = FV_NEG_HALF_FLT_MAX;
        Ssum[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < FV_DIMS; ++i) VKQ[j][i] = 0.0f;
    }

    // A step whose 128 cells all lie past the filled cache (the padding to 256 cells, or a whole chunk
    // of a block) is skipped: its every cell is masked, so it would leave the state as it is (a =
    // hx_expf(0) = 1, p = hx_expf(-inf) = 0: M, Ssum and VKQ unchanged but for a -0 accumulator turning
    // +0, which the sum of the 16 partials, started at +0, cannot tell). kv_len is the block's, so the
    // skip is uniform. A block left with nothing to walk writes the initial state, as it did after
    // walking masked cells; the emulator skips the same steps. FV_SKIP_PAST_FILLED 0 walks them (a shim
    // test checks that both give the same bits).
    // H200, SUBBLOCK 9 / 16-token passes at 48 cells: 3.925 -> 3.894 / 4.104 -> 4.080 ms, same digests
    // (bench/results/2026-12-04-h200-session15/c-skip-long-kv).
    const int n_chunks = kv_attended / chunk_cells;
    const int walk_end = FV_SKIP_PAST_FILLED ? kv_len : kv_attended;
    for (int c = y; c < n_chunks && c * chunk_cells < walk_end; c += P) {
        for (int k0 = c * chunk_cells; k0 < (c + 1) * chunk_cells && k0 < walk_end; k0 += FV_NTHREADS) {
            // the block's first step, whose cells were loaded before the wait (FV_CACHE_EARLY; the pass's own cells,
            // the last n_tokens, from the block's shared copy)
            const bool first = PRELOADED && c == y && k0 == c * chunk_cells;
            uint4 v_raw[V_EARLY ? 8 : 1][FV_DIM_SLICES];
            if constexpr (V_EARLY) {
                // the V cells of this step's V phase (below), loaded now (FV_V_WITH_K)
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const int n = k0 + 32 * w + g + 4 * t;
                    if (FV_PRELOAD_V && first) {
                        fv_pick_cell(pre->v[FV_PRELOAD_V ? t : 0], pre->own_v, n - own_first, own_tokens, r, v_raw[t]);
                    } else {
                        fv_load_cell_raw(Vh, n, kv_len, cell_stride, r, v_raw[t]);
                    }
                }
            } else if (r == 0) {
                // Ask L2 for the V rows this group reads after the K phase (thread r = 0 of each group,
                // one request per 128-byte line), so they arrive while K.Q and the softmax run.
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const int n = k0 + 32 * w + g + 4 * t;
                    if (n < kv_len) hx_prefetch_lines(Vh + (size_t)n * cell_stride, 2LL * D, 0, 1);
                }
            }
            // K.Q: group g of warp w computes cells k0 + 32w + 8g + t, t = 0..7.
            float kq_own[NCOLS];
            float mx[NCOLS];
#pragma unroll
            for (int j = 0; j < NCOLS; ++j) {
                kq_own[j] = FV_NEG_INF;
                mx[j] = M[j];
            }
#pragma unroll CELL_UNROLL
            for (int t = 0; t < 8; ++t) {
                const int n = k0 + 32 * w + 8 * g + t;
                float kf[FV_DIMS];
                if constexpr (PRELOADED) {
                    uint4 raw[FV_DIM_SLICES];
                    if (first) {
                        fv_pick_cell(pre->k[t], pre->own_k, n - own_first, own_tokens, r, raw);
                    } else {
                        fv_load_cell_raw(Kh, n, kv_len, cell_stride, r, raw);
                    }
                    fv_unpack_cell(raw, n < kv_len, kf);
                } else {
                    fv_load_cell(Kh, n, kv_len, cell_stride, r, kf);
                }
#pragma unroll
                for (int j = 0; j < NCOLS; ++j) {
                    float qj[FV_DIMS];
#pragma unroll
                    for (int b = 0; b < FV_DIM_SLICES; ++b) {
#pragma unroll
                        for (int e = 0; e < 8; ++e) {
                            if constexpr (!Q_REGS) {
                                qj[8 * b + e] = Q_sh[j][64 * b + 8 * r + e];
                            } else {
                                qj[8 * b + e] = q[j][8 * b + e];
                            }
                        }
                    }
                    float s = 0.0f;
#pragma unroll
                    for (int i = 0; i < FV_DIMS; ++i) s = __fmaf_rn(kf[i], qj[i], s);
                    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 4, 32));
                    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2, 32));
                    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1, 32));
                    // causal mask: cells past the query's position or past the filled cache are -inf
                    s = (n < kv_len && n <= (SHARE_KV ? pos_sh[j] : pos[j])) ? s : FV_NEG_INF;
                    if (r == t) {
                        if constexpr (SHARE_KV) {
                            KQ[j * FV_NTHREADS + tid] = s;
                        } else {
                            kq_own[j] = s;
                        }
                    }
                    mx[j] = fmaxf(mx[j], __fadd_rn(s, FV_KQ_MAX_OFFSET));
                }
            }
#pragma unroll
            for (int j = 0; j < NCOLS; ++j) {
                mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 8, 32));
                mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 16, 32));
                const float a = hx_expf(__fsub_rn(M[j], mx[j]));
                M[j] = mx[j];
                const float p = hx_expf(__fsub_rn(SHARE_KV ? KQ[j * FV_NTHREADS + tid] : kq_own[j], M[j]));
                Ssum[j] = __fmaf_rn(Ssum[j], a, p);
                KQ[j * FV_NTHREADS + tid] = p;
#pragma unroll
                for (int i = 0; i < FV_DIMS; ++i) VKQ[j][i] = __fmul_rn(VKQ[j][i], a);
            }
            __syncwarp();
            // V: group g of warp w takes cells 32w + g + 4t, t = 0..7, in this order.
#pragma unroll CELL_UNROLL
            for (int t = 0; t < 8; ++t) {
                const int k = 32 * w + g + 4 * t;
                const int n = k0 + k;
                float vf[FV_DIMS];
                if constexpr (V_EARLY) {
                    fv_unpack_cell(v_raw[t], n < kv_len, vf);
                } else {
                    fv_load_cell(Vh, n, kv_len, cell_stride, r, vf);
                }
#pragma unroll
                for (int j = 0; j < NCOLS; ++j) {
                    const float p = KQ[j * FV_NTHREADS + k];
#pragma unroll
                    for (int i = 0; i < FV_DIMS; ++i) VKQ[j][i] = __fmaf_rn(vf[i], p, VKQ[j][i]);
                }
            }
            __syncwarp();
        }
    }

    // Combine the 4 warps x 4 groups of this block.
    if (w == 0 && lane >= FV_NWARPS) {
#pragma unroll
        for (int j = 0; j < NCOLS; ++j) {
            KQ_max_sh[j][lane] = FV_NEG_HALF_FLT_MAX;
            KQ_sum_sh[j][lane] = 0.0f;
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < NCOLS; ++j) KQ_max_sh[j][w] = M[j];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NCOLS; ++j) {
        const float Mb = hx_warp_max(KQ_max_sh[j][lane]);
        const float a = hx_expf(__fsub_rn(M[j], Mb));
#pragma unroll
        for (int b = 0; b < FV_DIM_SLICES; ++b) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                KQ[(4 * w + g) * D + 64 * b + 8 * r + e] = __fmul_rn(VKQ[j][8 * b + e], a);
            }
        }
        const float warp_sum = hx_warp_sum(__fmul_rn(Ssum[j], a));
        if (lane == 0) KQ_sum_sh[j][w] = warp_sum;
        __syncthreads();
        const float S = hx_warp_sum(KQ_sum_sh[j][lane]);
        const int t = token_of(j);
        if (tid < D && t < n_tokens) {
            float o = 0.0f;
#pragma unroll
            for (int wg = 0; wg < 16; ++wg) o = __fadd_rn(o, KQ[wg * D + tid]);
            const size_t row = (size_t)t * n_head + head_of(j);
            if (P == 1) {
                const float v = __fdiv_rn(o, S);
                if (dst != nullptr) dst[row * D + tid] = v;
#ifdef HX_ATTN_Q8_1
                // quantize_q8_1 of the normalised row, as its own launch would do it: a warp holds the 32
                // values of one q8_1 block (tid < D is uniform per warp, t per block; every lane calls it)
                if (yq != nullptr) hx_q8_1_store(yq, t, n_head * D / 32, (head_of(j) * D + tid) / 32, tid % 32, v);
#endif
            } else {
                parts[(row * P + y) * D + tid] = o;
                if (tid == 0) {
                    meta[2 * (row * P + y) + 0] = Mb;
                    meta[2 * (row * P + y) + 1] = S;
                }
            }
        }
        __syncthreads();  // KQ is reused by the next query of the block
    }
}

// One query per block (llama.cpp's ncols = 1 instance).
extern "C" __global__ void __launch_bounds__(FV_NTHREADS, 1)
fattn_vec_q1(const float* __restrict__ Q, const unsigned short* __restrict__ K,
             const unsigned short* __restrict__ V, const int* __restrict__ q_pos,
             float* __restrict__ dst, float* __restrict__ parts, float* __restrict__ meta,
             const int n_tokens, const int n_head, const int n_head_kv, const int kv_len,
             const int kv_attended, const int chunk_cells, const float scale, unsigned char* __restrict__ yq) {
    HX_PDL_ENTRY();
    fattn_vec_impl<1, false>(Q, K, V, q_pos, dst, parts, meta, n_tokens, n_head, n_head_kv, kv_len,
                             kv_attended, chunk_cells, scale, yq);
}

#ifdef HX_ATTN_ROPE
// fattn_vec_q1 of a pass of n_tokens <= FV_ROPE_MAX_TOKENS tokens whose q, k and v are still the Q/K/V
// projections' raw rows: each block first does the part of fused/fused.cu's hx_qk_norm_rope_kv its attention
// reads, then attends as fattn_vec_q1 does (HIRAISHIN_ATTN_ROPE; one launch a layer fewer). Compiled after
// rmsnorm/rmsnorm.cu (hx_rms_scale_from_partials) and, with HX_ATTN_Q8_1, quantize/quantize_q8_1.cu.
//   * block (t, y, h): its query, token t's q head h, normed (rmsnorm's tree over D, see below) and roped
//     (hx_rope_pair) into shared memory: the float32 row hx_qk_norm_rope_kv writes to q_out, which
//     fattn_vec_q1 would load;
//   * every token j of the pass whose cell lies in block y's chunks (chunk (pos[j] / chunk_cells) % P == y):
//     the k of the block's KV head normed and roped, and v, rounded to f16 into that cell; then a barrier,
//     so the block's own loads of the cells see them (__syncthreads orders a block's global writes for its
//     threads). Every block of the same y and KV head stores the same bits to the same cells, and a block
//     stores each cell of its chunks it may load (a masked cell's 0 * v must not meet a stale NaN), so no
//     block reads a cell another block writes. K and V are therefore not `const __restrict__` here: a
//     read-only (non-coherent) load of memory the kernel writes would be undefined.
// The tree: hx_qk_norm_rope_kv runs rmsnorm's block of block_threads(D) = 256 threads, thread t holding
// value t (D <= 128: one each), so its warps past D / 32 hold +0 and its partials past them are +0. Here
// thread 32 * w + lane holds value 32 * w + lane: warp w's butterfly is the tree's warp w's, and the
// 4 partials with 0.0f in the lanes past them are the 8 with +0 in lanes 4..7: the same scale.
// The float work before the attention is hx_qk_norm_rope_kv's, op for op, and the attention is
// fattn_vec_q1's: the bits of those two launches (tests/test_fattn_rope.py, tests/test_fattn_rope_gpu.py).
static_assert(HX_D <= FV_NTHREADS, "one value per thread in the head norms");
// The norm weights of pair d (dims d, d + half) for thread d < half, zeros elsewhere. Weights are never
// written, so fattn_vec_q1_rope reads them before it waits on the previous kernel.
__device__ __forceinline__ float2 fv_weight_pair(const float* __restrict__ w, const int d, const int half) {
    float2 p;
    p.x = d < half ? __ldg(w + d) : 0.0f;
    p.y = d < half ? __ldg(w + d + half) : 0.0f;
    return p;
}
// Dims d and d + half of a row (x0, x1), normed with `scale` and w's pair, roped with the table values (c, s)
// of its cell: thread d < half's two outputs, hx_qk_norm_rope_kv's products in its order.
__device__ __forceinline__ void fv_norm_rope(const float x0, const float x1, const float scale, const float2 w,
                                             const float c, const float s, float& y0, float& y1) {
    hx_rope_pair(__fmul_rn(__fmul_rn(scale, x0), w.x), __fmul_rn(__fmul_rn(scale, x1), w.y), c, s, y0, y1);
}
// FV_ROPE_EARLY (fused/launch.py ATTN_EARLY): every global value fattn_vec_q1_rope reads before its attention is
// asked for right after the wait: the k and v rows whether or not the block stores their cell (every row
// of the pass exists; a row the block does not store is selected to 0 after), so they do not wait for
// the positions, and the RoPE table values as soon as the positions arrive, so they do not wait for the
// norms' reduction. Two memory round trips fewer before the attention; the same values and operations.
#ifndef FV_ROPE_EARLY
#define FV_ROPE_EARLY 0
#endif
extern "C" __global__ void __launch_bounds__(FV_NTHREADS, 1)
fattn_vec_q1_rope(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                  const float* __restrict__ wq, const float* __restrict__ wk,
                  const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                  unsigned short* K, unsigned short* V,  // (n_ctx, n_head_kv, D) f16: read, and written at pos[j]
                  const int* __restrict__ q_pos, float* __restrict__ dst, float* __restrict__ parts,
                  float* __restrict__ meta, const int n_tokens, const int n_head, const int n_head_kv,
                  const int kv_attended, const int chunk_cells, const float scale, const float eps,
                  unsigned char* __restrict__ yq) {
    constexpr int D = HX_D;
    constexpr int half = D / 2;
    const int lane = threadIdx.x;
    const int w = threadIdx.y;
    const int tid = 32 * w + lane;
    const int t = blockIdx.x;
    const int h = blockIdx.z;
    const int kv_head = h / (n_head / n_head_kv);
    const float2 wqp = fv_weight_pair(wq, tid, half);
    const float2 wkp = fv_weight_pair(wk, tid, half);
#if FV_CACHE_EARLY
    // The cells of the block's first step (cells y * chunk_cells + [0, 128), inside the attended range, which
    // the cache holds), before the wait: see FV_CACHE_EARLY. Unclamped: a cell past the filled ones is
    // selected to 0 whatever it holds. (The one read of written memory before a wait in the package:
    // tests/test_pdl.py names it.)
    fv_preloaded pre;
    if ((int)blockIdx.y < kv_attended / chunk_cells) {
        const int g = lane / 8, r = lane % 8;
        const int k0 = (int)blockIdx.y * chunk_cells;
        const size_t cell_stride = (size_t)n_head_kv * D;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const int nk = k0 + 32 * w + 8 * g + c;
            fv_load_cell_raw(K + (size_t)kv_head * D, nk, nk + 1, cell_stride, r, pre.k[c]);
            if constexpr (FV_PRELOAD_V) {
                const int nv = k0 + 32 * w + g + 4 * c;
                fv_load_cell_raw(V + (size_t)kv_head * D, nv, nv + 1, cell_stride, r, pre.v[c]);
            }
        }
    }
#endif
    HX_PDL_ENTRY();
#if FV_CACHE_EARLY
    alignas(16) __shared__ unsigned short own_k[FV_ROPE_MAX_TOKENS][D];  // the pass's cells as this block stores them
    alignas(16) __shared__ unsigned short own_v[FV_ROPE_MAX_TOKENS][D];
    pre.own_k = &own_k[0][0];
    pre.own_v = &own_v[0][0];
#endif
    __shared__ float partial_q[FV_NWARPS];                      // the trees' warp partials: the query's,
    __shared__ float partial_k[FV_ROPE_MAX_TOKENS][FV_NWARPS];  // and each stored token's k
    alignas(16) __shared__ float q_sh[D];
    const int P = gridDim.y;
    const int y = blockIdx.y;
    const float* qr = q + ((size_t)t * n_head + h) * D;
    // Every value this thread reads before the attention, loaded at once (the loops over the pass's tokens
    // unroll, predicated): one L2 round trip for the pass, not two a token. xk[j]: value tid of token j's k row
    // (+0 where the block does not store token j or tid >= D); k_hi[j]: value tid + half (thread tid < half's
    // second dim); xv[j]: value tid of its v row.
    float xk[FV_ROPE_MAX_TOKENS], k_hi[FV_ROPE_MAX_TOKENS], xv[FV_ROPE_MAX_TOKENS];
    int cells[FV_ROPE_MAX_TOKENS];
    unsigned int stores = 0;  // bit j: this block stores token j's cell (uniform per block)
#if FV_ROPE_EARLY
    // The rows are loaded before the positions arrive (every row j < n_tokens exists) and selected after;
    // rope_c, rope_s[j] (thread tid < half's RoPE table values at token j's cell) and the query's (cq, sq_)
    // as soon as the positions arrive. Each loop issues its loads with no wait between them (a load that
    // waited on a position inside the loop over tokens would hold back the loads after it).
    const float xq = tid < D ? qr[tid] : 0.0f;
    const float xq_hi = tid < half ? qr[tid + half] : 0.0f;
    const size_t at_q = (size_t)q_pos[t] * half + tid;  // the query's table row (its cell)
    float rope_c[FV_ROPE_MAX_TOKENS], rope_s[FV_ROPE_MAX_TOKENS];
#pragma unroll
    for (int j = 0; j < FV_ROPE_MAX_TOKENS; ++j) {
        if (j >= n_tokens) break;  // uniform per block
        cells[j] = q_pos[j];
        const float* kr = k + ((size_t)j * n_head_kv + kv_head) * D;
        xk[j] = tid < D ? kr[tid] : 0.0f;
        k_hi[j] = tid < half ? kr[tid + half] : 0.0f;
        xv[j] = tid < D ? v[((size_t)j * n_head_kv + kv_head) * D + tid] : 0.0f;
    }
    const float cq = tid < half ? cos_table[at_q] : 0.0f;
    const float sq_ = tid < half ? sin_table[at_q] : 0.0f;
#pragma unroll
    for (int j = 0; j < FV_ROPE_MAX_TOKENS; ++j) {
        if (j >= n_tokens) break;
        const size_t at = (size_t)cells[j] * half + tid;
        rope_c[j] = tid < half ? cos_table[at] : 0.0f;
        rope_s[j] = tid < half ? sin_table[at] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < FV_ROPE_MAX_TOKENS; ++j) {
        if (j >= n_tokens) break;
        const bool mine = (cells[j] / chunk_cells) % P == y;
        stores |= (unsigned int)mine << j;
        xk[j] = mine ? xk[j] : 0.0f;
        k_hi[j] = mine ? k_hi[j] : 0.0f;
        xv[j] = mine ? xv[j] : 0.0f;
    }
#else
#pragma unroll
    for (int j = 0; j < FV_ROPE_MAX_TOKENS; ++j) {
        if (j >= n_tokens) break;  // uniform per block
        cells[j] = q_pos[j];
        const bool mine = (cells[j] / chunk_cells) % P == y;
        stores |= (unsigned int)mine << j;
        const float* kr = k + ((size_t)j * n_head_kv + kv_head) * D;
        xk[j] = mine && tid < D ? kr[tid] : 0.0f;
        k_hi[j] = mine && tid < half ? kr[tid + half] : 0.0f;
        xv[j] = mine && tid < D ? v[((size_t)j * n_head_kv + kv_head) * D + tid] : 0.0f;
    }
    const float xq = tid < D ? qr[tid] : 0.0f;
    const float xq_hi = tid < half ? qr[tid + half] : 0.0f;
#endif
    const float sq = hx_warp_sum(tid < D ? __fmaf_rn(xq, xq, 0.0f) : 0.0f);
    if (lane == 0) partial_q[w] = sq;
#pragma unroll
    for (int j = 0; j < FV_ROPE_MAX_TOKENS; ++j) {
        if (j >= n_tokens) break;
        if (!(stores >> j & 1u)) continue;
        const float sk = hx_warp_sum(tid < D ? __fmaf_rn(xk[j], xk[j], 0.0f) : 0.0f);
        if (lane == 0) partial_k[j][w] = sk;
    }
    __syncthreads();
    const float scale_q = hx_rms_scale_from_partials(partial_q, FV_NWARPS, D, eps);  // whole warps: butterflies
    if (tid < half) {
#if FV_ROPE_EARLY
        fv_norm_rope(xq, xq_hi, scale_q, wqp, cq, sq_, q_sh[tid], q_sh[tid + half]);
#else
        const size_t at_q = (size_t)q_pos[t] * half + tid;
        fv_norm_rope(xq, xq_hi, scale_q, wqp, cos_table[at_q], sin_table[at_q], q_sh[tid], q_sh[tid + half]);
#endif
    }
#pragma unroll
    for (int j = 0; j < FV_ROPE_MAX_TOKENS; ++j) {
        if (j >= n_tokens) break;
        const int cell = cells[j];
        if (!(stores >> j & 1u)) continue;
        const float scale_k = hx_rms_scale_from_partials(partial_k[j], FV_NWARPS, D, eps);
        const size_t at = ((size_t)cell * n_head_kv + kv_head) * D;
        if (tid < half) {
            float y0, y1;
#if FV_ROPE_EARLY
            fv_norm_rope(xk[j], k_hi[j], scale_k, wkp, rope_c[j], rope_s[j], y0, y1);
#else
            const size_t at_k = (size_t)cell * half + tid;
            fv_norm_rope(xk[j], k_hi[j], scale_k, wkp, cos_table[at_k], sin_table[at_k], y0, y1);
#endif
            K[at + tid] = hx_f2h(y0);
            K[at + tid + half] = hx_f2h(y1);
#if FV_CACHE_EARLY
            own_k[j][tid] = hx_f2h(y0);  // the cell as stored, for this block's first step
            own_k[j][tid + half] = hx_f2h(y1);
#endif
        }
        if (tid < D) V[at + tid] = hx_f2h(xv[j]);
#if FV_CACHE_EARLY
        if (tid < D) own_v[j][tid] = hx_f2h(xv[j]);
#endif
    }
    __syncthreads();  // q_sh, and the cells' K and V for this block's own loads
#if FV_CACHE_EARLY
    fattn_vec_impl<1, false, true>(q_sh, K, V, q_pos, dst, parts, meta, n_tokens, n_head, n_head_kv, -1,
                                   kv_attended, chunk_cells, scale, yq, &pre);
#else
    fattn_vec_impl<1, false, true>(q_sh, K, V, q_pos, dst, parts, meta, n_tokens, n_head, n_head_kv, -1,
                                   kv_attended, chunk_cells, scale, yq);
#endif
}
#endif

// Two queries per block (llama.cpp's ncols = 2 instance): the same per-query arithmetic, more
// registers, hence a different occupancy.
extern "C" __global__ void __launch_bounds__(FV_NTHREADS, 1)
fattn_vec_qn(const float* __restrict__ Q, const unsigned short* __restrict__ K,
             const unsigned short* __restrict__ V, const int* __restrict__ q_pos,
             float* __restrict__ dst, float* __restrict__ parts, float* __restrict__ meta,
             const int n_tokens, const int n_head, const int n_head_kv, const int kv_len,
             const int kv_attended, const int chunk_cells, const float scale, unsigned char* __restrict__ yq) {
    HX_PDL_ENTRY();
    fattn_vec_impl<2, false>(Q, K, V, q_pos, dst, parts, meta, n_tokens, n_head, n_head_kv, kv_len,
                             kv_attended, chunk_cells, scale, yq);
}

// FV_SHARED_Q queries of one KV head per block (see the top): the one-query arithmetic for each,
// one K/V load for all of them.
extern "C" __global__ void __launch_bounds__(FV_NTHREADS, 1)
fattn_vec_shared(const float* __restrict__ Q, const unsigned short* __restrict__ K,
                 const unsigned short* __restrict__ V, const int* __restrict__ q_pos,
                 float* __restrict__ dst, float* __restrict__ parts, float* __restrict__ meta,
                 const int n_tokens, const int n_head, const int n_head_kv, const int kv_len,
                 const int kv_attended, const int chunk_cells, const float scale,
                 unsigned char* __restrict__ yq) {
    HX_PDL_ENTRY();
    fattn_vec_impl<FV_SHARED_Q, true>(Q, K, V, q_pos, dst, parts, meta, n_tokens, n_head, n_head_kv, kv_len,
                                      kv_attended, chunk_cells, scale, yq);
}

// Merge the P partials of one (token, head) in block order (llama.cpp flash_attn_combine_results,
// reference section 6.4). Grid (n_tokens, n_head), block D threads, dynamic shared 8*P bytes.
// The merged value of output dimension tid of row (token, head) `row`: the P partials weighted
// in block order. meta_sh: the row's (P, 2) meta, loaded by the caller (shared, after a barrier).
__device__ __forceinline__ float fv_combine_value(const float* __restrict__ parts, const float* meta_sh,
                                                  const int P, const size_t row, const int tid) {
    constexpr int D = HX_D;
    float kqmax = meta_sh[0];
    for (int l = 1; l < P; ++l) kqmax = fmaxf(kqmax, meta_sh[2 * l]);
    float num = 0.0f;
    float den = 0.0f;
    for (int l = 0; l < P; ++l) {
        const float s = hx_expf(__fsub_rn(meta_sh[2 * l], kqmax));
        num = __fmaf_rn(s, parts[(row * P + l) * D + tid], num);
        den = __fmaf_rn(s, meta_sh[2 * l + 1], den);
    }
    return __fdiv_rn(num, den);
}

__device__ __forceinline__ void fv_load_meta(const float* __restrict__ meta, float* meta_sh, const int P,
                                             const size_t row) {
    for (int l = threadIdx.x; l < 2 * P; l += blockDim.x) meta_sh[l] = meta[row * 2 * P + l];
    __syncthreads();
}

extern "C" __global__ void fattn_combine(const float* __restrict__ parts, const float* __restrict__ meta,
                                         float* __restrict__ dst, const int P) {
    HX_PDL_ENTRY();
    extern __shared__ float meta_sh[];  // (P, 2): block max, block sum
    const size_t row = (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    fv_load_meta(meta, meta_sh, P, row);
    dst[row * HX_D + threadIdx.x] = fv_combine_value(parts, meta_sh, P, row, threadIdx.x);
}

#ifdef HX_COMBINE_Q8_1
// fattn_combine, then quantize_q8_1 of the merged rows (T, H*D) into the q8_1 layout the output
// projection's mat-vec reads (compiled after quantize/quantize_q8_1.cu, whose hx_q8_1_store does the
// quantization: each warp holds the 32 values of one q8_1 block, as in quantize_q8_1): the float ops
// of those two kernels in their order, one launch. dst (the float rows) may be null: not written.
extern "C" __global__ void fattn_combine_q8_1(const float* __restrict__ parts, const float* __restrict__ meta,
                                              float* __restrict__ dst, const int P, unsigned char* __restrict__ yq) {
    HX_PDL_ENTRY();
    extern __shared__ float meta_sh[];
    const size_t row = (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    fv_load_meta(meta, meta_sh, P, row);
    const int tid = threadIdx.x;
    const float o = fv_combine_value(parts, meta_sh, P, row, tid);
    if (dst != nullptr) dst[row * HX_D + tid] = o;
    const int nb = gridDim.y * HX_D / 32;  // q8_1 blocks per token: H*D values
    hx_q8_1_store(yq, blockIdx.x, nb, (blockIdx.y * HX_D + tid) / 32, tid % 32, o);
}
#endif
