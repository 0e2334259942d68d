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

// ds4's "minus infinity": the initial compressor score (model-spec §1.1, §5.9).
inline constexpr float kNegInf = -1e30f;

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
    // Lowering the limit below used() refuses further acquisitions; nothing is taken back.
    void set_limit(uint64_t l) { limit_ = l; }

private:
    std::atomic<uint64_t> limit_;
    std::atomic<uint64_t> used_{0};
};

// A contiguous virtual range reserved once; a prefix of it is committed.
//
// Contract for implementations (host and device alike):
//  - base() never changes; reserved_bytes() is a multiple of chunk_bytes();
//  - commit() asks the Budget before taking memory and, on any failure, leaves the committed
//    prefix and the budget exactly as they were;
//  - newly committed memory reads as zero (anonymous pages are; device memory must be
//    cleared), so lazy and eager sessions hold identical bytes;
//  - zero/copy_out/copy_in accept only ranges inside the committed prefix and throw
//    dsv4::Error naming the region otherwise (they are not on the hot path).
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
// page faults stay out of the decode loop. chunk_bytes is rounded up to the page size.
// Throws Error (naming the label) if the address space cannot be reserved.
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
// All rows are fp32. Row c of layer il in an interleaved region starts at float
// (c · n_layers_of_that_ratio + slot[il]) · row_width.
struct Layout {
    uint64_t ctx = 0;            // logical context (tokens)
    uint32_t raw_cap = 0;        // ring rows per layer: window + one prefill chunk, <= ctx
    uint32_t n_swa = 0;          // attention window (rows a query reads from the ring)
    uint32_t head_dim = 0, indexer_dim = 0;
    uint32_t n_layer = 0;
    std::vector<uint32_t> ratio;           // per layer
    std::vector<int32_t> slot;             // per layer: index among layers of its ratio (-1 for ratio 0)
    uint32_t n_r4 = 0, n_r128 = 0;         // number of ratio-4 / ratio-128 layers
    uint64_t rows4_cap = 0, rows128_cap = 0;   // logical rows per layer: ceil(ctx/r) + 2 slack (0: no such layers)

    // offsets (bytes) inside the fixed region
    std::vector<uint64_t> raw_off;         // per layer
    std::vector<uint64_t> state_kv_off, state_sc_off;     // per compressed layer (else 0)
    std::vector<uint64_t> istate_kv_off, istate_sc_off;   // per ratio-4 layer (else 0)
    uint64_t fixed_bytes = 0;

    // sizes of the compressor states (floats)
    uint32_t state_rows(uint32_t il) const { return ratio[il] == 4 ? 8 : ratio[il]; }
    uint32_t state_width(uint32_t il) const { return (ratio[il] == 4 ? 2 : 1) * head_dim; }
    uint32_t istate_rows() const { return 8; }
    uint32_t istate_width() const { return 2 * indexer_dim; }
    uint64_t state_bytes(uint32_t il) const { return uint64_t(state_rows(il)) * state_width(il) * 4; }
    uint64_t istate_bytes() const { return uint64_t(istate_rows()) * istate_width() * 4; }
    uint64_t raw_row_bytes() const { return uint64_t(head_dim) * 4; }

    uint64_t comp4_row_group_bytes() const { return uint64_t(n_r4) * head_dim * 4; }
    uint64_t index_row_group_bytes() const { return uint64_t(n_r4) * indexer_dim * 4; }
    uint64_t comp128_row_group_bytes() const { return uint64_t(n_r128) * head_dim * 4; }

    // The logical size of everything (what eager commits; what `info --ctx` prints).
    uint64_t logical_bytes() const;

    // Throws Error for an inconsistent config (ratio list length, ratios other than 0/4/128,
    // zero dims) or ctx 0.
    static Layout make(const model::Config& c, uint64_t ctx, uint32_t prefill_chunk);
};

struct Options {
    bool eager = false;                // commit everything at creation (--kv-eager)
    // Compressed rows committed at creation for the ratio-4 streams (the seed's 4096); the
    // ratio-128 stream gets the rows covering the same tokens (initial_rows * 4 / 128).
    uint64_t initial_rows = 4096;
    double growth = 2.0;               // geometric growth factor
    bool allow_growth = true;          // tests switch this off to exercise the guard
    std::string label = "kv";          // prefix of region labels in messages ("kv comp4")
};

struct Accounting {
    uint64_t logical = 0;    // what the whole logical context would need
    uint64_t reserved = 0;   // address space reserved
    uint64_t committed = 0;  // physical memory committed
    uint64_t live = 0;       // bytes that hold data for the tokens seen so far
    Accounting& operator+=(const Accounting& o);
};

enum class RegionId { fixed, comp4, index, comp128 };

// One session's KV: the regions, the position counter and row addressing.
class SessionKV {
public:
    // Reserves the regions, commits the fixed region and the initial rows (everything when
    // eager), initialises the compressor states. Throws Error when a commit is refused.
    SessionKV(const model::Config& c, const Layout& layout, const Options& opt, Budget* budget,
              const RegionFactory& factory);
    ~SessionKV();
    SessionKV(const SessionKV&) = delete;
    SessionKV& operator=(const SessionKV&) = delete;

    const Layout& layout() const { return layout_; }
    const model::Config& config() const { return config_; }
    const Options& options() const { return opt_; }

