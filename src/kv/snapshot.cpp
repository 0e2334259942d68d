// Snapshots: a session's KV as one versioned, checksummed blob (format in kv.h).
// Bulk data moves only through Region::copy_in/copy_out, so device sessions work too.
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "dsv4/kv.h"

namespace dsv4::kv {

static_assert(std::endian::native == std::endian::little, "the snapshot format is little-endian");

namespace {

// Everything the header says, and what the body's size follows from.
struct Header {
    uint32_t version = kSnapshotVersion;
    uint32_t n_layer = 0;
    uint64_t model_id = 0;
    uint32_t head_dim = 0, indexer_dim = 0, n_swa = 0, n_logits = 0;
    uint64_t ctx = 0, n_tokens = 0, n_raw = 0, rows4 = 0, rows128 = 0;
    uint32_t n_r4 = 0, n_r128 = 0;
    std::vector<uint32_t> ratio;
};

// n_logits: the next-token logits saved (n_vocab, or 0: see kv.h).
Header header_of(const SessionKV& kv, uint64_t model_id, uint32_t n_logits) {
    const Layout& l = kv.layout();
    Header h;
    h.n_layer = l.n_layer;
    h.model_id = model_id;
    h.head_dim = l.head_dim;
    h.indexer_dim = l.indexer_dim;
    h.n_swa = l.n_swa;
    h.n_logits = n_logits;
    h.ctx = l.ctx;
    h.n_tokens = kv.n_tokens();
    h.n_raw = std::min<uint64_t>(h.n_tokens, l.n_swa);
    h.rows4 = SessionKV::rows_after(h.n_tokens, 4);
    h.rows128 = SessionKV::rows_after(h.n_tokens, 128);
    h.n_r4 = l.n_r4;
    h.n_r128 = l.n_r128;
    h.ratio = l.ratio;
    return h;
}

// Sum of products with overflow detection: a corrupted header must not wrap around into a
// size that happens to match.
class SizeSum {
public:
    void add(std::initializer_list<uint64_t> factors) {
        uint64_t p = 1;
        for (uint64_t f : factors) overflow_ |= __builtin_mul_overflow(p, f, &p);
        overflow_ |= __builtin_add_overflow(total_, p, &total_);
    }
    bool overflow() const { return overflow_; }
    uint64_t total() const { return total_; }

private:
    uint64_t total_ = 0;
    bool overflow_ = false;
};

// Total blob size the header describes (checksum included); false on overflow.
bool blob_size(const Header& h, uint64_t* out) {
    SizeSum s;
    s.add({kSnapshotHeaderBytes});
    s.add({h.n_layer, 4});                        // ratios
    s.add({h.n_tokens, 4});                       // tokens
    s.add({h.n_logits, 4});                       // logits
    s.add({h.n_layer, h.n_raw, h.head_dim, 4});   // raw window
    s.add({h.rows4, h.n_r4, h.head_dim, 4});      // comp4
    s.add({h.rows4, h.n_r4, h.indexer_dim, 4});   // index
    s.add({h.rows128, h.n_r128, h.head_dim, 4});  // comp128
    s.add({h.n_r4, 2, 8, 2, h.head_dim, 4});      // ratio-4 attention compressor kv + score
    s.add({h.n_r4, 2, 8, 2, h.indexer_dim, 4});   // ratio-4 indexer compressor kv + score
    s.add({h.n_r128, 2, 128, h.head_dim, 4});     // ratio-128 compressor kv + score
    s.add({8});                                   // checksum
    *out = s.total();
    return !s.overflow();
}

// The region bytes of the body, in file order: the one place that defines it for both
// directions. fn(region, offset, bytes, field) is called only for non-empty pieces.
template <typename Fn>
void for_each_piece(const SessionKV& kv, uint64_t n_tokens, Fn&& fn) {
    const Layout& l = kv.layout();
    Region& fixed = *kv.region(RegionId::fixed);
    auto piece = [&](Region& r, uint64_t offset, uint64_t bytes, const char* field) {
        if (bytes) fn(r, offset, bytes, field);
    };
    // Raw window in position order. Position p lives in ring row p % raw_cap of whichever
    // session is at hand, so a snapshot moves between sessions with different rings; the
    // window never exceeds the ring, so it wraps at most once.
    const uint64_t n_raw = std::min<uint64_t>(n_tokens, l.n_swa);
    const uint64_t row = l.raw_row_bytes();
    const uint64_t slot0 = (n_tokens - n_raw) % l.raw_cap;
    const uint64_t run1 = std::min<uint64_t>(n_raw, l.raw_cap - slot0);
    for (uint32_t il = 0; il < l.n_layer; ++il) {
        piece(fixed, l.raw_off[il] + slot0 * row, run1 * row, "raw rows");
        piece(fixed, l.raw_off[il], (n_raw - run1) * row, "raw rows");
    }
    // Compressed streams as stored: rows [0, n) of an interleaved region are its prefix.
    if (l.n_r4) {
        const uint64_t rows = SessionKV::rows_after(n_tokens, 4);
        piece(*kv.region(RegionId::comp4), 0, rows * l.comp4_row_group_bytes(), "comp4 rows");
        piece(*kv.region(RegionId::index), 0, rows * l.index_row_group_bytes(), "index rows");
    }
    if (l.n_r128) {
        const uint64_t rows = SessionKV::rows_after(n_tokens, 128);
        piece(*kv.region(RegionId::comp128), 0, rows * l.comp128_row_group_bytes(), "comp128 rows");
    }
    for (uint32_t il = 0; il < l.n_layer; ++il) {
        if (l.ratio[il] == 0) continue;
        piece(fixed, l.state_kv_off[il], l.state_bytes(il), "compressor state");
        piece(fixed, l.state_sc_off[il], l.state_bytes(il), "compressor state");
        if (l.ratio[il] != 4) continue;
        piece(fixed, l.istate_kv_off[il], l.istate_bytes(), "indexer compressor state");
        piece(fixed, l.istate_sc_off[il], l.istate_bytes(), "indexer compressor state");
    }
}

// ---- writing ------------------------------------------------------------------------------

// Hashes everything put through it; subclasses decide where the bytes go.
class Sink {
public:
    Sink() : state_(XXH3_createState()) {
        if (!state_) fail("snapshot: cannot allocate the checksum state");
        XXH3_64bits_reset(state_);
    }
    virtual ~Sink() { XXH3_freeState(state_); }

