// GGUF v3 reader: mmap's the file and validates header, metadata and tensor directory before
// anyone sees it. The file is untrusted: every count and length is checked against the bytes
// that remain before it is used or anything is allocated for it, with wrap-free arithmetic.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "dsv4/gguf.h"
#include "dsv4/quant.h"
#include "gguf/internal.h"

namespace dsv4::gguf {

namespace {

// Bounds-checked little-endian cursor over the image. Errors carry the file label and a
// context ("key 'x' at offset 123") set by the caller as parsing proceeds.
class Cursor {
public:
    Cursor(const uint8_t* base, uint64_t size, const std::string& label)
        : base_(base), size_(size), label_(label) {}

    void set_context(std::string ctx) { ctx_ = std::move(ctx); }

    template <typename... Args>
    [[noreturn]] void error(Args&&... args) const {
        fail(label_, ": ", ctx_, ": ", std::forward<Args>(args)...);
    }

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }
    uint64_t size() const { return size_; }

    void need(uint64_t n, const char* what) const {
        if (n > left())
            error("expected ", n, " bytes for ", what, " at offset ", pos_, ", found ", left(),
                  " before end of file (size ", size_, ")");
    }

    template <typename T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof v);
        pos_ += sizeof v;
        return v;
    }

    std::string read_string(const char* what) {
        uint64_t at = pos_;
        auto n = read<uint64_t>(what);
        if (n > left())
            error(what, " at offset ", at, " has length ", n, ", but only ", left(),
                  " bytes remain before end of file (size ", size_, ")");
        std::string s(reinterpret_cast<const char*>(base_ + pos_), size_t(n));
        pos_ += n;
        return s;
    }

private:
    const uint8_t* base_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string& label_;
    std::string ctx_;
};

ValueType read_value_type(Cursor& c, const char* what) {
    uint64_t at = c.pos();
    auto t = c.read<uint32_t>(what);
    if (t > kMaxValueType)
        c.error("unknown ", what, " ", t, " at offset ", at, ", expected 0..", kMaxValueType);
    return ValueType(t);
}

// depth: how many arrays enclose this value (0 for a key's own value).
Value read_value(Cursor& c, ValueType type, int depth) {
    Value v;
    v.type = type;
    switch (type) {
        case ValueType::U8: v.u = c.read<uint8_t>("a u8 value"); break;
        case ValueType::I8: v.i = c.read<int8_t>("an i8 value"); break;
        case ValueType::U16: v.u = c.read<uint16_t>("a u16 value"); break;
        case ValueType::I16: v.i = c.read<int16_t>("an i16 value"); break;
        case ValueType::U32: v.u = c.read<uint32_t>("a u32 value"); break;
        case ValueType::I32: v.i = c.read<int32_t>("an i32 value"); break;
        case ValueType::U64: v.u = c.read<uint64_t>("a u64 value"); break;
        case ValueType::I64: v.i = c.read<int64_t>("an i64 value"); break;
        case ValueType::F32: v.f = c.read<float>("an f32 value"); break;
        case ValueType::F64: v.f = c.read<double>("an f64 value"); break;
        case ValueType::BOOL: {
            uint64_t at = c.pos();
            v.u = c.read<uint8_t>("a bool value");
            if (v.u > 1) c.error("bool at offset ", at, ": expected 0 or 1, found ", v.u);
            break;
        }
        case ValueType::STRING: v.str = c.read_string("string value"); break;
        case ValueType::ARRAY: {
            uint64_t at = c.pos();
            if (depth >= kMaxArrayNesting)
                c.error("array at offset ", at, " is nested deeper than ", kMaxArrayNesting, " levels");
            v.elem_type = read_value_type(c, "array item type");
            uint64_t count_at = c.pos();
            auto count = c.read<uint64_t>("an array count");
            uint64_t min = min_encoded_size(v.elem_type);
            // count * min may wrap; compare by division instead.
            if (count > c.left() / min)
                c.error("array count ", count, " at offset ", count_at, " of ",
                        value_type_name(v.elem_type), " items (at least ", min,
                        " bytes each) exceeds the ", c.left(), " bytes left in the file (size ",
                        c.size(), ")");
            v.items.reserve(size_t(count));
            for (uint64_t k = 0; k < count; ++k) v.items.push_back(read_value(c, v.elem_type, depth + 1));
            break;
        }
    }
    return v;
}

}  // namespace

