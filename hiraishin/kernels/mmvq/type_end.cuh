}  // namespace (type_a.cuh / type_b.cuh)
// mmvq.cu's per-type defines, given and derived, cleared for the next type.
#undef HX_QTYPE
#undef HX_QK
#undef HX_BLOCK_BYTES
#undef HX_VDR
#undef HX_TPB
#undef HX_Y_STEP
#undef HX_RPB
#undef HX_NBLOCKS
#undef HX_UNROLL
#undef HX_BPI
#undef HX_COL_BYTES
#undef HX_ROW_BYTES
#undef HX_Q6_SUB_IN_DOT