    void put(const void* p, uint64_t n) {
        if (n == 0) return;
        XXH3_64bits_update(state_, p, size_t(n));
        emit(p, n);
    }
    template <typename T>
    void put_value(T v) {
        put(&v, sizeof v);
    }
    // Region bytes go through a bounded host staging buffer (device regions cannot be read
    // in place).
    void put_region(const Region& r, uint64_t offset, uint64_t n) {
        constexpr uint64_t kStage = 8u << 20;
        if (staging_.empty() && n) staging_.resize(size_t(std::min(n, kStage)));
        while (n) {
            const uint64_t k = std::min<uint64_t>(n, staging_.size());
            r.copy_out(offset, staging_.data(), k);
            put(staging_.data(), k);
            offset += k;
            n -= k;
        }
    }
    void finish() {
        const uint64_t h = XXH3_64bits_digest(state_);
        emit(&h, sizeof h);
    }

protected:
    virtual void emit(const void* p, uint64_t n) = 0;

private:
    XXH3_state_t* state_;
    std::vector<uint8_t> staging_;
};

class VectorSink final : public Sink {
public:
    explicit VectorSink(std::vector<uint8_t>& out) : out_(out) {}

private:
    void emit(const void* p, uint64_t n) override {
        const uint8_t* b = static_cast<const uint8_t*>(p);
        out_.insert(out_.end(), b, b + n);
    }
    std::vector<uint8_t>& out_;
};

class FileSink final : public Sink {
public:
    FileSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) { buf_.reserve(kBuf); }
    void flush() {
        const uint8_t* p = buf_.data();
        size_t n = buf_.size();
        while (n) {
            const ssize_t w = ::write(fd_, p, n);
            if (w < 0) {
                if (errno == EINTR) continue;
                fail("snapshot ", path_, ": write failed: ", std::strerror(errno));
            }
            p += w;
            n -= size_t(w);
        }
        buf_.clear();
    }

private:
    static constexpr size_t kBuf = 8u << 20;
    void emit(const void* p, uint64_t n) override {
        const uint8_t* b = static_cast<const uint8_t*>(p);
        while (n) {
            const size_t k = size_t(std::min<uint64_t>(n, kBuf - buf_.size()));
            buf_.insert(buf_.end(), b, b + k);
            b += k;
            n -= k;
            if (buf_.size() == kBuf) flush();
        }
    }
    int fd_;
    std::string path_;
    std::vector<uint8_t> buf_;
};

void check_save_args(const SessionKV& kv, const std::vector<int32_t>& tokens, const std::vector<float>& logits,
                     const std::string& where) {
    const uint64_t t = kv.n_tokens();
    if (tokens.size() != t)
        fail("snapshot ", where, ": tokens: expected ", t, " ids (the session's n_tokens), found ", tokens.size());
    if (!logits.empty() && logits.size() != kv.config().n_vocab)
        fail("snapshot ", where, ": logits: expected ", kv.config().n_vocab, " values (n_vocab) or none, found ",
             logits.size());
    // Every row the snapshot reads must exist; a session whose counter ran ahead of its
    // commits is a bug, not something to serialise.
    const Status s = kv.check(t);
    if (!s) fail("snapshot ", where, ": session state is inconsistent: ", s.message);
}

void write_snapshot(const SessionKV& kv, uint64_t model_id, const std::vector<int32_t>& tokens,
                    const std::vector<float>& logits, Sink& out) {
    const Header h = header_of(kv, model_id, uint32_t(logits.size()));

    uint8_t head[kSnapshotHeaderBytes];
    size_t at = 0;
    auto field = [&](const auto& v) {
        std::memcpy(head + at, &v, sizeof v);
        at += sizeof v;
    };
    std::memcpy(head, kSnapshotMagic, sizeof kSnapshotMagic);
    at = sizeof kSnapshotMagic;
    field(h.version);
    field(h.n_layer);
    field(h.model_id);
    field(h.head_dim);
    field(h.indexer_dim);
    field(h.n_swa);
    field(h.n_logits);
    field(h.ctx);
    field(h.n_tokens);
    field(h.n_raw);
    field(h.rows4);
    field(h.rows128);
    field(h.n_r4);
    field(h.n_r128);
    if (at != kSnapshotHeaderBytes) fail("snapshot: internal error: header is ", at, " bytes");
    out.put(head, at);
    out.put(h.ratio.data(), uint64_t(h.n_layer) * 4);
    out.put(tokens.data(), uint64_t(tokens.size()) * 4);
    out.put(logits.data(), uint64_t(logits.size()) * 4);

    for_each_piece(kv, h.n_tokens,
                   [&](Region& r, uint64_t offset, uint64_t bytes, const char*) { out.put_region(r, offset, bytes); });
    out.finish();
}

// ---- reading ------------------------------------------------------------------------------

// Reads fields in order, never past the end; every shortfall names the field.
class Cursor {
public:
    Cursor(const uint8_t* data, uint64_t size, const std::string& label) : p_(data), n_(size), label_(label) {}
    const uint8_t* take(uint64_t bytes, const char* field) {
        if (bytes > n_ - at_)
            fail("snapshot ", label_, ": truncated at ", field, ": expected ", bytes, " more bytes at offset ", at_,
                 ", found ", n_ - at_);
        const uint8_t* p = p_ + at_;
        at_ += bytes;
        return p;
    }
    template <typename T>
    T value(const char* field) {
        T v;
        std::memcpy(&v, take(sizeof v, field), sizeof v);
        return v;
    }
    uint64_t offset() const { return at_; }

private:
    const uint8_t* p_;
    uint64_t n_, at_ = 0;
    const std::string& label_;
};

template <typename A, typename B>
void expect(const std::string& label, const char* field, const A& expected, const B& found, const char* why = "") {
    if (uint64_t(expected) != uint64_t(found))
        fail("snapshot ", label, ": ", field, ": expected ", expected, why, ", found ", found);
}

std::string hex(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016llx", (unsigned long long)v);
    return buf;
}

}  // namespace

