// CudaGrowableRegion: KV memory on the CUDA virtual memory management API.
#include "cuda/region.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "cuda/kernels.h"

namespace dsv4::cuda {
namespace {

// The driver API through the runtime's entry-point query: nothing links libcuda, so a
// binary built with CUDA still starts on a machine without the driver.
struct Driver {
#define DSV4_CU_FN(name) decltype(&::name) name = nullptr;
    DSV4_CU_FN(cuGetErrorName)
    DSV4_CU_FN(cuGetErrorString)
    DSV4_CU_FN(cuDeviceGet)
    DSV4_CU_FN(cuDeviceGetAttribute)
    DSV4_CU_FN(cuDeviceGetName)
    DSV4_CU_FN(cuMemGetAllocationGranularity)
    DSV4_CU_FN(cuMemAddressReserve)
    DSV4_CU_FN(cuMemAddressFree)
    DSV4_CU_FN(cuMemCreate)
    DSV4_CU_FN(cuMemRelease)
    DSV4_CU_FN(cuMemMap)
    DSV4_CU_FN(cuMemUnmap)
    DSV4_CU_FN(cuMemSetAccess)
#undef DSV4_CU_FN
    std::string error;
};

const Driver& driver() {
    static const Driver d = [] {
        Driver x;
        auto load = [&](const char* sym, void** fn) {
            cudaDriverEntryPointQueryResult q{};
            const cudaError_t e = cudaGetDriverEntryPointByVersion(sym, fn, 12000, cudaEnableDefault, &q);
            if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn) {
                cudaGetLastError();
                if (x.error.empty()) x.error = cat("the CUDA driver has no entry point ", sym);
            }
        };
#define DSV4_CU_LOAD(name) load(#name, reinterpret_cast<void**>(&x.name));
        DSV4_CU_LOAD(cuGetErrorName)
        DSV4_CU_LOAD(cuGetErrorString)
        DSV4_CU_LOAD(cuDeviceGet)
        DSV4_CU_LOAD(cuDeviceGetAttribute)
        DSV4_CU_LOAD(cuDeviceGetName)
        DSV4_CU_LOAD(cuMemGetAllocationGranularity)
        DSV4_CU_LOAD(cuMemAddressReserve)
        DSV4_CU_LOAD(cuMemAddressFree)
        DSV4_CU_LOAD(cuMemCreate)
        DSV4_CU_LOAD(cuMemRelease)
        DSV4_CU_LOAD(cuMemMap)
        DSV4_CU_LOAD(cuMemUnmap)
        DSV4_CU_LOAD(cuMemSetAccess)
#undef DSV4_CU_LOAD
        return x;
    }();
    return d;
}

std::string cu_error(CUresult r) {
    const char* name = nullptr;
    const char* text = nullptr;
    if (driver().cuGetErrorName) driver().cuGetErrorName(r, &name);
    if (driver().cuGetErrorString) driver().cuGetErrorString(r, &text);
    return cat(name ? name : "CUDA driver error", " (", text ? text : "?", ")");
}

uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

std::atomic<int> g_vmm_override{-1};

class CudaRegion final : public kv::Region {
public:
    CudaRegion(uint64_t reserve_bytes, kv::Budget* budget, std::string label, uint64_t piece)
        : budget_(budget), label_(std::move(label)) {
        // The runtime's primary context must exist before any driver call.
        check(cudaFree(nullptr), "CUDA context");
        const Driver& D = driver();
        if (!D.error.empty()) fail(label_, ": ", D.error);
        int dev_ord = 0;
        check(cudaGetDevice(&dev_ord), "cudaGetDevice");
        CUresult r = D.cuDeviceGet(&dev_, dev_ord);
        if (r != CUDA_SUCCESS) fail(label_, ": cuDeviceGet: ", cu_error(r));
        int vmm = 0;
        r = D.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev_);
        if (g_vmm_override.load() == 0) vmm = 0;
        if (r != CUDA_SUCCESS || !vmm) {
            char name[256] = {0};
            D.cuDeviceGetName(name, sizeof(name) - 1, dev_);
            fail(label_, ": CUDA device ", dev_ord, " (", name,
                 ") does not support virtual memory management (cuMemCreate/cuMemMap), which growable KV needs");
        }
        prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop_.location.id = dev_ord;
        size_t gmin = 0, grec = 0;
        r = D.cuMemGetAllocationGranularity(&gmin, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r != CUDA_SUCCESS) fail(label_, ": cuMemGetAllocationGranularity: ", cu_error(r));
        if (D.cuMemGetAllocationGranularity(&grec, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS)
            grec = gmin;
        gran_ = std::max<uint64_t>(gmin, grec);
        if (gran_ == 0) gran_ = 2u << 20;
        piece_ = std::max(gran_, round_up(piece, gran_));
        if (reserve_bytes > UINT64_MAX - gran_) fail(label_, ": reservation of ", reserve_bytes, " B is too large");
        reserved_ = round_up(reserve_bytes, gran_);
        if (reserved_ == 0) return;
        r = D.cuMemAddressReserve(&base_, reserved_, gran_, 0, 0);
        if (r != CUDA_SUCCESS)
            fail(label_, ": cannot reserve ", human_bytes(reserved_), " (", reserved_,
                 " B) of device address space: ", cu_error(r));
    }

    ~CudaRegion() override {
        const Driver& D = driver();
        if (!pieces_.empty()) cudaDeviceSynchronize();   // nothing in flight may touch the range
        for (auto it = pieces_.rbegin(); it != pieces_.rend(); ++it) {
            D.cuMemUnmap(it->va, it->bytes);
            D.cuMemRelease(it->handle);
        }
        if (base_) D.cuMemAddressFree(base_, reserved_);
        if (budget_ && committed_) budget_->release(committed_);
    }

