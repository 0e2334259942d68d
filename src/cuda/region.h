// CUDA device regions for the KV memory system (design.md "Reserve, then commit").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dsv4/kv.h"

namespace dsv4::cuda {

// A growable region of device memory on the CUDA virtual memory API: the address range is
// reserved once (cuMemAddressReserve); commit() creates physical memory (cuMemCreate), maps
// it (cuMemMap) and opens it to the device (cuMemSetAccess) in pieces of at most
// `piece_bytes`, zeroes it, and never moves the base. Commits round up to the allocation
// granularity (chunk_bytes(), 2 MiB on Hopper). The Budget is asked first and free device
// memory is checked (a headroom is kept); any failure leaves the region as it was.
// Throws Error (naming the label) when the device lacks VMM support or the range cannot
// be reserved.
std::unique_ptr<kv::Region> make_cuda_region(uint64_t reserve_bytes, kv::Budget* budget, std::string label,
                                             uint64_t piece_bytes = 64ull << 20);
kv::RegionFactory cuda_region_factory();

// Tests: 0 makes new regions treat the device as lacking virtual memory management (the
// refusal a GPU without it gets); -1 (initially) asks the device.
void region_vmm_override(int supported);

// Device memory the region keeps free when committing (bytes).
inline constexpr uint64_t kCommitHeadroom = 256ull << 20;

}  // namespace dsv4::cuda
