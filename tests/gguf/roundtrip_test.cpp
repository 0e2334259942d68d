// Writer -> reader round trips: every value type, nested and string arrays, tensor views,
// alignments, files on disk, streaming fills; and the writer's own checks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "dsv4/gguf.h"
#include "dsv4/quant.h"
#include "gguf/gguf_test_util.h"

using namespace dsv4::gguf;
using namespace gguf_test;

namespace {

void expect_same(const Value& a, const Value& b, const std::string& where) {
    ASSERT_EQ(a.type, b.type) << where;
    switch (a.type) {
        case ValueType::U8:
        case ValueType::U16:
        case ValueType::U32:
        case ValueType::U64:
        case ValueType::BOOL: EXPECT_EQ(a.u, b.u) << where; break;
        case ValueType::I8:
        case ValueType::I16:
        case ValueType::I32:
        case ValueType::I64: EXPECT_EQ(a.i, b.i) << where; break;
        case ValueType::F32:
        case ValueType::F64: EXPECT_EQ(a.f, b.f) << where; break;
        case ValueType::STRING: EXPECT_EQ(a.str, b.str) << where; break;
        case ValueType::ARRAY:
            ASSERT_EQ(a.elem_type, b.elem_type) << where;
            ASSERT_EQ(a.items.size(), b.items.size()) << where;
            for (size_t k = 0; k < a.items.size(); ++k)
                expect_same(a.items[k], b.items[k], where + "[" + std::to_string(k) + "]");
            break;
    }
}

// Writes the pairs, reads them back and compares every value; returns the image.
std::vector<uint8_t> round_trip(const std::vector<std::pair<std::string, Value>>& kv) {
    Writer w;
    for (const auto& [k, v] : kv) w.set(k, v);
    std::vector<uint8_t> image = w.to_bytes();
    auto f = File::parse(image.data(), image.size(), "rt.gguf");
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->metadata().size(), kv.size());
    for (size_t k = 0; k < kv.size() && k < f->metadata().size(); ++k) {
        EXPECT_EQ(f->metadata()[k].first, kv[k].first);
        expect_same(f->metadata()[k].second, kv[k].second, kv[k].first);
        const Value* found = f->find(kv[k].first);
        EXPECT_EQ(found, &f->metadata()[k].second);
    }
    return image;
}

Value deep_array(int levels) {
    Value v = make_u32_array({1, 2, 3});
    for (int k = 1; k < levels; ++k) v = make_array(ValueType::ARRAY, {v, v});
    return v;
}

std::string temp_path(const std::string& name) {
    return testing::TempDir() + "dsv4_gguf_" + std::to_string(::getpid()) + "_" + name;
}

}  // namespace

TEST(GgufRoundTrip, ScalarsOfEveryType) {
    using VT = ValueType;
    round_trip({
        {"t.u8", scalar(VT::U8, 255)},
        {"t.i8", scalar(VT::I8, 0, -128)},
        {"t.u16", scalar(VT::U16, 65535)},
        {"t.i16", scalar(VT::I16, 0, -32768)},
        {"t.u32", make_u32(std::numeric_limits<uint32_t>::max())},
        {"t.i32", make_i32(std::numeric_limits<int32_t>::min())},
        {"t.f32", make_f32(-1.5e-7f)},
        {"t.f32_inf", make_f32(std::numeric_limits<float>::infinity())},
        {"t.bool_true", make_bool(true)},
        {"t.bool_false", make_bool(false)},
        {"t.string", make_string("h\xc3\xa9llo")},
        {"t.string_nul", make_string(std::string("a\0b", 3))},
        {"t.string_empty", make_string("")},
        {"t.u64", make_u64(std::numeric_limits<uint64_t>::max())},
        {"t.i64", scalar(VT::I64, 0, std::numeric_limits<int64_t>::min())},
        {"t.f64", scalar(VT::F64, 0, 0, 3.141592653589793)},
        {"", make_u32(1)},  // an empty key is legal
    });
}

TEST(GgufRoundTrip, ArraysOfEveryType) {
    using VT = ValueType;
    std::vector<std::pair<std::string, Value>> kv;
    for (VT t : {VT::U8, VT::I8, VT::U16, VT::I16, VT::U32, VT::I32, VT::U64, VT::I64, VT::BOOL}) {
        std::vector<Value> items;
        for (int k = 0; k < 5; ++k) items.push_back(scalar(t, uint64_t(k % 2), -k));
        kv.emplace_back(std::string("arr.") + value_type_name(t), make_array(t, items));
    }
    kv.emplace_back("arr.f32", make_f32_array({0.f, -2.5f, 1e30f}));
    kv.emplace_back("arr.f64", make_array(VT::F64, {scalar(VT::F64, 0, 0, 1e300), scalar(VT::F64, 0, 0, -0.125)}));
    kv.emplace_back("arr.empty", make_array(VT::U32, {}));
    kv.emplace_back("arr.empty_strings", make_string_array({}));
    round_trip(kv);
}

