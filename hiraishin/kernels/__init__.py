"""Ops: one folder per op, each with its CUDA source, its launcher and its Numba emulator.

=============  ==========================================================================
``mmvq/``      dp4a mat-vec (Q4_K, Q6_K, Q8_0 x q8_1): llama.cpp's ``mul_mat_vec_q`` geometry
``mmq/``       int8 MMA mat-vec/mat-mat of the SUBBLOCK order (the same float operations at every width)
``mmq_stock/`` int8 MMA mat-mat in llama.cpp MMQ's order: the variant order's Q4_K/Q6_K path past 8 columns
``tiled/``     tiled dp4a mat-mat, the variant order's Q8_0 path past 8 columns
``quantize/``  activation quantization to q8_1 (and the mat-vec's per-thread layouts)
``attention/`` split-KV vector flash attention + combine, and the multi-query tile kernel
``rmsnorm/``   RMSNorm times weight
``rope/``      NEOX rotary embedding (host-built tables)
``elementwise/`` SwiGLU, residual add, embedding rows, KV-cache store
``fused/``     the unfused kernels' float operations in fewer launches: add + norm + q8_1, SwiGLU + q8_1,
               q/k norms + RoPE + KV store
``norm_mmvq/`` add + norm + q8_1 made by every CUDA block of the mat-vecs reading it (no norm launch;
               measured slower than the launch it saves, so off by default)
=============  ==========================================================================

Every op folder exposes ``emulate`` (numpy in and out, the kernel's float operations in the
kernel's order) and ``launch`` (CuPy arrays, unchecked, writing into a given output). An op that
sums floats takes a plan (:mod:`hiraishin.plans`); geometry and block-format facts reach the
``.cu`` as ``#define``\\ s computed in Python (:mod:`.compile`). Input checks live in the backends.
"""
