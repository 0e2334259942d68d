// The fast mode's experts kernel with Hopper's warpgroup MMA (gemm_experts_f16_kernel's WG form,
// experts_f16.cuh). Compiled for sm_90a alone (CMakeLists.txt: wgmma exists in no other
// target), so gemm.cu launches it only on a device of compute capability 9.0.
#include "cuda/experts_f16.cuh"

namespace dsv4::cuda::xf {

namespace {
template <uint32_t T>
bool launch_wg_variant(const KqGemm& p, int diag, int kgroup, bool sectors, uint64_t N, uint32_t cap, cudaStream_t s) {
    // (SB: the down's staging in whole sectors, with DIAG 0, 4, 6-9; its other DIAG measurements
    // run without SB)
    if constexpr (T == T_Q2_K)
        if (sectors) switch (diag) {
                case 0:
                    return kgroup == 2 ? launch_experts_f16_form<T, false, kXfWg, 0, 2, true>(p, N, cap, s)
                                       : launch_experts_f16_form<T, false, kXfWg, 0, 1, true>(p, N, cap, s);
                case 4: return launch_experts_f16_form<T, false, kXfWg, 4, 1, true>(p, N, cap, s);
                case 6: return launch_experts_f16_form<T, false, kXfWg, 6, 1, true>(p, N, cap, s);
                case 7: return launch_experts_f16_form<T, false, kXfWg, 7, 1, true>(p, N, cap, s);
                case 8: return launch_experts_f16_form<T, false, kXfWg, 8, 1, true>(p, N, cap, s);
                case 9: return launch_experts_f16_form<T, false, kXfWg, 9, 1, true>(p, N, cap, s);
                default: break;
            }
    switch (diag) {
        case 1: return launch_experts_f16_form<T, false, kXfWg, 1>(p, N, cap, s);
        case 2: return launch_experts_f16_form<T, false, kXfWg, 2>(p, N, cap, s);
        case 3: return launch_experts_f16_form<T, false, kXfWg, 3>(p, N, cap, s);
        case 4: return launch_experts_f16_form<T, false, kXfWg, 4>(p, N, cap, s);
        case 5: return launch_experts_f16_form<T, false, kXfWg, 5>(p, N, cap, s);
        case 6: return launch_experts_f16_form<T, false, kXfWg, 6>(p, N, cap, s);
        case 7: return launch_experts_f16_form<T, false, kXfWg, 7>(p, N, cap, s);
        case 8: return launch_experts_f16_form<T, false, kXfWg, 8>(p, N, cap, s);
        case 9: return launch_experts_f16_form<T, false, kXfWg, 9>(p, N, cap, s);
        default:
            return kgroup == 2 ? launch_experts_f16_form<T, false, kXfWg, 0, 2>(p, N, cap, s)
                               : launch_experts_f16_form<T, false, kXfWg>(p, N, cap, s);
    }
}
}  // namespace

bool launch_experts_wgmma(const KqGemm& p, uint32_t type, int form, int diag, int kgroup, bool sectors,
                          uint64_t N, uint32_t cap, cudaStream_t s) {
    if (form == kXfWs && diag == 0) return launch_experts_ws(p, type, N, cap, s);
    if (form == kXfWg2)
        return type == T_IQ2_XXS ? launch_experts_f16_form<T_IQ2_XXS, false, kXfWg2>(p, N, cap, s)
                                 : launch_experts_f16_form<T_Q2_K, false, kXfWg2>(p, N, cap, s);
    return type == T_IQ2_XXS ? launch_wg_variant<T_IQ2_XXS>(p, diag, kgroup, sectors, N, cap, s)
                             : launch_wg_variant<T_Q2_K>(p, diag, kgroup, sectors, N, cap, s);
}

}  // namespace dsv4::cuda::xf