TEST(GgufRoundTrip, StringArrays) {
    std::vector<std::string> tokens;
    for (int k = 0; k < 2000; ++k) tokens.push_back(k % 7 == 0 ? "" : "tok" + std::to_string(k));
    tokens.push_back("<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    auto image = round_trip({{"tokenizer.ggml.tokens", make_string_array(tokens)},
                             {"tokenizer.ggml.merges", make_string_array({"a b", "\xc4\xa0 t"})}});
    auto f = File::parse(image.data(), image.size());
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"), tokens);
}

TEST(GgufRoundTrip, NestedArrays) {
    using VT = ValueType;
    round_trip({
        {"n.ints", make_array(VT::ARRAY, {make_i32_array({1, 2}), make_i32_array({}), make_i32_array({-3})})},
        {"n.strings", make_array(VT::ARRAY, {make_string_array({"x", "y"}), make_string_array({""})})},
        {"n.mixed", make_array(VT::ARRAY, {make_f32_array({1.f}), make_string_array({"z"})})},
        {"n.empty_outer", make_array(VT::ARRAY, {})},
        {"n.depth8", deep_array(8)},
    });
}

TEST(GgufRoundTrip, TensorViewsAreZeroCopy) {
    struct Spec {
        const char* name;
        uint32_t type;
        std::vector<uint64_t> ne;
    };
    const std::vector<Spec> specs = {
        {"f32.weight", kF32, {4, 3}},       {"f16.weight", kF16, {8}},
        {"bf16.weight", kBF16, {2, 1, 3}},  {"i32.table", kI32, {5, 2}},
        {"q8_0.weight", kQ8_0, {64, 2}},    {"q4_k.weight", kQ4_K, {256, 2}},
        {"q2_k.weight", kQ2_K, {512}},      {"iq2_xxs.weight", kIQ2_XXS, {256, 1, 1, 2}},
        {"mxfp4.weight", kMXFP4, {32, 3}},  {"eight.dims", kF32, {1, 2, 1, 2, 1, 2, 1, 2}},
    };
    for (uint64_t alignment : {32, 64}) {
        Writer w(alignment);
        w.set("general.architecture", make_string("test"));
        std::vector<std::vector<uint8_t>> payloads;
        for (size_t k = 0; k < specs.size(); ++k) {
            payloads.push_back(pattern(tensor_nbytes(specs[k].type, specs[k].ne), uint32_t(k)));
            w.add_tensor(specs[k].name, specs[k].type, specs[k].ne, payloads.back());
        }
        std::vector<uint8_t> image = w.to_bytes();
        auto f = File::parse(image.data(), image.size(), "views.gguf");
        EXPECT_EQ(f->alignment(), alignment);
        EXPECT_EQ(f->data_offset() % alignment, 0u);
        if (alignment == 32) {
            EXPECT_FALSE(f->has("general.alignment"));  // the default is not written
        } else {
            EXPECT_EQ(f->find("general.alignment")->type, ValueType::U32);
            EXPECT_EQ(f->get_u32("general.alignment"), alignment);
        }
        ASSERT_EQ(f->tensors().size(), specs.size());
        for (size_t k = 0; k < specs.size(); ++k) {
            const TensorInfo& t = f->tensors()[k];
            SCOPED_TRACE(t.name);
            EXPECT_EQ(t.name, specs[k].name);
            EXPECT_EQ(t.type, specs[k].type);
            EXPECT_EQ(t.ne, specs[k].ne);
            EXPECT_EQ(t.nbytes, payloads[k].size());
            EXPECT_EQ(t.offset % alignment, 0u);
            EXPECT_EQ(t.data, image.data() + f->data_offset() + t.offset);  // a view, not a copy
            EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), payloads[k]);
            EXPECT_EQ(f->find_tensor(specs[k].name), &t);
        }
        EXPECT_EQ(f->find_tensor("missing"), nullptr);
        const TensorInfo& last = f->tensors().back();
        EXPECT_EQ(f->file_size(), f->data_offset() + last.offset + last.nbytes);  // no trailing padding
    }
}

