// The CUDA backend's entry points: device discovery and the factory.
#include <cuda_runtime.h>

#include "cuda/backend_impl.h"
#include "dsv4/backend.h"

namespace dsv4 {

bool cuda_available() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return false;
    }
    return n > 0;
}

std::unique_ptr<Backend> make_cuda_backend(const model::Model& m, const BackendOptions& opt, std::string* why) {
    if (!cuda_available()) {
        if (why) *why = "no CUDA device is present (cudaGetDeviceCount found none)";
        return nullptr;
    }
    try {
        return cuda::make_cuda_backend_impl(m, opt);
    } catch (const std::exception& e) {
        if (why) *why = cat("the CUDA backend cannot start: ", e.what());
        return nullptr;
    }
}

}  // namespace dsv4