// ---- File: construction ---------------------------------------------------------------

File::~File() {
    if (mapped_ && base_) munmap(const_cast<uint8_t*>(base_), size_);
}

std::unique_ptr<File> File::open(const std::string& path) {
    std::unique_ptr<File> f(new File());
    f->path_ = path;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        fail(path, ": cannot stat: ", std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(path, ": not a regular file");
    }
    if (st.st_size == 0) {
        ::close(fd);
        fail(path, ": file is empty, expected a GGUF header");
    }
    // MAP_PRIVATE + PROT_READ: weights are addressed in place and never written back.
    void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) fail(path, ": cannot mmap ", st.st_size, " bytes: ", std::strerror(e));
    f->base_ = static_cast<const uint8_t*>(p);
    f->size_ = size_t(st.st_size);
    f->mapped_ = true;
    f->parse_all();
    return f;
}

std::unique_ptr<File> File::parse(const uint8_t* data, size_t size, std::string label) {
    std::unique_ptr<File> f(new File());
    f->path_ = std::move(label);
    f->base_ = data;
    f->size_ = data ? size : 0;
    f->parse_all();
    return f;
}

void File::parse_all() {
    Cursor c(base_, size_, path_);

    // ---- header
    c.set_context("header");
    auto magic = c.read<uint32_t>("the magic");
    if (magic != kMagic) {
        std::string text, hex;
        for (int k = 0; k < 4; ++k) {
            auto b = uint8_t(magic >> (8 * k));
            text += printable(std::string_view(reinterpret_cast<const char*>(&b), 1));
            hex += cat(k ? " " : "", "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15]);
        }
        c.error("bad magic at offset 0: expected \"GGUF\" (47 47 55 46), found \"", text, "\" (", hex, ")");
    }
    version_ = c.read<uint32_t>("the version");
    if (version_ != kVersion) {
        bool swapped = version_ > 0xffff && __builtin_bswap32(version_) <= kVersion;
        c.error("unsupported GGUF version ", version_, " at offset 4, expected 3",
                swapped ? " (the file looks big-endian; only little-endian GGUF is supported)" : "");
    }
    auto n_tensors = c.read<uint64_t>("the tensor count");
    auto n_kv = c.read<uint64_t>("the metadata count");
    // The smallest metadata entry is 13 bytes (empty key, type, u8) and the smallest
    // directory entry 32 (empty name, n_dims, one dim, type, offset): bound both counts by
    // the bytes left before anything is reserved for them.
    constexpr uint64_t kMinKv = 8 + 4 + 1, kMinTensor = 8 + 4 + 8 + 4 + 8;
    if (n_kv > c.left() / kMinKv)
        c.error("metadata count n_kv = ", n_kv, " at offset 16 needs at least ", kMinKv,
                " bytes per entry, but only ", c.left(), " bytes follow the header");
    if (n_tensors > (c.left() - n_kv * kMinKv) / kMinTensor)
        c.error("tensor count n_tensors = ", n_tensors, " at offset 8 needs at least ", kMinTensor,
                " bytes per entry, but only ", c.left(), " bytes follow the header (with ", n_kv,
                " metadata entries)");

    // ---- metadata
    kv_.reserve(size_t(n_kv));
    kv_offsets_.reserve(size_t(n_kv));
    for (uint64_t k = 0; k < n_kv; ++k) {
        uint64_t at = c.pos();
        c.set_context(cat("metadata entry #", k, " at offset ", at));
        std::string key = c.read_string("key");
        c.set_context(cat("key '", printable(key), "' at offset ", at));
        auto it = kv_index_.find(key);
        if (it != kv_index_.end())
            c.error("duplicate key, first defined at offset ", kv_offsets_[it->second]);
        ValueType t = read_value_type(c, "value type");
        Value v = read_value(c, t, 0);
        kv_index_.emplace(key, kv_.size());
        kv_offsets_.push_back(at);
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (auto it = kv_index_.find(kAlignmentKey); it != kv_index_.end()) {
        const Value& v = kv_[it->second].second;
        c.set_context(cat("key '", kAlignmentKey, "' at offset ", kv_offsets_[it->second]));
        bool ok = v.is_integer() && (is_unsigned_type(v.type) ? is_pow2(v.u) : v.i > 0 && is_pow2(uint64_t(v.i)));
        if (!ok) c.error("expected a non-zero power of two, found ", describe(v));
        alignment_ = is_unsigned_type(v.type) ? v.u : uint64_t(v.i);
    }

    // ---- tensor directory
    tensors_.reserve(size_t(n_tensors));
    std::vector<uint64_t> dir_offsets;
    dir_offsets.reserve(size_t(n_tensors));
    auto tensor_ctx = [&](size_t k) {
        return cat("tensor '", printable(tensors_[k].name), "' at directory offset ", dir_offsets[k]);
    };
    for (uint64_t k = 0; k < n_tensors; ++k) {
        uint64_t at = c.pos();
        c.set_context(cat("tensor #", k, " at directory offset ", at));
        TensorInfo t;
        t.name = c.read_string("tensor name");
        c.set_context(cat("tensor '", printable(t.name), "' at directory offset ", at));
        if (auto it = tensor_index_.find(t.name); it != tensor_index_.end())
            c.error("duplicate tensor name, first defined at directory offset ", dir_offsets[it->second]);
        auto n_dims = c.read<uint32_t>("n_dims");
        if (n_dims < 1 || n_dims > kMaxDims) c.error("n_dims is ", n_dims, ", expected 1..", kMaxDims);
        t.ne.resize(n_dims);
        for (auto& d : t.ne) d = c.read<uint64_t>("a dimension");
        t.type = c.read<uint32_t>("the tensor type");
        uint64_t offset_at = c.pos();
        t.offset = c.read<uint64_t>("the data offset");
        std::string why = check_tensor_shape(t.type, t.ne.data(), t.ne.size(), &t.nbytes);
        if (!why.empty()) c.error(why);
        if (t.offset % alignment_ != 0)
            c.error("data offset ", t.offset, " at offset ", offset_at,
                    " is not a multiple of the alignment ", alignment_);
        tensor_index_.emplace(t.name, tensors_.size());
        dir_offsets.push_back(at);
        tensors_.push_back(std::move(t));
    }

    // ---- data section
    uint64_t dir_end = c.pos();
    if (!align_up(dir_end, alignment_, &data_offset_)) {
        c.set_context(cat("key '", kAlignmentKey, "'"));
        c.error("data section start align_up(", dir_end, ", ", alignment_, ") overflows");
    }
    for (size_t k = 0; k < tensors_.size(); ++k) {
        TensorInfo& t = tensors_[k];
        c.set_context(tensor_ctx(k));
        uint64_t begin, end;
        if (__builtin_add_overflow(data_offset_, t.offset, &begin) ||
            __builtin_add_overflow(begin, t.nbytes, &end))
            c.error("data offset ", t.offset, " + ", t.nbytes, " bytes past the data section start ",
                    data_offset_, " overflows u64");
        if (end > size_)
            c.error("data [", begin, ", ", end, ") extends past end of file (size ", size_, ")");
        t.data = base_ + begin;
    }
    std::vector<size_t> order(tensors_.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
        const TensorInfo& prev = tensors_[order[k - 1]];
        const TensorInfo& cur = tensors_[order[k]];
        if (prev.offset + prev.nbytes > cur.offset) {  // both bounded by the file size: no wrap
            c.set_context(tensor_ctx(order[k]));
            c.error("data [", data_offset_ + cur.offset, ", ", data_offset_ + cur.offset + cur.nbytes,
                    ") overlaps tensor '", printable(prev.name), "' at [", data_offset_ + prev.offset,
                    ", ", data_offset_ + prev.offset + prev.nbytes, ")");
        }
    }
}

// ---- File: lookups and typed getters ----------------------------------------------------

const Value* File::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const Value& File::need(std::string_view key, size_t* index) const {
    auto it = kv_index_.find(key);
    if (it == kv_index_.end()) fail(path_, ": key '", printable(key), "' not found");
    *index = it->second;
    return kv_[it->second].second;
}

void File::type_error(size_t index, const char* expected, const std::string& found) const {
    fail(path_, ": key '", printable(kv_[index].first), "' at offset ", kv_offsets_[index],
         ": expected ", expected, ", found ", found);
}

namespace {

// Integer value as a non-negative u64; false for negatives and non-integers.
bool as_u64(const Value& v, uint64_t* out) {
    if (is_unsigned_type(v.type)) {
        *out = v.u;
        return true;
    }
    if (is_signed_type(v.type) && v.i >= 0) {
        *out = uint64_t(v.i);
        return true;
    }
    return false;
}

// Number as double where exact (floats, and integers of at most 53 significant bits).
bool as_f64(const Value& v, double* out) {
    if (v.is_float()) {
        *out = v.f;
        return true;
    }
    if (is_unsigned_type(v.type)) {
        double d = double(v.u);
        if (d >= 18446744073709551616.0 || uint64_t(d) != v.u) return false;
        *out = d;
        return true;
    }
    if (is_signed_type(v.type)) {
        double d = double(v.i);
        if (d >= 9223372036854775808.0 || int64_t(d) != v.i) return false;
        *out = d;
        return true;
    }
    return false;
}

bool is_numeric(ValueType t) {
    return is_unsigned_type(t) || is_signed_type(t) || t == ValueType::F32 || t == ValueType::F64;
}

}  // namespace

template <typename T>
T File::get_as(std::string_view key, const char* expected, bool (*convert)(const Value&, T*)) const {
    size_t k;
    const Value& v = need(key, &k);
    T out{};
    if (!convert(v, &out)) type_error(k, expected, describe(v));
    return out;
}

uint32_t File::get_u32(std::string_view key) const {
    return get_as<uint32_t>(key, "an unsigned integer that fits u32", [](const Value& v, uint32_t* out) {
        uint64_t u;
        if (!as_u64(v, &u) || u > std::numeric_limits<uint32_t>::max()) return false;
        *out = uint32_t(u);
        return true;
    });
}

uint64_t File::get_u64(std::string_view key) const { return get_as<uint64_t>(key, "a non-negative integer", as_u64); }

double File::get_f64(std::string_view key) const {
    return get_as<double>(key, "a number (f32, f64 or an integer exact in f64)", as_f64);
}

bool File::get_bool(std::string_view key) const {
    return get_as<bool>(key, "bool", [](const Value& v, bool* out) {
        if (v.type != ValueType::BOOL) return false;
        *out = v.u != 0;
        return true;
    });
}

std::string File::get_string(std::string_view key) const {
    return get_as<std::string>(key, "string", [](const Value& v, std::string* out) {
        if (v.type != ValueType::STRING) return false;
        *out = v.str;
        return true;
    });
}

std::vector<std::string> File::get_string_array(std::string_view key) const {
    return get_as<std::vector<std::string>>(key, "array of string", [](const Value& v, std::vector<std::string>* out) {
        if (v.type != ValueType::ARRAY || v.elem_type != ValueType::STRING) return false;
        out->reserve(v.items.size());
        for (const Value& item : v.items) out->push_back(item.str);
        return true;
    });
}

std::vector<double> File::get_number_array(std::string_view key) const {
    size_t k;
    const Value& v = need(key, &k);
    if (v.type != ValueType::ARRAY || !is_numeric(v.elem_type))
        type_error(k, "array of numbers", describe(v));
    std::vector<double> out(v.items.size());
    for (size_t j = 0; j < v.items.size(); ++j)
        if (!as_f64(v.items[j], &out[j]))
            type_error(k, "array of numbers exact in f64", cat(describe(v.items[j]), " at index ", j));
    return out;
}

}  // namespace dsv4::gguf