uint64_t snapshot_bytes(const SessionKV& kv, bool with_logits) {
    uint64_t n = 0;
    blob_size(header_of(kv, 0, with_logits ? kv.config().n_vocab : 0), &n);
    return n;
}

void save_snapshot(const SessionKV& kv, uint64_t model_id, const std::vector<int32_t>& tokens,
                   const std::vector<float>& logits, std::vector<uint8_t>& out) {
    check_save_args(kv, tokens, logits, "(memory)");
    out.clear();
    out.reserve(size_t(snapshot_bytes(kv, !logits.empty())));
    VectorSink sink(out);
    write_snapshot(kv, model_id, tokens, logits, sink);
}

void save_snapshot_file(const SessionKV& kv, uint64_t model_id, const std::vector<int32_t>& tokens,
                        const std::vector<float>& logits, const std::string& path) {
    check_save_args(kv, tokens, logits, path);
    // Write beside the target and rename: a crash mid-write never leaves a torn file under
    // the final name.
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("snapshot ", path, ": cannot create ", tmp, ": ", std::strerror(errno));
    try {
        FileSink sink(fd, path);
        write_snapshot(kv, model_id, tokens, logits, sink);
        sink.flush();
        if (::fsync(fd) != 0) fail("snapshot ", path, ": fsync failed: ", std::strerror(errno));
    } catch (...) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw;
    }
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        fail("snapshot ", path, ": close failed: ", std::strerror(err));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        fail("snapshot ", path, ": cannot rename ", tmp, ": ", std::strerror(err));
    }
}