    // Tokens whose KV has been written (the next position to write).
    uint64_t n_tokens() const { return n_tokens_; }
    void set_n_tokens(uint64_t n) { n_tokens_ = n; }
    // Rows a stream of `ratio` holds after n tokens: n / ratio.
    static uint64_t rows_after(uint64_t n_tokens, uint32_t ratio) { return ratio ? n_tokens / ratio : 0; }

    // Growth: makes sure everything a step that ends with `n_tokens_end` tokens writes is
    // committed, growing geometrically (capped at the logical capacity). Fails (budget,
    // capacity exceeded, or growth disabled and rows uncommitted) without touching any data.
    // (When the ratio-4 attention rows grow and the indexer rows are then refused, the
    // attention rows stay grown: more memory, no change to any value.)
    Status ensure_tokens(uint64_t n_tokens_end);
    // The guard: true if a step ending at n_tokens_end touches only committed rows.
    Status check(uint64_t n_tokens_end) const;

    // Rows with memory behind them, per layer of the ratio-4 stream (both comp4 and index)
    // or the ratio-128 stream; 0 for a stream without layers.
    uint64_t committed_rows(uint32_t ratio) const;
    uint64_t capacity_rows(uint32_t ratio) const {
        return ratio == 4 ? layout_.rows4_cap : ratio == 128 ? layout_.rows128_cap : 0;
    }

    // Row addressing (host pointers for host regions; device pointers for device regions).
    // nullptr when the layer has no such row (ratio 0 for comp_row, ratio != 4 for index_row).
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

    // The region behind a stream; nullptr for a stream without layers.
    Region* region(RegionId id) const;

private:
    Status grow_stream(Region& r, uint64_t rows_needed, uint64_t row_group_bytes, uint64_t cap_rows,
                       const char* what);
    std::string region_label(const char* what) const;

    model::Config config_;
    Layout layout_;
    Options opt_;
    Budget* budget_;
    std::unique_ptr<Region> fixed_, comp4_, index_, comp128_;
    uint64_t n_tokens_ = 0;
};

// ---- snapshots (design.md "Disk is a first-class tier") --------------------------------
//
// A session's KV as one versioned, checksummed blob. All fields little-endian:
//   header (88 bytes):
//     char[8] magic "DSV4KV\0\0" | u32 version | u32 n_layer | u64 model_id
//     u32 head_dim | u32 indexer_dim | u32 n_swa | u32 n_logits
//     u64 ctx (the session's, informational) | u64 n_tokens | u64 n_raw = min(n_tokens, n_swa)
//     u64 rows4 = n_tokens/4 | u64 rows128 = n_tokens/128 | u32 n_r4 | u32 n_r128
//   u32 ratio[n_layer]
//   i32 tokens[n_tokens]
//   f32 logits[n_logits]                      (n_vocab, or 0: no next-token logits, e.g. when
//                                             the last step took only the greedy id; such a
//                                             snapshot serves prompts that extend its tokens)
//   per layer: raw rows of positions n_tokens-n_raw .. n_tokens-1, in position order
//   comp4 rows 0..rows4-1, index rows 0..rows4-1, comp128 rows 0..rows128-1, each stream
//     as stored (interleaved: row c of every layer of the stream, layers in layer order)
//   per layer: if ratio != 0 state_kv, state_score; if ratio == 4 istate_kv, istate_score
//   u64 XXH3_64bits of every byte before it
// The raw ring's capacity and the session's committed rows are not part of the format: a
// snapshot loads into any session of the same model whose context holds its tokens.
inline constexpr char kSnapshotMagic[8] = {'D', 'S', 'V', '4', 'K', 'V', '\0', '\0'};
inline constexpr uint32_t kSnapshotVersion = 1;
inline constexpr uint64_t kSnapshotHeaderBytes = 88;

struct SnapshotData {
    uint64_t n_tokens = 0;
    uint64_t ctx = 0;                  // context of the session that saved it
    std::vector<int32_t> tokens;       // n_tokens ids
    std::vector<float> logits;         // next-token logits (n_vocab, or empty: none were saved)
};

// Exact size save_snapshot produces for this session in its current state, with or without
// the next-token logits.
uint64_t snapshot_bytes(const SessionKV& kv, bool with_logits = true);

// tokens must hold n_tokens() ids; logits n_vocab values or none (a session whose last step
// produced no logits: the snapshot then holds none either).
// Throws Error otherwise. `out` is replaced.
void save_snapshot(const SessionKV& kv, uint64_t model_id, const std::vector<int32_t>& tokens,
                   const std::vector<float>& logits, std::vector<uint8_t>& out);
// Streams to path + ".tmp", fsyncs, then renames over path. Throws Error naming the path.
void save_snapshot_file(const SessionKV& kv, uint64_t model_id, const std::vector<int32_t>& tokens,
                        const std::vector<float>& logits, const std::string& path);

// Validates everything (magic, version, size, checksum, model identity, shapes, n_tokens <
// the session's ctx) before touching the session, then grows it (ensure_tokens), writes the
// rows and states and sets n_tokens. Every rejection throws Error naming `label`, the field,
// the expected and the found value; a rejected snapshot leaves the session unchanged.
SnapshotData load_snapshot(SessionKV& kv, uint64_t model_id, const uint8_t* data, size_t size,
                           const std::string& label);
// Maps the file read-only and loads it; the path is the label.
SnapshotData load_snapshot_file(SessionKV& kv, uint64_t model_id, const std::string& path);

}  // namespace dsv4::kv
