// GGUF v3 writer. Everything is validated when it is added, so that write() can only fail
// on I/O. Tensor bytes produced by callbacks are generated one tensor at a time while the
// file is written, so a multi-gigabyte model never sits in memory whole.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "dsv4/gguf.h"
#include "dsv4/quant.h"
#include "gguf/internal.h"

namespace dsv4::gguf {

struct Writer::Pending {
    std::string name;
    uint32_t type = 0;
    std::vector<uint64_t> ne;
    uint64_t nbytes = 0;
    std::vector<uint8_t> bytes;  // used when fill is empty
    Fill fill;
};

namespace {

// Rejects what the reader would reject, so that every written file reads back.
void check_value(const Value& v, int depth, const std::string& key) {
    auto bad = [&](auto&&... why) { fail("gguf writer: key '", printable(key), "': ", why...); };
    auto check_u = [&](uint64_t max) {
        if (v.u > max) bad(value_type_name(v.type), " value ", v.u, " is out of range");
    };
    auto check_i = [&](int64_t min, int64_t max) {
        if (v.i < min || v.i > max) bad(value_type_name(v.type), " value ", v.i, " is out of range");
    };
    switch (v.type) {
        case ValueType::U8: check_u(0xff); break;
        case ValueType::U16: check_u(0xffff); break;
        case ValueType::U32: check_u(0xffffffffu); break;
        case ValueType::BOOL: check_u(1); break;
        case ValueType::I8: check_i(INT8_MIN, INT8_MAX); break;
        case ValueType::I16: check_i(INT16_MIN, INT16_MAX); break;
        case ValueType::I32: check_i(INT32_MIN, INT32_MAX); break;
        case ValueType::U64:
        case ValueType::I64:
        case ValueType::F32:
        case ValueType::F64:
        case ValueType::STRING: break;
        case ValueType::ARRAY:
            if (depth >= kMaxArrayNesting) bad("arrays nested deeper than ", kMaxArrayNesting, " levels");
            if (uint32_t(v.elem_type) > kMaxValueType) bad("unknown array item type ", uint32_t(v.elem_type));
            for (size_t k = 0; k < v.items.size(); ++k) {
                if (v.items[k].type != v.elem_type)
                    bad("array item ", k, " has type ", value_type_name(v.items[k].type), ", expected ",
                        value_type_name(v.elem_type));
                check_value(v.items[k], depth + 1, key);
            }
            break;
        default: bad("unknown value type ", uint32_t(v.type));
    }
}

class Encoder {
public:
    explicit Encoder(std::vector<uint8_t>& out) : out_(out) {}

    template <typename T>
    void put(T v) {
        size_t n = out_.size();
        out_.resize(n + sizeof v);
        std::memcpy(out_.data() + n, &v, sizeof v);
    }

    void put_string(const std::string& s) {
        put<uint64_t>(s.size());
        out_.insert(out_.end(), s.begin(), s.end());
    }