SnapshotData load_snapshot(SessionKV& kv, uint64_t model_id, const uint8_t* data, size_t size,
                           const std::string& label) {
    const Layout& l = kv.layout();
    Cursor in(data, size, label);

    // 1. What the file says about itself: magic, version, a self-consistent header.
    const uint8_t* magic = in.take(sizeof kSnapshotMagic, "magic");
    if (std::memcmp(magic, kSnapshotMagic, sizeof kSnapshotMagic) != 0)
        fail("snapshot ", label, ": magic: expected \"DSV4KV\", found another file type");
    Header h;
    h.version = in.value<uint32_t>("version");
    expect(label, "format version", kSnapshotVersion, h.version);
    h.n_layer = in.value<uint32_t>("n_layer");
    h.model_id = in.value<uint64_t>("model_id");
    h.head_dim = in.value<uint32_t>("head_dim");
    h.indexer_dim = in.value<uint32_t>("indexer_dim");
    h.n_swa = in.value<uint32_t>("n_swa");
    h.n_logits = in.value<uint32_t>("n_logits");
    h.ctx = in.value<uint64_t>("ctx");
    h.n_tokens = in.value<uint64_t>("n_tokens");
    h.n_raw = in.value<uint64_t>("n_raw");
    h.rows4 = in.value<uint64_t>("rows4");
    h.rows128 = in.value<uint64_t>("rows128");
    h.n_r4 = in.value<uint32_t>("n_r4");
    h.n_r128 = in.value<uint32_t>("n_r128");
    const uint8_t* ratios = in.take(uint64_t(h.n_layer) * 4, "ratios");
    h.ratio.resize(h.n_layer);
    if (h.n_layer) std::memcpy(h.ratio.data(), ratios, size_t(h.n_layer) * 4);
    uint32_t n_r4 = 0, n_r128 = 0;
    for (uint32_t il = 0; il < h.n_layer; ++il) {
        const uint32_t r = h.ratio[il];
        if (r != 0 && r != 4 && r != 128)
            fail("snapshot ", label, ": ratio of layer ", il, ": expected 0, 4 or 128, found ", r);
        n_r4 += r == 4;
        n_r128 += r == 128;
    }
    expect(label, "n_r4", n_r4, h.n_r4, " (ratio-4 layers in the ratio list)");
    expect(label, "n_r128", n_r128, h.n_r128, " (ratio-128 layers in the ratio list)");
    expect(label, "n_raw", std::min<uint64_t>(h.n_tokens, h.n_swa), h.n_raw, " (min(n_tokens, n_swa))");
    expect(label, "rows4", h.n_tokens / 4, h.rows4, " (n_tokens / 4)");
    expect(label, "rows128", h.n_tokens / 128, h.rows128, " (n_tokens / 128)");

    // 2. Size, then checksum: a torn or corrupted file is named as such before any field of
    //    it is compared with the session.
    uint64_t total = 0;
    if (!blob_size(h, &total))
        fail("snapshot ", label, ": header describes a size that overflows 64 bits (n_tokens ", h.n_tokens, ")");
    if (size < total)
        fail("snapshot ", label, ": truncated: expected ", total, " bytes, found ", size);
    if (size > total)
        fail("snapshot ", label, ": trailing bytes: expected ", total, " bytes, found ", size);
    uint64_t stored = 0;
    std::memcpy(&stored, data + size - 8, 8);
    const uint64_t computed = XXH3_64bits(data, size - 8);
    if (stored != computed)
        fail("snapshot ", label, ": checksum: expected ", hex(computed), " (computed over the file), found ",
             hex(stored), " (file is corrupted)");

    // 3. Made for this model and this session's shapes?
    if (h.model_id != model_id)
        fail("snapshot ", label, ": model identity: expected ", hex(model_id), ", found ", hex(h.model_id),
             " (the snapshot was made with another model)");
    expect(label, "n_layer", l.n_layer, h.n_layer);
    for (uint32_t il = 0; il < l.n_layer; ++il)
        if (l.ratio[il] != h.ratio[il])
            fail("snapshot ", label, ": ratio of layer ", il, ": expected ", l.ratio[il], ", found ", h.ratio[il]);
    expect(label, "head_dim", l.head_dim, h.head_dim);
    expect(label, "indexer_dim", l.indexer_dim, h.indexer_dim);
    expect(label, "sliding window n_swa", l.n_swa, h.n_swa);
    if (h.n_logits != 0 && h.n_logits != kv.config().n_vocab)
        fail("snapshot ", label, ": n_logits: expected ", kv.config().n_vocab, " (n_vocab) or 0, found ", h.n_logits);
    if (h.n_tokens >= l.ctx)
        fail("snapshot ", label, ": n_tokens: expected fewer than the session's context of ", l.ctx,
             " tokens, found ", h.n_tokens, " (saved with a context of ", h.ctx, ")");

    // 4. Room for it: grow before writing anything.
    const Status s = kv.ensure_tokens(h.n_tokens);
    if (!s) fail("snapshot ", label, ": cannot hold ", h.n_tokens, " tokens: ", s.message);

    // 5. Copy. Sizes were all checked above; the cursor re-checks each step anyway.
    SnapshotData out;
    out.n_tokens = h.n_tokens;
    out.ctx = h.ctx;
    out.tokens.resize(size_t(h.n_tokens));
    const uint8_t* tokens = in.take(h.n_tokens * 4, "tokens");
    if (h.n_tokens) std::memcpy(out.tokens.data(), tokens, size_t(h.n_tokens) * 4);
    out.logits.resize(h.n_logits);
    const uint8_t* logits = in.take(uint64_t(h.n_logits) * 4, "logits");
    if (h.n_logits) std::memcpy(out.logits.data(), logits, size_t(h.n_logits) * 4);

    for_each_piece(kv, h.n_tokens, [&](Region& r, uint64_t offset, uint64_t bytes, const char* field) {
        r.copy_in(offset, in.take(bytes, field), bytes);
    });
    in.take(8, "checksum");
    kv.set_n_tokens(h.n_tokens);
    return out;
}

SnapshotData load_snapshot_file(SessionKV& kv, uint64_t model_id, const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("snapshot ", path, ": cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        fail("snapshot ", path, ": cannot stat: ", std::strerror(err));
    }
    const size_t size = size_t(st.st_size);
    if (size == 0) {
        ::close(fd);
        return load_snapshot(kv, model_id, nullptr, 0, path);   // names the truncation
    }
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) fail("snapshot ", path, ": cannot map ", size, " bytes: ", std::strerror(err));
    ::madvise(p, size, MADV_SEQUENTIAL);
    struct Unmap {
        void* p;
        size_t n;
        ~Unmap() { ::munmap(p, n); }
    } unmap{p, size};
    return load_snapshot(kv, model_id, static_cast<const uint8_t*>(p), size, path);
}

}  // namespace dsv4::kv
