// Private: the CUDA backend's constructor (forward.cpp), behind make_cuda_backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

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

// Device time per named group of work, summed over rounds (DSV4_CUDA_PROFILE=1: an event
// after each group, CUDA graphs off). bytes: weight bytes the group's products read.
struct ProfileEntry {
    std::string name;
    double ms = 0, bytes = 0;
    uint64_t calls = 0;
};
std::vector<ProfileEntry> profile_snapshot();
void profile_reset();
void profile_enable(bool on);   // also by DSV4_CUDA_PROFILE=1; CUDA graphs are off while on

}  // namespace dsv4::cuda
