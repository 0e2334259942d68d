// One test per class of corruption the reader must reject with a precise one-line error
// (and never by crashing or reading out of bounds: run these under ASan too).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/gguf.h"
#include "gguf/gguf_test_util.h"

using namespace dsv4::gguf;
using namespace gguf_test;

namespace {

// A small valid file with metadata of several kinds and three tensors.
std::vector<uint8_t> small_valid_file(uint64_t alignment) {
    Writer w(alignment);
    w.set("general.architecture", make_string("deepseek4"));
    w.set("d.count", make_u32(7));
    w.set("d.flag", make_bool(true));
    w.set("d.scale", make_f32(0.25f));
    w.set("d.list", make_i32_array({1, -2, 3}));
    w.set("d.words", make_string_array({"a", "", "bc"}));
    w.set("d.nested", make_array(ValueType::ARRAY, {make_u32_array({1, 2}), make_u32_array({})}));
    w.add_tensor("a.weight", kF32, {3}, pattern(12, 1));
    w.add_tensor("b.weight", kQ8_0, {32, 2}, pattern(68, 2));
    w.add_tensor("c.weight", kF16, {5}, pattern(10, 3));
    return w.to_bytes();
}

}  // namespace

TEST(GgufCorrupt, ValidFileParses) {
    EXPECT_EQ(parse_error(small_valid_file(32)), "");
    EXPECT_EQ(parse_error(small_valid_file(64)), "");
}

TEST(GgufCorrupt, EmptyInput) {
    std::string msg;
    try {
        File::parse(nullptr, 0, "t.gguf");
    } catch (const dsv4::Error& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("t.gguf: header"), std::string::npos) << msg;
    EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
}

TEST(GgufCorrupt, BadMagic) {
    Raw r;
    r.bytes("GGML").u32(3).u64(0).u64(0);
    EXPECT_REJECTED(r.b, "bad magic", "offset 0", "expected \"GGUF\"", "found \"GGML\"", "47 47 4d 4c");
    Raw bin;
    bin.u32(0x00ff0a01).u32(3).u64(0).u64(0);
    EXPECT_REJECTED(bin.b, "bad magic", "\\x01\\x0a\\xff\\x00", "01 0a ff 00");
}

TEST(GgufCorrupt, Version2) {
    Raw r;
    r.header(0, 0, 2);
    EXPECT_REJECTED(r.b, "unsupported GGUF version 2", "expected 3");
}

TEST(GgufCorrupt, Version4) {
    Raw r;
    r.header(0, 0, 4);
    EXPECT_REJECTED(r.b, "unsupported GGUF version 4", "expected 3");
}

TEST(GgufCorrupt, BigEndianVersionIsExplained) {
    Raw r;
    r.header(0, 0, 0x03000000);
    EXPECT_REJECTED(r.b, "version 50331648", "big-endian");
}

// Every proper prefix of a valid file must be rejected with an Error: no crash, no
// out-of-bounds read (each prefix is parsed from an exactly-sized heap copy).
TEST(GgufCorrupt, TruncatedAtEveryByte) {
    for (uint64_t alignment : {32, 64}) {
        std::vector<uint8_t> image = small_valid_file(alignment);
        ASSERT_EQ(parse_error(image), "");
        for (size_t len = 0; len < image.size(); ++len) {
            std::string msg = parse_error(image, len);
            ASSERT_FALSE(msg.empty()) << "prefix of " << len << " of " << image.size() << " bytes accepted";
            ASSERT_EQ(msg.rfind("t.gguf: ", 0), 0u) << msg;
        }
    }
}

TEST(GgufCorrupt, TruncatedMetadataOnlyFile) {
    Writer w;
    w.set("k", make_string_array({"x", "yz"}));
    std::vector<uint8_t> image = w.to_bytes();
    ASSERT_EQ(parse_error(image), "");
    for (size_t len = 0; len < image.size(); ++len) ASSERT_NE(parse_error(image, len), "") << len;
}