TEST(GgufRoundTrip, TensorNbytesFollowsTheBlockSize) {
    EXPECT_EQ(tensor_nbytes(kF32, {4, 3}), 48u);
    EXPECT_EQ(tensor_nbytes(kQ8_0, {64, 2}), 2u * 2 * 34);
    EXPECT_EQ(tensor_nbytes(kQ4_K, {4096, 10}), 16u * 144 * 10);
    EXPECT_EQ(tensor_nbytes(kIQ2_XXS, {4096, 2048, 256}),
              uint64_t(dsv4::quant::row_bytes(dsv4::quant::Type::IQ2_XXS, 4096)) * 2048 * 256);
    EXPECT_THROW(tensor_nbytes(kQ8_K, {256}), dsv4::Error);
    EXPECT_THROW(tensor_nbytes(kQ8_0, {16}), dsv4::Error);
    EXPECT_THROW(tensor_nbytes(7, {16}), dsv4::Error);
    EXPECT_THROW(tensor_nbytes(kF32, {}), dsv4::Error);
}

TEST(GgufRoundTrip, AlignmentSetThroughMetadata) {
    Writer w;
    w.set("general.alignment", make_u32(128));
    w.add_tensor("a", kF32, {3}, pattern(12, 1));
    w.add_tensor("b", kF32, {3}, pattern(12, 2));
    auto image = w.to_bytes();
    auto f = File::parse(image.data(), image.size());
    EXPECT_EQ(f->alignment(), 128u);
    EXPECT_EQ(f->data_offset() % 128, 0u);
    EXPECT_EQ(f->tensors()[1].offset, 128u);
}

TEST(GgufRoundTrip, SetReplacesInPlace) {
    Writer w;
    w.set("a", make_u32(1));
    w.set("b", make_u32(2));
    w.set("a", make_string("again"));
    auto image = w.to_bytes();
    auto f = File::parse(image.data(), image.size());
    ASSERT_EQ(f->metadata().size(), 2u);
    EXPECT_EQ(f->metadata()[0].first, "a");
    EXPECT_EQ(f->get_string("a"), "again");
    EXPECT_EQ(f->metadata()[1].first, "b");
}

TEST(GgufRoundTrip, FillRunsAtWriteTime) {
    Writer w;
    int calls = 0;
    w.add_tensor("filled", kQ8_0, {32, 4}, [&](uint8_t* dst, size_t n) {
        ++calls;
        ASSERT_EQ(n, 4u * 34);
        for (size_t k = 0; k < n; ++k) dst[k] = uint8_t(k * 7);
    });
    w.add_tensor("given", kF32, {2}, pattern(8, 9));
    EXPECT_EQ(calls, 0);
    auto image = w.to_bytes();
    EXPECT_EQ(calls, 1);
    auto f = File::parse(image.data(), image.size());
    const TensorInfo* t = f->find_tensor("filled");
    ASSERT_NE(t, nullptr);
    for (size_t k = 0; k < t->nbytes; ++k) ASSERT_EQ(t->data[k], uint8_t(k * 7));
    EXPECT_EQ(std::vector<uint8_t>(f->find_tensor("given")->data, f->find_tensor("given")->data + 8), pattern(8, 9));
}

TEST(GgufRoundTrip, WriteAndOpenFromDisk) {
    const std::string path = temp_path("disk.gguf");
    Writer w(64);
    w.set("general.name", make_string("disk"));
    w.add_tensor("x", kF16, {100}, pattern(200, 4));
    w.add_tensor("y", kQ4_K, {256}, [](uint8_t* dst, size_t n) { std::fill(dst, dst + n, uint8_t(0xab)); });
    w.write(path);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    std::vector<uint8_t> in_memory = w.to_bytes();
    EXPECT_EQ(std::filesystem::file_size(path), in_memory.size());
    {
        auto f = File::open(path);
        EXPECT_EQ(f->path(), path);
        EXPECT_EQ(f->file_size(), in_memory.size());
        EXPECT_EQ(f->get_string("general.name"), "disk");
        const TensorInfo* x = f->find_tensor("x");
        ASSERT_NE(x, nullptr);
        EXPECT_EQ(std::vector<uint8_t>(x->data, x->data + x->nbytes), pattern(200, 4));
        const TensorInfo* y = f->find_tensor("y");
        ASSERT_NE(y, nullptr);
        EXPECT_EQ(y->data[0], 0xab);
        EXPECT_EQ(y->data[y->nbytes - 1], 0xab);
    }
    // Overwriting an existing file goes through the same rename.
    Writer w2;
    w2.set("general.name", make_string("second"));
    w2.write(path);
    EXPECT_EQ(File::open(path)->get_string("general.name"), "second");
    std::filesystem::remove(path);
}

