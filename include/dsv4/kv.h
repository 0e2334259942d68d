// The KV memory system (design.md "The KV memory system"): address space reserved for the
// whole logical context, physical memory committed only as rows are written, in chunks,
// at step boundaries. Base pointers never move and nothing is ever copied.
// Backend-neutral: a Region may be host memory (HostRegion) or device memory (CUDA).
// Knows the model's shapes (Config) but none of its math.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dsv4/common.h"
#include "dsv4/model.h"

namespace dsv4::kv {

// Outcome of a commit: never a crash, never an exception on the hot path.
struct Status {
    bool ok = true;
    std::string message;   // names the region, the bytes asked, the limit hit
    static Status success() { return {}; }
    static Status failure(std::string m) { return {false, std::move(m)}; }
    explicit operator bool() const { return ok; }
};

// Process-wide cap on committed KV bytes (--kv-budget). Thread-safe. limit 0 = unlimited.
class Budget {
public:
    explicit Budget(uint64_t limit_bytes = 0) : limit_(limit_bytes) {}
    // Reserves `bytes` of budget; fails (changing nothing) if the limit would be exceeded.
    Status acquire(uint64_t bytes, const std::string& what);
    void release(uint64_t bytes);
    uint64_t used() const { return used_.load(); }
    uint64_t limit() const { return limit_; }
    void set_limit(uint64_t l) { limit_ = l; }

private:
    std::atomic<uint64_t> limit_;
    std::atomic<uint64_t> used_{0};
};

// A contiguous virtual range reserved once; a prefix of it is committed.
class Region {
public:
    virtual ~Region() = default;
    virtual uint8_t* base() const = 0;             // stable for the region's lifetime
    virtual uint64_t reserved_bytes() const = 0;
    virtual uint64_t committed_bytes() const = 0;
    // Ensures [0, bytes) is committed (rounded up to the region's chunk). No-op when already
    // committed. Fails cleanly (budget, driver or kernel refusal) leaving the region usable.
    virtual Status commit(uint64_t bytes) = 0;
    virtual bool on_device() const = 0;
    virtual uint64_t chunk_bytes() const = 0;
    // Zeroes [offset, offset+bytes) (device regions do it on the device).
    virtual void zero(uint64_t offset, uint64_t bytes) = 0;
    // Host <-> region copies (snapshots); the range must be committed.
    virtual void copy_out(uint64_t offset, void* dst, uint64_t bytes) const = 0;
    virtual void copy_in(uint64_t offset, const void* src, uint64_t bytes) = 0;
};

// Host region: mmap(PROT_NONE, MAP_NORESERVE) to reserve; mprotect + pre-fault
// (MADV_POPULATE_WRITE where the kernel has it, touching pages otherwise) to commit, so
// page faults stay out of the decode loop.
std::unique_ptr<Region> make_host_region(uint64_t reserve_bytes, Budget* budget, std::string label,
                                         uint64_t chunk_bytes = 2u << 20);

// Creates regions for a backend (host or CUDA).
using RegionFactory = std::function<std::unique_ptr<Region>(uint64_t reserve_bytes, Budget* budget,
                                                            std::string label)>;
RegionFactory host_region_factory();

// Where every piece of one session's KV lives (model-spec §6.1–6.2). Few regions per
// session, not one per layer and stream:
//   fixed  : raw window rings of every layer + compressor states (small; committed at once)
//   comp4  : compressed attention rows of all ratio-4 layers, interleaved by row index
//            (row c of every ratio-4 layer is contiguous), so committing rows [0,n) of every
//            layer is committing a prefix of the region
//   index  : indexer rows of all ratio-4 layers, interleaved the same way
//   comp128: compressed attention rows of all ratio-128 layers, interleaved
// All rows are fp32.
struct Layout {
    uint64_t ctx = 0;            // logical context (tokens)
    uint32_t raw_cap = 0;        // ring rows per layer: window + one prefill chunk, <= ctx
    uint32_t head_dim = 0, indexer_dim = 0;
    uint32_t n_layer = 0;
    std::vector<uint32_t> ratio;           // per layer
    std::vector<int32_t> slot;             // per layer: index among layers of its ratio (-1 for ratio 0)
    uint32_t n_r4 = 0, n_r128 = 0;         // number of ratio-4 / ratio-128 layers
    uint64_t rows4_cap = 0, rows128_cap = 0;   // logical rows per layer: ceil(ctx/r) + slack