TEST(GgufCorrupt, HugeTensorCount) {
    Raw r;
    r.header(1ull << 62, 0).zeros(64);
    EXPECT_REJECTED(r.b, "header", "n_tensors = 4611686018427387904", "64 bytes");
    Raw r2;
    r2.header(UINT64_MAX, 1).kv_u32("k", 1);
    EXPECT_REJECTED(r2.b, "n_tensors = 18446744073709551615");
}

TEST(GgufCorrupt, HugeKvCount) {
    Raw r;
    r.header(0, UINT64_MAX).kv_u32("k", 1);
    EXPECT_REJECTED(r.b, "header", "n_kv = 18446744073709551615");
    Raw r2;
    // Claims 2 entries and holds 1 of 41 bytes: passes the bound on n_kv, then truncates.
    r2.header(0, 2).kv_string("k", "twenty characters...");
    EXPECT_REJECTED(r2.b, "metadata entry #1", "key");
}

TEST(GgufCorrupt, KeyLengthPastEof) {
    Raw r;
    r.header(0, 1).u64(1000).bytes("abcdefghijklmnop");
    EXPECT_REJECTED(r.b, "metadata entry #0 at offset 24", "key", "length 1000", "16 bytes remain");
    Raw r2;
    r2.header(0, 1).u64(UINT64_MAX).bytes("abcdefghijklmnop");
    EXPECT_REJECTED(r2.b, "length 18446744073709551615");
}

TEST(GgufCorrupt, StringValuePastEof) {
    Raw r;
    r.header(0, 1).str("general.name").u32(tSTRING).u64(1000).bytes("xy");
    EXPECT_REJECTED(r.b, "key 'general.name' at offset 24", "string value", "length 1000", "2 bytes remain");
}

TEST(GgufCorrupt, StringInArrayPastEof) {
    Raw r;
    r.header(0, 1).str("tok.tokens").u32(tARRAY).u32(tSTRING).u64(2).str("ab").u64(UINT64_MAX - 3);
    EXPECT_REJECTED(r.b, "key 'tok.tokens'", "string value", "length 18446744073709551612");
}

TEST(GgufCorrupt, ArrayCountOverflow) {
    // 2^61 u64 items: count * 8 wraps to 0 in u64 arithmetic.
    Raw r;
    r.header(0, 1).str("a.big").u32(tARRAY).u32(tU64).u64(1ull << 61).u64(5);
    EXPECT_REJECTED(r.b, "key 'a.big'", "array count 2305843009213693952", "u64 items");
    // 2^62 strings (at least 8 bytes each): 2^65 wraps likewise.
    Raw r2;
    r2.header(0, 1).str("a.strs").u32(tARRAY).u32(tSTRING).u64(1ull << 62).str("x");
    EXPECT_REJECTED(r2.b, "key 'a.strs'", "array count 4611686018427387904", "string items");
    // A plausible count that still exceeds the file.
    Raw r3;
    r3.header(0, 1).str("a.f32").u32(tARRAY).u32(tF32).u64(5).put(1.0f).put(2.0f);
    EXPECT_REJECTED(r3.b, "key 'a.f32'", "array count 5", "8 bytes left");
}

TEST(GgufCorrupt, NestedArrayCountOverflow) {
    Raw r;
    r.header(0, 1).str("a.nest").u32(tARRAY).u32(tARRAY).u64(1).u32(tU8).u64(UINT64_MAX).u8(1);
    EXPECT_REJECTED(r.b, "key 'a.nest'", "array count 18446744073709551615");
}

TEST(GgufCorrupt, UnknownValueType) {
    Raw r;
    r.header(0, 1).str("x.weird").u32(13).u32(0);
    EXPECT_REJECTED(r.b, "key 'x.weird' at offset 24", "unknown value type 13", "expected 0..12");
}

TEST(GgufCorrupt, UnknownArrayItemType) {
    Raw r;
    r.header(0, 1).str("x.arr").u32(tARRAY).u32(99).u64(0);
    EXPECT_REJECTED(r.b, "key 'x.arr'", "unknown array item type 99");
}