    void put_value(const Value& v) {
        switch (v.type) {
            case ValueType::U8: put(uint8_t(v.u)); break;
            case ValueType::I8: put(int8_t(v.i)); break;
            case ValueType::U16: put(uint16_t(v.u)); break;
            case ValueType::I16: put(int16_t(v.i)); break;
            case ValueType::U32: put(uint32_t(v.u)); break;
            case ValueType::I32: put(int32_t(v.i)); break;
            case ValueType::U64: put(uint64_t(v.u)); break;
            case ValueType::I64: put(int64_t(v.i)); break;
            case ValueType::F32: put(float(v.f)); break;
            case ValueType::F64: put(double(v.f)); break;
            case ValueType::BOOL: put(uint8_t(v.u ? 1 : 0)); break;
            case ValueType::STRING: put_string(v.str); break;
            case ValueType::ARRAY:
                put(uint32_t(v.elem_type));
                put<uint64_t>(v.items.size());
                for (const Value& item : v.items) put_value(item);
                break;
        }
    }

private:
    std::vector<uint8_t>& out_;
};

Value alignment_value(uint64_t a) {
    return a <= std::numeric_limits<uint32_t>::max() ? make_u32(uint32_t(a)) : make_u64(a);
}

}  // namespace

Writer::Writer(uint64_t alignment) : alignment_(alignment) {
    if (!is_pow2(alignment)) fail("gguf writer: alignment ", alignment, " is not a non-zero power of two");
    if (alignment != kDefaultAlignment) kv_.emplace_back(kAlignmentKey, alignment_value(alignment));
}

void Writer::set(std::string key, Value v) {
    check_value(v, 0, key);
    if (key == kAlignmentKey) {
        bool ok = is_signed_type(v.type) ? v.i > 0 && is_pow2(uint64_t(v.i))
                                         : is_unsigned_type(v.type) && is_pow2(v.u);
        if (!ok) fail("gguf writer: key '", kAlignmentKey, "': expected a non-zero power of two, found ", describe(v));
        alignment_ = is_signed_type(v.type) ? uint64_t(v.i) : v.u;
    }
    for (auto& kv : kv_)
        if (kv.first == key) {
            kv.second = std::move(v);
            return;
        }
    kv_.emplace_back(std::move(key), std::move(v));
}

void Writer::add_tensor(std::string name, uint32_t type, std::vector<uint64_t> ne,
                        std::vector<uint8_t> bytes) {
    uint64_t nbytes = 0;
    if (check_tensor_shape(type, ne.data(), ne.size(), &nbytes).empty() && bytes.size() != nbytes)
        fail("gguf writer: tensor '", printable(name), "': expected ", nbytes, " bytes for ",
             quant::type_name(type), " ", shape_str(ne.data(), ne.size()), ", found ", bytes.size());
    add_tensor(std::move(name), type, std::move(ne), Fill{});  // checks name and shape
    tensors_.back()->bytes = std::move(bytes);
}

void Writer::add_tensor(std::string name, uint32_t type, std::vector<uint64_t> ne, Fill fill) {
    if (tensor_index_.count(name)) fail("gguf writer: duplicate tensor name '", printable(name), "'");
    auto p = std::make_shared<Pending>();
    std::string why = check_tensor_shape(type, ne.data(), ne.size(), &p->nbytes);
    if (!why.empty()) fail("gguf writer: tensor '", printable(name), "': ", why);
    p->name = std::move(name);
    p->type = type;
    p->ne = std::move(ne);
    p->fill = std::move(fill);
    tensor_index_.emplace(p->name, tensors_.size());
    tensors_.push_back(std::move(p));
}

std::vector<uint8_t> Writer::encode_header(std::vector<uint64_t>* offsets) const {
    std::vector<uint8_t> out;
    Encoder e(out);
    e.put(kMagic);
    e.put(kVersion);
    e.put<uint64_t>(tensors_.size());
    e.put<uint64_t>(kv_.size());
    for (const auto& [key, v] : kv_) {
        e.put_string(key);
        e.put(uint32_t(v.type));
        e.put_value(v);
    }
    uint64_t next = 0;
    offsets->clear();
    for (const auto& t : tensors_) {
        if (!align_up(next, alignment_, &next)) fail("gguf writer: data section exceeds 2^64 bytes");
        offsets->push_back(next);
        e.put_string(t->name);
        e.put(uint32_t(t->ne.size()));
        for (uint64_t d : t->ne) e.put(d);
        e.put(t->type);
        e.put(next);
        next += t->nbytes;
    }
    if (!tensors_.empty()) {
        uint64_t data_offset;
        if (!align_up(out.size(), alignment_, &data_offset)) fail("gguf writer: header alignment overflows");
        out.resize(size_t(data_offset), 0);
    }
    return out;
}

void Writer::emit(const Sink& sink) const {
    std::vector<uint64_t> offsets;
    std::vector<uint8_t> header = encode_header(&offsets);
    sink(header.data(), header.size());
    static const uint8_t kZeros[4096] = {};
    uint64_t pos = 0;  // relative to the data section
    std::vector<uint8_t> buf;
    for (size_t k = 0; k < tensors_.size(); ++k) {
        const Pending& t = *tensors_[k];
        for (uint64_t pad = offsets[k] - pos; pad > 0;) {
            size_t n = size_t(std::min<uint64_t>(pad, sizeof kZeros));
            sink(kZeros, n);
            pad -= n;
        }
        if (t.fill) {
            buf.assign(size_t(t.nbytes), 0);  // zeroed: a careless fill cannot leak old bytes
            t.fill(buf.data(), buf.size());
            sink(buf.data(), buf.size());
        } else {
            sink(t.bytes.data(), t.bytes.size());
        }
        pos = offsets[k] + t.nbytes;
    }
}

std::vector<uint8_t> Writer::to_bytes() const {
    std::vector<uint8_t> out;
    emit([&](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); });
    return out;
}

void Writer::write(const std::string& path) const {
    // Write beside the target and rename: a reader never sees a half-written model, and an
    // existing file survives a failed write.
    const std::string tmp = path + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(tmp, ": cannot create: ", std::strerror(errno));
    try {
        emit([&](const uint8_t* p, size_t n) {
            while (n > 0) {
                ssize_t w = ::write(fd, p, n);
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) fail(tmp, ": write failed: ", w < 0 ? std::strerror(errno) : "no progress");
                p += w;
                n -= size_t(w);
            }
        });
        int rc = ::close(fd);
        fd = -1;
        if (rc != 0) fail(tmp, ": close failed: ", std::strerror(errno));
        if (std::rename(tmp.c_str(), path.c_str()) != 0)
            fail(path, ": cannot rename ", tmp, " into place: ", std::strerror(errno));
    } catch (...) {
        if (fd >= 0) ::close(fd);
        ::unlink(tmp.c_str());
        throw;
    }
}

}  // namespace dsv4::gguf
