// hiraishin: ask L2 for weight bytes that a later kernel of the pass will read, from a stream beside
// the pass (hiraishin/kernels/l2ahead/launch.py).
//
// A one-token pass moves ~45% of the bytes the card could copy in its time: between and around the
// big mat-vecs run small latency-bound kernels (norms, RoPE, attention, combine) during which DRAM
// is nearly idle, and the small mat-vecs (Q/K/V, the attention output) wait on DRAM latency. This
// kernel fills those gaps: launched beside the pass after a given kernel, it asks L2 for the bytes
// of weights read a few kernels later, so their mat-vecs read L2 instead of DRAM.
//
// Cache hints only: it reads no value into a register, writes nothing, and no kernel of the pass
// waits for it (the pass joins its stream at its end), so no bit of any result can change. It touches
// only weights, which no kernel writes: that is why it has no HX_PDL_ENTRY (it is never launched with
// PDL; tests/test_pdl.py names it).
//
// Up to four spans [p_i, p_i + n_i) in the order they will be read; the grid's threads take chunks
// of HX_CHUNK bytes of their concatenation in turn (thread t the chunks t, t + threads, ...), so the
// first chunks of every thread are the earliest bytes. HX_BULK 1: one cp.async.bulk.prefetch.L2 per
// chunk (the copy engine walks the chunk; spans 16-byte aligned, lengths multiples of 16: the
// launcher trims them); 0: one prefetch.global.L2 per 128-byte line.
#ifndef HX_CHUNK
#define HX_CHUNK 16384
#endif
#ifndef HX_BULK
#define HX_BULK 1
#endif

__device__ __forceinline__ void hx_ahead_chunk(const unsigned char* p, const long long n) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && HX_BULK
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"((unsigned int)n) : "memory");
#else
    hx_prefetch_lines(p, n, 0, 1);  // fp.cuh: every 128-byte line of the chunk, from this thread
#endif
}

extern "C" __global__ void hx_l2_ahead(const unsigned char* __restrict__ p0, const long long n0,
                                       const unsigned char* __restrict__ p1, const long long n1,
                                       const unsigned char* __restrict__ p2, const long long n2,
                                       const unsigned char* __restrict__ p3, const long long n3) {
    const long long threads = (long long)gridDim.x * blockDim.x;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned char* p[4] = {p0, p1, p2, p3};
    const long long n[4] = {n0, n1, n2, n3};
    long long base = 0;  // chunks of the spans before span i
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const long long chunks = (n[i] + HX_CHUNK - 1) / HX_CHUNK;
        // this thread's first chunk of span i: the one whose global index is t modulo threads
        long long c = ((t - base) % threads + threads) % threads;
        for (; c < chunks; c += threads) {
            const long long off = c * HX_CHUNK;
            hx_ahead_chunk(p[i] + off, min((long long)HX_CHUNK, n[i] - off));
        }
        base += chunks;
    }
}
