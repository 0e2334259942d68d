// The CUDA backend: device discovery and the factory. The forward pass lives in forward.cu.
#include <cuda_runtime.h>

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

std::unique_ptr<Backend> make_cuda_backend(const model::Model&, const BackendOptions&, std::string* why) {
    if (!cuda_available()) {
        if (why) *why = "no CUDA device is present (cudaGetDeviceCount found none)";
        return nullptr;
    }
    if (why) *why = "the CUDA backend is not implemented yet";
    return nullptr;
}

}  // namespace dsv4
