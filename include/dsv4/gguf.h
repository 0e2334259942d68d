// GGUF v3 container: a validating, mmap'd, zero-copy reader and a writer.
// Knows nothing of models: keys and tensors are plain names here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/common.h"

namespace dsv4::gguf {

// Metadata value types, numbered as in the GGUF specification.
enum class ValueType : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars keep their exact type; arrays keep the element type and
// their items (nested arrays are arrays of Values). Numeric accessors convert where the
// conversion is exact and throw Error otherwise.
struct Value {
    ValueType type = ValueType::U8;
    ValueType elem_type = ValueType::U8;  // for ARRAY
    uint64_t u = 0;                        // U8..U64, BOOL
    int64_t i = 0;                         // I8..I64
    double f = 0;                          // F32, F64
    std::string str;                       // STRING
    std::vector<Value> items;              // ARRAY

    bool is_integer() const;
    bool is_float() const;
    bool is_array() const { return type == ValueType::ARRAY; }
};

// Convenience constructors (used by the writer and tests).
Value make_u32(uint32_t v);
Value make_i32(int32_t v);
Value make_u64(uint64_t v);
Value make_f32(float v);
Value make_bool(bool v);
Value make_string(std::string v);
Value make_array(ValueType elem, std::vector<Value> items);
Value make_string_array(const std::vector<std::string>& v);
Value make_f32_array(const std::vector<float>& v);
Value make_i32_array(const std::vector<int32_t>& v);
Value make_u32_array(const std::vector<uint32_t>& v);

// A tensor as the directory describes it. ne[0] is the contiguous dimension.
struct TensorInfo {
    std::string name;
    uint32_t type = 0;             // ggml type id (see quant.h)
    std::vector<uint64_t> ne;      // 1..8 dims, fastest first
    uint64_t offset = 0;           // relative to the data section
    uint64_t nbytes = 0;           // from the type's block size
    const uint8_t* data = nullptr; // points into the mapping (reader only)

    uint64_t n_elements() const;
};

// Bytes a tensor of this ggml type and shape occupies: ceil(ne0 / block) * block_bytes per
// row times the other dims. Throws Error for a type that cannot be stored (unknown, or the
// activation-only Q8_K), 0 or more than 8 dims, a zero dim, ne0 not a multiple of the
// block size, or an element/byte count beyond 2^63 - 1.
uint64_t tensor_nbytes(uint32_t type, const std::vector<uint64_t>& ne);

// Deepest array nesting accepted (an array of arrays of u8 is nesting 2).
inline constexpr int kMaxArrayNesting = 8;

// Read-only view of a GGUF v3 file. The file is mmap'd; tensor data is never copied.
// Construction validates the whole header and directory; any inconsistency throws Error
// naming the file, the byte offset and the key or tensor involved.
class File {
public:
    static std::unique_ptr<File> open(const std::string& path);
    // Parse an in-memory image (the fuzzer and tests use this). The buffer must outlive the File.
    static std::unique_ptr<File> parse(const uint8_t* data, size_t size, std::string label = "<memory>");
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }
    uint64_t file_size() const { return size_; }

    // Metadata in file order, and lookup by key.
    const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
    const Value* find(std::string_view key) const;
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters; throw Error naming the key when missing or of an incompatible type.
    uint32_t get_u32(std::string_view key) const;        // U8/U16/U32 (or non-negative signed that fits)
    uint64_t get_u64(std::string_view key) const;        // any non-negative integer
    double get_f64(std::string_view key) const;          // F32/F64 or any integer
    bool get_bool(std::string_view key) const;
    std::string get_string(std::string_view key) const;
    std::vector<std::string> get_string_array(std::string_view key) const;
    std::vector<double> get_number_array(std::string_view key) const;   // integers or floats

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;

private:
    File() = default;
    void parse_all();
    const Value& need(std::string_view key, size_t* index) const;
    [[noreturn]] void type_error(size_t index, const char* expected, const std::string& found) const;
    // The typed getters' common part: the value of `key` as `convert` makes it (false: a value
    // of another type, reported as a type error naming `expected`). Defined in reader.cpp.
    template <typename T>
    T get_as(std::string_view key, const char* expected, bool (*convert)(const Value&, T*)) const;

    std::string path_;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    bool mapped_ = false;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, Value>> kv_;
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<uint64_t> kv_offsets_;  // file offset of each key, for error messages
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Streaming writer: collect metadata and tensors, then write() once. Tensor data is
// either copied from a caller buffer or produced by a callback at write time, so
// multi-gigabyte files (synth flash) never sit in memory whole.
class Writer {
public:
    // alignment: a power of two; general.alignment is written when it is not 32.
    explicit Writer(uint64_t alignment = 32);

    // Replaces an existing key in place, appends otherwise. Values are checked now (item
    // types match the array's, integers fit their type, nesting <= kMaxArrayNesting);
    // setting general.alignment (a power of two) changes the writer's alignment.
    void set(std::string key, Value v);
    // Tensor with bytes given now (copied).
    void add_tensor(std::string name, uint32_t type, std::vector<uint64_t> ne, std::vector<uint8_t> bytes);
    // Tensor whose bytes are produced at write time into `dst` (nbytes long).
    using Fill = std::function<void(uint8_t* dst, size_t nbytes)>;
    void add_tensor(std::string name, uint32_t type, std::vector<uint64_t> ne, Fill fill);

    // Writes the file (atomically: to path + ".tmp", then rename). Throws Error on I/O failure.
    void write(const std::string& path) const;
    // Serialises to memory (tests, fuzz corpus).
    std::vector<uint8_t> to_bytes() const;

private:
    struct Pending;
    using Sink = std::function<void(const uint8_t* data, size_t n)>;
    // Header, metadata and directory, padded to the data section when there are tensors.
    std::vector<uint8_t> encode_header(std::vector<uint64_t>* offsets) const;
    void emit(const Sink& sink) const;

    uint64_t alignment_;
    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<std::shared_ptr<Pending>> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace dsv4::gguf
