// Private: the CUDA backend's constructor (forward.cpp), behind make_cuda_backend.
#pragma once

#include <memory>

#include "dsv4/backend.h"

namespace dsv4::cuda {

// Throws Error when the weights do not fit or a tensor type has no kernel.
std::unique_ptr<Backend> make_cuda_backend_impl(const model::Model& m, const BackendOptions& opt);

// Device time of the last forward() round, split in phases (benchmarks); filled only when
// the environment sets DSV4_CUDA_TIMING=1.
struct StepTiming {
    double embed_layers_ms = 0, head_ms = 0;
};
StepTiming last_step_timing();

}  // namespace dsv4::cuda
