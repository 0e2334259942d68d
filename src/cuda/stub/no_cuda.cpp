// Built when the CUDA toolkit is absent: the CUDA backend reports why it cannot start.
#include "dsv4/backend.h"

namespace dsv4 {

bool cuda_available() { return false; }

std::unique_ptr<Backend> make_cuda_backend(const model::Model&, const BackendOptions&, std::string* why) {
    if (why) *why = "this dsv4 was built without CUDA (no nvcc at configure time)";
    return nullptr;
}

}  // namespace dsv4
