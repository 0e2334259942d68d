// Budget and HostRegion: reserve address space once, commit a growing prefix of it.
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "dsv4/kv.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23   // Linux 5.14; older kernels answer EINVAL
#endif

namespace dsv4::kv {

// ---- Budget -------------------------------------------------------------------------------

Status Budget::acquire(uint64_t bytes, const std::string& what) {
    uint64_t used = used_.load();
    for (;;) {
        const uint64_t limit = limit_.load();
        if (limit != 0 && (bytes > limit || used > limit - bytes))
            return Status::failure(cat("KV budget exceeded: ", what, " needs ", human_bytes(bytes), " (",
                                       bytes, " B) more; ", human_bytes(used), " of ", human_bytes(limit),
                                       " already committed"));
        // compare_exchange reloads `used` on failure, so the limit test is redone against
        // the value another thread just published.
        if (used_.compare_exchange_weak(used, used + bytes)) return Status::success();
    }
}

void Budget::release(uint64_t bytes) { used_.fetch_sub(bytes); }

// ---- HostRegion ---------------------------------------------------------------------------

namespace {

uint64_t page_size() {
    static const uint64_t p = uint64_t(sysconf(_SC_PAGESIZE));
    return p;
}

uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

class HostRegion final : public Region {
public:
    HostRegion(uint64_t reserve_bytes, Budget* budget, std::string label, uint64_t chunk)
        : budget_(budget), label_(std::move(label)) {
        if (chunk == 0) fail(label_, ": chunk size 0");
        chunk_ = round_up(chunk, page_size());
        if (reserve_bytes > UINT64_MAX - chunk_) fail(label_, ": reservation of ", reserve_bytes, " B is too large");
        reserved_ = round_up(reserve_bytes, chunk_);
        if (reserved_ == 0) return;
        void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            fail(label_, ": cannot reserve ", human_bytes(reserved_), " (", reserved_, " B) of address space: ",
                 std::strerror(errno));
        base_ = static_cast<uint8_t*>(p);
    }

    ~HostRegion() override {
        if (base_) munmap(base_, reserved_);
        if (budget_ && committed_) budget_->release(committed_);
    }

    uint8_t* base() const override { return base_; }
    uint64_t reserved_bytes() const override { return reserved_; }
    uint64_t committed_bytes() const override { return committed_; }
    bool on_device() const override { return false; }
    uint64_t chunk_bytes() const override { return chunk_; }

    Status commit(uint64_t bytes) override {
        if (bytes <= committed_) return Status::success();
        if (bytes > reserved_)
            return Status::failure(cat(label_, ": commit of ", bytes, " B exceeds the reservation of ", reserved_,
                                       " B"));
        const uint64_t target = round_up(bytes, chunk_);   // <= reserved_, which is chunk-aligned
        const uint64_t grow = target - committed_;
        if (budget_) {
            Status s = budget_->acquire(grow, label_);
            if (!s) return s;
        }
        uint8_t* start = base_ + committed_;
        int err = 0;
        const char* step = "";
        if (mprotect(start, grow, PROT_READ | PROT_WRITE) != 0) {
            err = errno;
            step = "mprotect";
        } else if (!populate(start, grow, &err)) {
            step = "pre-fault";
        }
        if (err != 0) {
            // Give back whatever was populated so a later commit again starts from zero pages.
            madvise(start, grow, MADV_DONTNEED);
            mprotect(start, grow, PROT_NONE);
            if (budget_) budget_->release(grow);
            return Status::failure(cat(label_, ": cannot commit ", human_bytes(grow), " (", grow, " B) more (", step,
                                       "): ", std::strerror(err)));
        }
        committed_ = target;
        return Status::success();
    }

    void zero(uint64_t offset, uint64_t bytes) override {
        check_range("zero", offset, bytes);
        std::memset(base_ + offset, 0, bytes);
    }
    void copy_out(uint64_t offset, void* dst, uint64_t bytes) const override {
        check_range("copy_out", offset, bytes);
        if (bytes) std::memcpy(dst, base_ + offset, bytes);
    }
    void copy_in(uint64_t offset, const void* src, uint64_t bytes) override {
        check_range("copy_in", offset, bytes);
        if (bytes) std::memcpy(base_ + offset, src, bytes);
    }

private:
    // Pre-faults [p, p+n) writable so the decode loop never takes a page fault.
    static bool populate(uint8_t* p, uint64_t n, int* err) {
        if (madvise(p, n, MADV_POPULATE_WRITE) == 0) return true;
        if (errno != EINVAL) {
            *err = errno;
            return false;
        }
        // Kernel older than 5.14: touch one byte per page. The pages are fresh (zero), so
        // writing a zero changes nothing but makes them resident.
        const uint64_t ps = page_size();
        for (uint64_t o = 0; o < n; o += ps) reinterpret_cast<volatile uint8_t*>(p)[o] = 0;
        return true;
    }

    void check_range(const char* op, uint64_t offset, uint64_t bytes) const {
        if (offset > committed_ || bytes > committed_ - offset)
            fail(label_, ": ", op, " of [", offset, ", ", offset + bytes, ") outside the committed ", committed_,
                 " B");
    }

    Budget* budget_;
    std::string label_;
    uint8_t* base_ = nullptr;
    uint64_t chunk_ = 0, reserved_ = 0, committed_ = 0;
};

}  // namespace

std::unique_ptr<Region> make_host_region(uint64_t reserve_bytes, Budget* budget, std::string label,
                                         uint64_t chunk_bytes) {
    return std::make_unique<HostRegion>(reserve_bytes, budget, std::move(label), chunk_bytes);
}

RegionFactory host_region_factory() {
    return [](uint64_t reserve_bytes, Budget* budget, std::string label) {
        // Host memory commits at page granularity: growth is geometric, so calls stay few
        // while small sessions commit only what they hold.
        return make_host_region(reserve_bytes, budget, std::move(label), uint64_t(sysconf(_SC_PAGESIZE)));
    };
}

}  // namespace dsv4::kv