    uint8_t* base() const override { return reinterpret_cast<uint8_t*>(base_); }
    uint64_t reserved_bytes() const override { return reserved_; }
    uint64_t committed_bytes() const override { return committed_; }
    bool on_device() const override { return true; }
    uint64_t chunk_bytes() const override { return gran_; }

    kv::Status commit(uint64_t bytes) override {
        const Driver& D = driver();
        if (bytes <= committed_) return kv::Status::success();
        if (bytes > reserved_)
            return kv::Status::failure(
                cat(label_, ": commit of ", bytes, " B exceeds the reservation of ", reserved_, " B"));
        const uint64_t target = round_up(bytes, gran_);
        const uint64_t grow = target - committed_;
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            cudaGetLastError();
            return kv::Status::failure(cat(label_, ": cannot read free device memory"));
        }
        if (grow + kCommitHeadroom > free_b)
            return kv::Status::failure(cat(label_, ": cannot commit ", human_bytes(grow), " (", grow,
                                           " B) more: the device has ", human_bytes(free_b), " free (",
                                           human_bytes(kCommitHeadroom), " are kept in reserve)"));
        if (budget_) {
            kv::Status s = budget_->acquire(grow, label_);
            if (!s) return s;
        }
        const size_t first_new = pieces_.size();
        uint64_t done = 0;
        std::string err;
        while (done < grow) {
            const uint64_t n = std::min(piece_, grow - done);
            const CUdeviceptr va = base_ + committed_ + done;
            CUmemGenericAllocationHandle h{};
            CUresult r = D.cuMemCreate(&h, n, &prop_, 0);
            if (r != CUDA_SUCCESS) {
                err = cat("cuMemCreate: ", cu_error(r));
                break;
            }
            r = D.cuMemMap(va, n, 0, h, 0);
            if (r != CUDA_SUCCESS) {
                D.cuMemRelease(h);
                err = cat("cuMemMap: ", cu_error(r));
                break;
            }
            pieces_.push_back({va, n, h});
            CUmemAccessDesc a{};
            a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            a.location.id = prop_.location.id;
            a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            r = D.cuMemSetAccess(va, n, &a, 1);
            if (r != CUDA_SUCCESS) {
                err = cat("cuMemSetAccess: ", cu_error(r));
                break;
            }
            done += n;
        }
        if (err.empty()) {
            // New memory reads as zero (lazy and eager sessions hold identical bytes).
            cudaError_t e = cudaMemset(reinterpret_cast<void*>(base_ + committed_), 0, grow);
            if (e == cudaSuccess) e = cudaDeviceSynchronize();
            if (e != cudaSuccess) err = cat("cudaMemset: ", cudaGetErrorString(e));
        }
        if (!err.empty()) {
            cudaGetLastError();
            for (size_t i = pieces_.size(); i > first_new; --i) {
                D.cuMemUnmap(pieces_[i - 1].va, pieces_[i - 1].bytes);
                D.cuMemRelease(pieces_[i - 1].handle);
            }
            pieces_.resize(first_new);
            if (budget_) budget_->release(grow);
            return kv::Status::failure(
                cat(label_, ": cannot commit ", human_bytes(grow), " (", grow, " B) more of device memory: ", err));
        }
        committed_ = target;
        return kv::Status::success();
    }

    void zero(uint64_t offset, uint64_t bytes) override {
        check_range("zero", offset, bytes);
        if (!bytes) return;
        check(cudaMemset(base() + offset, 0, bytes), "region zero");
        check(cudaDeviceSynchronize(), "region zero");
    }
    void copy_out(uint64_t offset, void* dst, uint64_t bytes) const override {
        check_range("copy_out", offset, bytes);
        if (bytes) check(cudaMemcpy(dst, base() + offset, bytes, cudaMemcpyDeviceToHost), "region copy_out");
    }
    void copy_in(uint64_t offset, const void* src, uint64_t bytes) override {
        check_range("copy_in", offset, bytes);
        if (bytes) check(cudaMemcpy(base() + offset, src, bytes, cudaMemcpyHostToDevice), "region copy_in");
    }

private:
    struct Piece {
        CUdeviceptr va;
        uint64_t bytes;
        CUmemGenericAllocationHandle handle;
    };

    void check_range(const char* op, uint64_t offset, uint64_t bytes) const {
        if (offset > committed_ || bytes > committed_ - offset)
            fail(label_, ": ", op, " of [", offset, ", ", offset + bytes, ") outside the committed ", committed_, " B");
    }

    kv::Budget* budget_;
    std::string label_;
    CUdevice dev_ = 0;
    CUmemAllocationProp prop_{};
    CUdeviceptr base_ = 0;
    uint64_t gran_ = 0, piece_ = 0, reserved_ = 0, committed_ = 0;
    std::vector<Piece> pieces_;
};

}  // namespace

std::unique_ptr<kv::Region> make_cuda_region(uint64_t reserve_bytes, kv::Budget* budget, std::string label,
                                             uint64_t piece_bytes) {
    return std::make_unique<CudaRegion>(reserve_bytes, budget, std::move(label), piece_bytes);
}

void region_vmm_override(int supported) { g_vmm_override.store(supported); }

kv::RegionFactory cuda_region_factory() {
    return [](uint64_t reserve_bytes, kv::Budget* budget, std::string label) {
        return make_cuda_region(reserve_bytes, budget, std::move(label));
    };
}

}  // namespace dsv4::cuda