    // offsets (bytes) inside the fixed region
    std::vector<uint64_t> raw_off;         // per layer
    std::vector<uint64_t> state_kv_off, state_sc_off;     // per compressed layer (else 0)
    std::vector<uint64_t> istate_kv_off, istate_sc_off;   // per ratio-4 layer (else 0)
    uint64_t fixed_bytes = 0;

    // sizes of the compressor states (floats)
    uint32_t state_rows(uint32_t il) const { return ratio[il] == 4 ? 8 : ratio[il]; }
    uint32_t state_width(uint32_t il) const { return (ratio[il] == 4 ? 2 : 1) * head_dim; }
    uint32_t istate_width() const { return 2 * indexer_dim; }

    uint64_t comp4_row_group_bytes() const { return uint64_t(n_r4) * head_dim * 4; }
    uint64_t index_row_group_bytes() const { return uint64_t(n_r4) * indexer_dim * 4; }
    uint64_t comp128_row_group_bytes() const { return uint64_t(n_r128) * head_dim * 4; }

    // The logical size of everything (what eager commits; what `info --ctx` prints).
    uint64_t logical_bytes() const;

    static Layout make(const model::Config& c, uint64_t ctx, uint32_t prefill_chunk);
};

struct Options {
    bool eager = false;                // commit everything at creation (--kv-eager)
    uint64_t initial_rows = 4096;      // compressed rows per stream committed at creation
    double growth = 2.0;               // geometric growth factor
    bool allow_growth = true;          // tests switch this off to exercise the guard
};

struct Accounting {
    uint64_t logical = 0;    // what the whole logical context would need
    uint64_t reserved = 0;   // address space reserved
    uint64_t committed = 0;  // physical memory committed
    uint64_t live = 0;       // bytes that hold data for the tokens seen so far
    Accounting& operator+=(const Accounting& o);
};

// One session's KV: the regions, the position counter and row addressing.
class SessionKV {
public:
    SessionKV(const model::Config& c, const Layout& layout, const Options& opt, Budget* budget,
              const RegionFactory& factory);
    ~SessionKV();

    const Layout& layout() const { return layout_; }

    // Tokens whose KV has been written (the next position to write).
    uint64_t n_tokens() const { return n_tokens_; }
    void set_n_tokens(uint64_t n) { n_tokens_ = n; }
    // Rows a stream of `ratio` holds after n tokens: n / ratio.
    static uint64_t rows_after(uint64_t n_tokens, uint32_t ratio) { return ratio ? n_tokens / ratio : 0; }

    // Growth: makes sure everything a step that ends with `n_tokens_end` tokens writes is
    // committed, growing geometrically (capped at the logical capacity). Fails (budget,
    // capacity exceeded, or growth disabled and rows uncommitted) without touching anything.
    Status ensure_tokens(uint64_t n_tokens_end);
    // The guard: true if a step ending at n_tokens_end touches only committed rows.
    Status check(uint64_t n_tokens_end) const;

    // Row addressing (host pointers for host regions; device pointers for device regions).
    float* raw_row(uint32_t il, uint64_t pos) const;   // ring row for position pos
    float* comp_row(uint32_t il, uint64_t c) const;    // compressed attention row c
    float* index_row(uint32_t il, uint64_t c) const;   // indexer row c (ratio-4 layers)
    // Stride in floats between comp_row(il, c) and comp_row(il, c+1) (interleaving).
    uint64_t comp_stride(uint32_t il) const;
    uint64_t index_stride() const { return uint64_t(layout_.n_r4) * layout_.indexer_dim; }
    float* state_kv(uint32_t il) const;
    float* state_score(uint32_t il) const;
    float* istate_kv(uint32_t il) const;
    float* istate_score(uint32_t il) const;

    // Back to an empty timeline: states to (kv 0, score -inf), n_tokens 0. Keeps commits.
    void reset();

    Accounting accounting() const;
    bool on_device() const;

private:
    Status grow_stream(Region& r, uint64_t rows_needed, uint64_t row_group_bytes, uint64_t cap_rows,
                       const char* what);

    model::Config config_;
    Layout layout_;
    Options opt_;
    Budget* budget_;
    std::unique_ptr<Region> fixed_, comp4_, index_, comp128_;
    uint64_t n_tokens_ = 0;
};

}  // namespace dsv4::kv
