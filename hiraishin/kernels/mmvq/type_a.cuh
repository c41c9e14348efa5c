// mixed.cu's first weight type: mmvq.cu, compiled next, in namespace hx_ta with the HX_A_* defines as
// its own (launch.py MixedMatVecLaunch; type_end.cuh closes the namespace and clears them).
#define HX_MMVQ_NO_KERNELS
#define HX_QTYPE HX_A_QTYPE
#define HX_QK HX_A_QK
#define HX_BLOCK_BYTES HX_A_BLOCK_BYTES
#define HX_VDR HX_A_VDR
#define HX_TPB HX_A_TPB
#define HX_Y_STEP HX_A_Y_STEP
#define HX_RPB HX_A_RPB
#define HX_NBLOCKS HX_A_NBLOCKS
#define HX_UNROLL HX_A_UNROLL
namespace hx_ta {