TEST(GgufCorrupt, BoolOutOfRange) {
    Raw r;
    r.header(0, 1).str("x.flag").u32(tBOOL).u8(2);
    EXPECT_REJECTED(r.b, "key 'x.flag'", "expected 0 or 1, found 2");
}

TEST(GgufCorrupt, NestingDeeperThan8) {
    // 9 nested arrays, innermost an empty array of u8.
    auto nested = [](int levels) {
        Raw r;
        r.header(0, 1).str("x.deep").u32(tARRAY);
        for (int k = 1; k < levels; ++k) r.u32(tARRAY).u64(1);
        r.u32(tU8).u64(0);
        return r;
    };
    EXPECT_EQ(parse_error(nested(8).b), "");
    EXPECT_REJECTED(nested(9).b, "key 'x.deep'", "nested deeper than 8 levels");
    EXPECT_REJECTED(nested(1000).b, "key 'x.deep'", "nested deeper than 8 levels");
}

TEST(GgufCorrupt, DuplicateKey) {
    Raw r;
    r.header(0, 3).kv_u32("a", 1).kv_u32("dup.key", 2).kv_u32("dup.key", 3);
    EXPECT_REJECTED(r.b, "key 'dup.key' at offset 64", "duplicate key", "first defined at offset 41");
}

TEST(GgufCorrupt, AlignmentNotPowerOfTwo) {
    Raw r;
    r.header(0, 1).kv_u32("general.alignment", 48);
    EXPECT_REJECTED(r.b, "key 'general.alignment' at offset 24", "power of two", "found u32 48");
    Raw zero;
    zero.header(0, 1).kv_u32("general.alignment", 0);
    EXPECT_REJECTED(zero.b, "general.alignment", "found u32 0");
    Raw text;
    text.header(0, 1).kv_string("general.alignment", "32");
    EXPECT_REJECTED(text.b, "general.alignment", "found string");
}

TEST(GgufCorrupt, UnknownTensorType) {
    Raw r;
    r.header(1, 0).tensor("blk.0.attn_q_a.weight", {32}, 7, 0).pad_to(32).zeros(128);
    EXPECT_REJECTED(r.b, "tensor 'blk.0.attn_q_a.weight' at directory offset 24", "unknown tensor type id 7");
}

TEST(GgufCorrupt, ActivationOnlyTypeIsNotStored) {
    Raw r;
    r.header(1, 0).tensor("act.weight", {256}, kQ8_K, 0).pad_to(32).zeros(292);
    EXPECT_REJECTED(r.b, "tensor 'act.weight'", "Q8_K", "activation-only");
}

TEST(GgufCorrupt, NDims0) {
    Raw r;
    r.header(1, 0).str("t.zero_dims").u32(0).u32(kF32).u64(0).pad_to(32).zeros(4);
    EXPECT_REJECTED(r.b, "tensor 't.zero_dims'", "n_dims is 0, expected 1..8");
}

TEST(GgufCorrupt, NDims9) {
    Raw r;
    r.header(1, 0).tensor("t.nine", {1, 1, 1, 1, 1, 1, 1, 1, 1}, kF32, 0).pad_to(32).zeros(4);
    EXPECT_REJECTED(r.b, "tensor 't.nine'", "n_dims is 9, expected 1..8");
    Raw huge;
    huge.header(1, 0).str("t.huge").u32(UINT32_MAX).zeros(32);
    EXPECT_REJECTED(huge.b, "tensor 't.huge'", "n_dims is 4294967295");
}