TEST(GgufRoundTrip, FailedWriteLeavesTargetAlone) {
    const std::string path = temp_path("keep.gguf");
    Writer ok;
    ok.set("v", make_u32(1));
    ok.write(path);
    Writer bad;
    bad.add_tensor("boom", kF32, {4}, [](uint8_t*, size_t) { throw dsv4::Error("fill failed"); });
    EXPECT_THROW(bad.write(path), dsv4::Error);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    EXPECT_EQ(File::open(path)->get_u32("v"), 1u);
    std::filesystem::remove(path);
    EXPECT_THROW(ok.write("/nonexistent-dir/x.gguf"), dsv4::Error);
}

TEST(GgufRoundTrip, OpenErrorsNameThePath) {
    const std::string missing = temp_path("missing.gguf");
    try {
        File::open(missing);
        FAIL();
    } catch (const dsv4::Error& e) {
        EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    }
    const std::string empty = temp_path("empty.gguf");
    std::ofstream(empty).close();
    try {
        File::open(empty);
        FAIL();
    } catch (const dsv4::Error& e) {
        EXPECT_NE(std::string(e.what()).find(empty + ": file is empty"), std::string::npos) << e.what();
    }
    std::filesystem::remove(empty);
    const std::string junk = temp_path("junk.gguf");
    std::ofstream(junk) << "GGUF\x02";
    try {
        File::open(junk);
        FAIL();
    } catch (const dsv4::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind(junk + ": header", 0), 0u) << e.what();
    }
    std::filesystem::remove(junk);
}

// ---- writer-side validation ------------------------------------------------------------

namespace {
std::string writer_error(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const dsv4::Error& e) {
        return e.what();
    }
    return "";
}
}  // namespace

TEST(GgufWriter, RejectsBadAlignment) {
    EXPECT_NE(writer_error([] { Writer w(48); }).find("alignment 48"), std::string::npos);
    EXPECT_NE(writer_error([] { Writer w(0); }).find("alignment 0"), std::string::npos);
    Writer w;
    EXPECT_NE(writer_error([&] { w.set("general.alignment", make_u32(24)); }).find("found u32 24"), std::string::npos);
    EXPECT_NE(writer_error([&] { w.set("general.alignment", make_string("32")); }).find("general.alignment"),
              std::string::npos);
}

TEST(GgufWriter, RejectsBadTensors) {
    Writer w;
    w.add_tensor("ok", kF32, {4}, pattern(16, 1));
    EXPECT_NE(writer_error([&] { w.add_tensor("ok", kF32, {4}, pattern(16, 1)); }).find("duplicate tensor name 'ok'"),
              std::string::npos);
    std::string size = writer_error([&] { w.add_tensor("short", kQ8_0, {32, 2}, pattern(67, 1)); });
    EXPECT_NE(size.find("tensor 'short': expected 68 bytes for Q8_0 [32, 2], found 67"), std::string::npos) << size;
    EXPECT_NE(writer_error([&] { w.add_tensor("t7", 7, {4}, pattern(16, 1)); }).find("unknown tensor type id 7"),
              std::string::npos);
    EXPECT_NE(writer_error([&] { w.add_tensor("act", kQ8_K, {256}, pattern(292, 1)); }).find("activation-only"),
              std::string::npos);
    EXPECT_NE(writer_error([&] { w.add_tensor("zero", kF32, {4, 0}, std::vector<uint8_t>{}); }).find("dimension 1"),
              std::string::npos);
    EXPECT_NE(writer_error([&] { w.add_tensor("odd", kQ4_K, {100}, Writer::Fill{}); }).find("block size 256"),
              std::string::npos);
    // The rejected tensors left nothing behind.
    auto image = w.to_bytes();
    EXPECT_EQ(File::parse(image.data(), image.size())->tensors().size(), 1u);
}

TEST(GgufWriter, RejectsBadValues) {
    Writer w;
    std::string mixed = writer_error([&] { w.set("m", make_array(ValueType::U32, {make_u32(1), make_i32(2)})); });
    EXPECT_NE(mixed.find("key 'm': array item 1 has type i32, expected u32"), std::string::npos) << mixed;
    EXPECT_NE(writer_error([&] { w.set("u8", scalar(ValueType::U8, 256)); }).find("key 'u8': u8 value 256"),
              std::string::npos);
    EXPECT_NE(writer_error([&] { w.set("i16", scalar(ValueType::I16, 0, -40000)); }).find("out of range"),
              std::string::npos);
    EXPECT_NE(writer_error([&] { w.set("deep", deep_array(9)); }).find("nested deeper than 8"), std::string::npos);
    EXPECT_NE(writer_error([&] { w.set("t", scalar(ValueType(13), 0)); }).find("unknown value type 13"),
              std::string::npos);
    EXPECT_TRUE(w.to_bytes().size() == 24u);  // nothing was added
}
