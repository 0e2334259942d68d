// The fast mode's experts kernel with Hopper's warpgroup MMA (gemm_experts_f16_kernel's WG form,
// experts_f16.cuh). Compiled for sm_90a alone (CMakeLists.txt: wgmma exists in no other
// target), so gemm.cu launches it only on a device of compute capability 9.0.
#include "cuda/experts_f16.cuh"

namespace dsv4::cuda::xf {

bool launch_experts_wgmma(const KqGemm& p, uint32_t type, int form, int diag, uint64_t N, uint32_t cap,
                          cudaStream_t s) {
    if (diag != 0 && form == kXfWg) {
        if (type == T_IQ2_XXS)
            return diag == 1 ? launch_experts_f16_form<T_IQ2_XXS, false, kXfWg, 1>(p, N, cap, s)
                             : launch_experts_f16_form<T_IQ2_XXS, false, kXfWg, 2>(p, N, cap, s);
        return diag == 1 ? launch_experts_f16_form<T_Q2_K, false, kXfWg, 1>(p, N, cap, s)
                         : launch_experts_f16_form<T_Q2_K, false, kXfWg, 2>(p, N, cap, s);
    }
    if (form == kXfWg2)
        return type == T_IQ2_XXS ? launch_experts_f16_form<T_IQ2_XXS, false, kXfWg2>(p, N, cap, s)
                                 : launch_experts_f16_form<T_Q2_K, false, kXfWg2>(p, N, cap, s);
    return type == T_IQ2_XXS ? launch_experts_f16_form<T_IQ2_XXS, false, kXfWg>(p, N, cap, s)
                             : launch_experts_f16_form<T_Q2_K, false, kXfWg>(p, N, cap, s);
}

}  // namespace dsv4::cuda::xf
