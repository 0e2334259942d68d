// Typed metadata getters: which stored types each accepts, and errors that name the key,
// its offset and the type found.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/gguf.h"
#include "gguf/gguf_test_util.h"

using namespace dsv4::gguf;
using namespace gguf_test;
using VT = ValueType;

namespace {

class GgufGetters : public testing::Test {
protected:
    void SetUp() override {
        Writer w;
        w.set("u8", scalar(VT::U8, 200));
        w.set("u16", scalar(VT::U16, 60000));
        w.set("u32", make_u32(4000000000u));
        w.set("i8", scalar(VT::I8, 0, 100));
        w.set("i16", scalar(VT::I16, 0, 30000));
        w.set("i32", make_i32(123456));
        w.set("i32_neg", make_i32(-1));
        w.set("i64_neg", scalar(VT::I64, 0, -5));
        w.set("u64_small", make_u64(17));
        w.set("u64_big", make_u64(1ull << 40));
        w.set("u64_inexact", make_u64((1ull << 53) + 1));
        w.set("f32", make_f32(0.5f));
        w.set("f64", scalar(VT::F64, 0, 0, -2.25));
        w.set("flag", make_bool(true));
        w.set("name", make_string("deepseek4"));
        w.set("words", make_string_array({"a", "b"}));
        w.set("ints", make_i32_array({-1, 2}));
        w.set("u8s", make_array(VT::U8, {scalar(VT::U8, 1), scalar(VT::U8, 255)}));
        w.set("i64s", make_array(VT::I64, {scalar(VT::I64, 0, -7)}));
        w.set("f32s", make_f32_array({0.25f, -1.f}));
        w.set("f64s", make_array(VT::F64, {scalar(VT::F64, 0, 0, 1e100)}));
        w.set("bools", make_array(VT::BOOL, {make_bool(true)}));
        w.set("nested", make_array(VT::ARRAY, {make_i32_array({1})}));
        image_ = w.to_bytes();
        f_ = File::parse(image_.data(), image_.size(), "g.gguf");
    }

    // The getter's error message; "" when it did not throw.
    template <typename Fn>
    std::string error_of(Fn fn) {
        try {
            fn();
        } catch (const dsv4::Error& e) {
            return e.what();
        }
        return "";
    }

    std::vector<uint8_t> image_;
    std::unique_ptr<File> f_;
};

#define EXPECT_MSG(call, ...)                                                                \
    do {                                                                                     \
        std::string m_ = error_of([&] { (void)(call); });                                    \
        ASSERT_FALSE(m_.empty()) << #call " did not throw";                                  \
        for (const char* frag_ : {__VA_ARGS__})                                              \
            EXPECT_NE(m_.find(frag_), std::string::npos) << "missing '" << frag_ << "' in: " << m_; \
    } while (0)

}  // namespace

TEST_F(GgufGetters, U32) {
    EXPECT_EQ(f_->get_u32("u8"), 200u);
    EXPECT_EQ(f_->get_u32("u16"), 60000u);
    EXPECT_EQ(f_->get_u32("u32"), 4000000000u);
    EXPECT_EQ(f_->get_u32("i8"), 100u);
    EXPECT_EQ(f_->get_u32("i16"), 30000u);
    EXPECT_EQ(f_->get_u32("i32"), 123456u);
    EXPECT_EQ(f_->get_u32("u64_small"), 17u);
    EXPECT_MSG(f_->get_u32("i32_neg"), "g.gguf: key 'i32_neg' at offset ", "found i32 -1");
    EXPECT_MSG(f_->get_u32("u64_big"), "key 'u64_big'", "fits u32", "found u64 1099511627776");
    EXPECT_MSG(f_->get_u32("name"), "key 'name'", "found string");
    EXPECT_MSG(f_->get_u32("f32"), "key 'f32'", "found f32 0.5");
    EXPECT_MSG(f_->get_u32("flag"), "key 'flag'", "found bool true");
}

TEST_F(GgufGetters, U64) {
    EXPECT_EQ(f_->get_u64("u64_big"), 1ull << 40);
    EXPECT_EQ(f_->get_u64("u8"), 200u);
    EXPECT_EQ(f_->get_u64("i32"), 123456u);
    EXPECT_MSG(f_->get_u64("i64_neg"), "key 'i64_neg'", "non-negative integer", "found i64 -5");
    EXPECT_MSG(f_->get_u64("ints"), "key 'ints'", "found array of 2 i32");
}

TEST_F(GgufGetters, F64) {
    EXPECT_EQ(f_->get_f64("f32"), 0.5);
    EXPECT_EQ(f_->get_f64("f64"), -2.25);
    EXPECT_EQ(f_->get_f64("i32_neg"), -1.0);
    EXPECT_EQ(f_->get_f64("u64_big"), double(1ull << 40));
    EXPECT_MSG(f_->get_f64("u64_inexact"), "key 'u64_inexact'", "found u64 9007199254740993");
    EXPECT_MSG(f_->get_f64("name"), "key 'name'", "found string");
}

TEST_F(GgufGetters, BoolAndString) {
    EXPECT_TRUE(f_->get_bool("flag"));
    EXPECT_MSG(f_->get_bool("u8"), "key 'u8'", "expected bool", "found u8 200");
    EXPECT_EQ(f_->get_string("name"), "deepseek4");
    EXPECT_MSG(f_->get_string("u32"), "key 'u32'", "expected string", "found u32 4000000000");
}

TEST_F(GgufGetters, StringArray) {
    EXPECT_EQ(f_->get_string_array("words"), (std::vector<std::string>{"a", "b"}));
    EXPECT_MSG(f_->get_string_array("ints"), "key 'ints'", "expected array of string", "found array of 2 i32");
    EXPECT_MSG(f_->get_string_array("name"), "key 'name'", "found string");
}

TEST_F(GgufGetters, NumberArray) {
    EXPECT_EQ(f_->get_number_array("ints"), (std::vector<double>{-1, 2}));
    EXPECT_EQ(f_->get_number_array("u8s"), (std::vector<double>{1, 255}));
    EXPECT_EQ(f_->get_number_array("i64s"), (std::vector<double>{-7}));
    EXPECT_EQ(f_->get_number_array("f32s"), (std::vector<double>{0.25, -1}));
    EXPECT_EQ(f_->get_number_array("f64s"), (std::vector<double>{1e100}));
    EXPECT_MSG(f_->get_number_array("words"), "key 'words'", "array of numbers", "found array of 2 string");
    EXPECT_MSG(f_->get_number_array("bools"), "key 'bools'", "found array of 1 bool");
    EXPECT_MSG(f_->get_number_array("nested"), "key 'nested'", "found array of 1 array");
    EXPECT_MSG(f_->get_number_array("f32"), "key 'f32'", "found f32");
}

TEST_F(GgufGetters, MissingKey) {
    EXPECT_FALSE(f_->has("nope"));
    EXPECT_EQ(f_->find("nope"), nullptr);
    EXPECT_TRUE(f_->has("name"));
    EXPECT_MSG(f_->get_u32("deepseek4.block_count"), "g.gguf: key 'deepseek4.block_count' not found");
    EXPECT_MSG(f_->get_string_array("tokenizer.ggml.tokens"), "key 'tokenizer.ggml.tokens' not found");
}