TEST(GgufCorrupt, ZeroDim) {
    Raw r;
    r.header(1, 0).tensor("t.empty", {4, 0, 2}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_REJECTED(r.b, "tensor 't.empty'", "dimension 1 of [4, 0, 2] is 0");
}

TEST(GgufCorrupt, DimsProductOverflows) {
    Raw r;
    r.header(1, 0).tensor("t.vast", {1ull << 32, 1ull << 32, 2}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_REJECTED(r.b, "tensor 't.vast'", "more than 2^63-1 elements");
    // Elements fit but bytes do not: 2^62 f32 values are 2^64 bytes.
    Raw bytes;
    bytes.header(1, 0).tensor("t.bytes", {1ull << 62}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_REJECTED(bytes.b, "tensor 't.bytes'", "byte size of F32", "exceeds 2^63-1");
}

TEST(GgufCorrupt, RowNotMultipleOfBlock) {
    Raw r;
    r.header(1, 0).tensor("t.q8", {33, 2}, kQ8_0, 0).pad_to(32).zeros(256);
    EXPECT_REJECTED(r.b, "tensor 't.q8'", "ne[0] = 33 is not a multiple of the Q8_0 block size 32");
}

TEST(GgufCorrupt, MisalignedOffset) {
    Raw r;
    r.header(2, 0).tensor("t.a", {4}, kF32, 0).tensor("t.b", {4}, kF32, 16).pad_to(32).zeros(64);
    EXPECT_REJECTED(r.b, "tensor 't.b'", "data offset 16", "not a multiple of the alignment 32");
    // With general.alignment = 64 an offset of 32 is misaligned too.
    Raw r64;
    r64.header(1, 1).kv_u32("general.alignment", 64).tensor("t.c", {4}, kF32, 32).pad_to(64).zeros(128);
    EXPECT_REJECTED(r64.b, "tensor 't.c'", "not a multiple of the alignment 64");
}

TEST(GgufCorrupt, DataPastEof) {
    Raw r;
    r.header(1, 0).tensor("blk.0.attn_q_a.weight", {16}, kF32, 0).pad_to(32).zeros(60);
    // Directory ends at 77, data starts at 96, the tensor needs [96, 160) but the file is 156.
    EXPECT_REJECTED(r.b, "tensor 'blk.0.attn_q_a.weight' at directory offset 24",
                    "data [96, 160) extends past end of file (size 156)");
}

TEST(GgufCorrupt, DataOffsetOverflows) {
    Raw r;
    r.header(1, 0).tensor("t.far", {16}, kF32, UINT64_MAX - 31).pad_to(32).zeros(64);
    EXPECT_REJECTED(r.b, "tensor 't.far'", "overflows");
    Raw past;
    past.header(1, 0).tensor("t.past", {16}, kF32, 1ull << 40).pad_to(32).zeros(64);
    EXPECT_REJECTED(past.b, "tensor 't.past'", "extends past end of file");
}

TEST(GgufCorrupt, OverlappingTensors) {
    Raw r;
    r.header(3, 0)
        .tensor("t.first", {16}, kF32, 0)
        .tensor("t.third", {8}, kF32, 128)
        .tensor("t.second", {16}, kF32, 32)
        .pad_to(32)
        .zeros(160);
    EXPECT_REJECTED(r.b, "tensor 't.second'", "overlaps tensor 't.first'");
}

TEST(GgufCorrupt, DuplicateTensorName) {
    Raw r;
    r.header(2, 0).tensor("t.same", {4}, kF32, 0).tensor("t.same", {4}, kF32, 32).pad_to(32).zeros(64);
    EXPECT_REJECTED(r.b, "tensor 't.same' at directory offset 62", "duplicate tensor name",
                    "first defined at directory offset 24");
}

TEST(GgufCorrupt, TensorDirectoryTruncated) {
    Raw r;
    r.header(1, 0).str("t.cut.long.enough").u32(2).u64(4);  // >= 32 bytes: passes the count bound
    EXPECT_REJECTED(r.b, "tensor 't.cut.long.enough'", "a dimension", "before end of file");
}

TEST(GgufCorrupt, BinaryNamesStayOnOneLine) {
    Raw r;
    r.header(0, 1).str(std::string("bad\nkey\0\xff", 9)).u32(99);
    EXPECT_REJECTED(r.b, "key 'bad\\x0akey\\x00\\xff'", "unknown value type 99");
}
