// mixed.cu's second weight type: mmvq.cu, compiled next, in namespace hx_tb with the HX_B_* defines as
// its own (launch.py MixedMatVecLaunch; type_end.cuh closes the namespace and clears them).
#define HX_MMVQ_NO_KERNELS
#define HX_QTYPE HX_B_QTYPE
#define HX_QK HX_B_QK
#define HX_BLOCK_BYTES HX_B_BLOCK_BYTES
#define HX_VDR HX_B_VDR
#define HX_TPB HX_B_TPB
#define HX_Y_STEP HX_B_Y_STEP
#define HX_RPB HX_B_RPB
#define HX_NBLOCKS HX_B_NBLOCKS
#define HX_UNROLL HX_B_UNROLL
namespace hx_tb {
