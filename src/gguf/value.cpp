// Metadata values and tensor shapes: the parts of the container that reader and writer share.

#include "dsv4/gguf.h"
#include "dsv4/quant.h"
#include "gguf/internal.h"

namespace dsv4::gguf {

const char* value_type_name(ValueType t) {
    switch (t) {
        case ValueType::U8: return "u8";
        case ValueType::I8: return "i8";
        case ValueType::U16: return "u16";
        case ValueType::I16: return "i16";
        case ValueType::U32: return "u32";
        case ValueType::I32: return "i32";
        case ValueType::F32: return "f32";
        case ValueType::BOOL: return "bool";
        case ValueType::STRING: return "string";
        case ValueType::ARRAY: return "array";
        case ValueType::U64: return "u64";
        case ValueType::I64: return "i64";
        case ValueType::F64: return "f64";
    }
    return "unknown";
}

bool Value::is_integer() const {
    return is_unsigned_type(type) || is_signed_type(type);
}

bool Value::is_float() const { return type == ValueType::F32 || type == ValueType::F64; }

uint64_t TensorInfo::n_elements() const {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    return n;
}

namespace {
template <typename Set>
Value build(ValueType t, Set set) {
    Value r;
    r.type = t;
    set(r);
    return r;
}
}  // namespace

Value make_u32(uint32_t v) { return build(ValueType::U32, [&](Value& r) { r.u = v; }); }
Value make_i32(int32_t v) { return build(ValueType::I32, [&](Value& r) { r.i = v; }); }
Value make_u64(uint64_t v) { return build(ValueType::U64, [&](Value& r) { r.u = v; }); }
Value make_f32(float v) { return build(ValueType::F32, [&](Value& r) { r.f = v; }); }
Value make_bool(bool v) { return build(ValueType::BOOL, [&](Value& r) { r.u = v ? 1 : 0; }); }
Value make_string(std::string v) { return build(ValueType::STRING, [&](Value& r) { r.str = std::move(v); }); }

Value make_array(ValueType elem, std::vector<Value> items) {
    return build(ValueType::ARRAY, [&](Value& r) {
        r.elem_type = elem;
        r.items = std::move(items);
    });
}

namespace {
template <typename T, typename Make>
Value array_of(ValueType elem, const std::vector<T>& v, Make make) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (const T& x : v) items.push_back(make(x));
    return make_array(elem, std::move(items));
}
}  // namespace

Value make_string_array(const std::vector<std::string>& v) { return array_of(ValueType::STRING, v, make_string); }
Value make_f32_array(const std::vector<float>& v) { return array_of(ValueType::F32, v, make_f32); }
Value make_i32_array(const std::vector<int32_t>& v) { return array_of(ValueType::I32, v, make_i32); }
Value make_u32_array(const std::vector<uint32_t>& v) { return array_of(ValueType::U32, v, make_u32); }

// ---- internal helpers -------------------------------------------------------------------

bool is_unsigned_type(ValueType t) {
    return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}

bool is_signed_type(ValueType t) {
    return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

uint64_t min_encoded_size(ValueType t) {
    switch (t) {
        case ValueType::U8:
        case ValueType::I8:
        case ValueType::BOOL: return 1;
        case ValueType::U16:
        case ValueType::I16: return 2;
        case ValueType::U32:
        case ValueType::I32:
        case ValueType::F32: return 4;
        case ValueType::U64:
        case ValueType::I64:
        case ValueType::F64:
        case ValueType::STRING: return 8;  // a string is at least its u64 length
        case ValueType::ARRAY: return 12;  // u32 item type + u64 count
    }
    return 1;
}

std::string describe(const Value& v) {
    if (is_unsigned_type(v.type)) return cat(value_type_name(v.type), " ", v.u);
    if (is_signed_type(v.type)) return cat(value_type_name(v.type), " ", v.i);
    if (v.is_float()) return cat(value_type_name(v.type), " ", v.f);
    if (v.type == ValueType::BOOL) return v.u ? "bool true" : "bool false";
    if (v.type == ValueType::ARRAY)
        return cat("array of ", v.items.size(), " ", value_type_name(v.elem_type));
    return value_type_name(v.type);
}

std::string printable(std::string_view s) {
    // Names come from untrusted files; keep error messages on one readable line.
    constexpr size_t kMax = 120;
    std::string out;
    for (size_t i = 0; i < s.size() && i < kMax; ++i) {
        auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += char(c);
        } else {
            static const char* hex = "0123456789abcdef";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    if (s.size() > kMax) out += cat("... (", s.size(), " bytes)");
    return out;
}

std::string shape_str(const uint64_t* ne, size_t n_dims) {
    std::string s = "[";
    for (size_t i = 0; i < n_dims; ++i) s += cat(i ? ", " : "", ne[i]);
    return s + "]";
}

std::string check_tensor_shape(uint32_t type, const uint64_t* ne, size_t n_dims, uint64_t* nbytes) {
    if (n_dims < 1 || n_dims > kMaxDims) return cat("n_dims is ", n_dims, ", expected 1..", kMaxDims);
    const quant::TypeTraits* tr = quant::traits(type);
    if (!tr) return cat("unknown tensor type id ", type);
    if (tr->type == quant::Type::Q8_K)
        return cat("type Q8_K (", type, ") is an activation-only format and cannot be stored");
    for (size_t d = 0; d < n_dims; ++d)
        if (ne[d] == 0) return cat("dimension ", d, " of ", shape_str(ne, n_dims), " is 0, expected >= 1");
    if (ne[0] % tr->block_elems != 0)
        return cat("ne[0] = ", ne[0], " is not a multiple of the ", tr->name, " block size ",
                   tr->block_elems);
    // Element and byte counts must fit int64 (ggml and the model code index with signed types).
    constexpr uint64_t kLimit = uint64_t(INT64_MAX);
    uint64_t elems = 1;
    for (size_t d = 0; d < n_dims; ++d)
        if (__builtin_mul_overflow(elems, ne[d], &elems) || elems > kLimit)
            return cat("dimensions ", shape_str(ne, n_dims), " hold more than 2^63-1 elements");
    uint64_t bytes = ne[0] / tr->block_elems;
    if (__builtin_mul_overflow(bytes, uint64_t(tr->block_bytes), &bytes) || bytes > kLimit)
        return cat("byte size of ", tr->name, " ", shape_str(ne, n_dims), " exceeds 2^63-1");
    for (size_t d = 1; d < n_dims; ++d)
        if (__builtin_mul_overflow(bytes, ne[d], &bytes) || bytes > kLimit)
            return cat("byte size of ", tr->name, " ", shape_str(ne, n_dims), " exceeds 2^63-1");
    *nbytes = bytes;
    return {};
}

uint64_t tensor_nbytes(uint32_t type, const std::vector<uint64_t>& ne) {
    uint64_t nbytes = 0;
    std::string why = check_tensor_shape(type, ne.data(), ne.size(), &nbytes);
    if (!why.empty()) fail("tensor of type ", quant::type_name(type), ": ", why);
    return nbytes;
}

}  // namespace dsv4::gguf
