// libFuzzer target for the GGUF reader. Any input must either parse or throw dsv4::Error;
// a crash, sanitizer report, or a parsed file that does not survive a write/read round trip
// is a bug. Parsed files have every value and every tensor byte touched, so that a view
// pointing outside the input shows up under ASan.
//
// Seed mode: DSV4_GGUF_WRITE_SEEDS=<dir> ./gguf_fuzz writes a few small valid files to <dir>
// and exits (scripts/fuzz.sh uses it to build the starting corpus).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/common.h"
#include "dsv4/gguf.h"

using namespace dsv4::gguf;

namespace {

uint64_t touch(const Value& v) {
    uint64_t h = uint64_t(v.type) * 31 + v.u + uint64_t(v.i);
    for (unsigned char c : v.str) h = h * 131 + c;
    for (const Value& item : v.items) h += touch(item);
    return h;
}

// Idempotence check: re-serialising a parsed file must give a file that parses and
// re-serialises to the same bytes.
std::vector<uint8_t> rewrite(const File& f) {
    Writer w(f.alignment());
    for (const auto& [key, v] : f.metadata()) w.set(key, v);
    for (const TensorInfo& t : f.tensors())
        w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    return w.to_bytes();
}

void write_seeds(const std::string& dir) {
    auto save = [&](const std::string& name, const Writer& w) {
        std::vector<uint8_t> b = w.to_bytes();
        std::string path = dir + "/" + name;
        FILE* fp = std::fopen(path.c_str(), "wb");
        if (!fp || std::fwrite(b.data(), 1, b.size(), fp) != b.size()) {
            std::perror(path.c_str());
            std::exit(1);
        }
        std::fclose(fp);
    };
    {
        Writer w;
        w.set("general.architecture", make_string("deepseek4"));
        w.set("deepseek4.block_count", make_u32(2));
        w.set("deepseek4.rope.freq_base", make_f32(10000.f));
        w.set("deepseek4.expert_used", make_i32(6));
        w.set("deepseek4.flag", make_bool(true));
        w.set("tokenizer.ggml.tokens", make_string_array({"<s>", "a", "b", "ab", ""}));
        w.set("tokenizer.ggml.scores", make_f32_array({0.f, -1.f, -2.f}));
        w.add_tensor("token_embd.weight", 1, {8, 5}, std::vector<uint8_t>(80, 0x3c));
        w.add_tensor("output_norm.weight", 0, {8}, std::vector<uint8_t>(32, 0));
        w.add_tensor("blk.0.attn_q_a.weight", 8, {32, 2}, std::vector<uint8_t>(68, 1));
        save("model.gguf", w);
    }
    {
        Writer w(64);
        Value u8s = make_array(ValueType::U8, {});
        Value v;
        v.type = ValueType::U8;
        v.u = 7;
        u8s.items.push_back(v);
        w.set("n.nested", make_array(ValueType::ARRAY, {make_i32_array({1, -2}), make_string_array({"x"})}));
        w.set("n.u8s", u8s);
        w.set("n.u64", make_u64(1ull << 40));
        v.type = ValueType::F64;
        v.f = 0.5;
        w.set("n.f64", v);
        v.type = ValueType::I64;
        v.i = -3;
        w.set("n.i64", v);
        w.add_tensor("q4k", 12, {256}, std::vector<uint8_t>(144, 2));
        w.add_tensor("iq2", 16, {256, 2}, std::vector<uint8_t>(132, 3));
        w.add_tensor("i32", 26, {3}, std::vector<uint8_t>(12, 4));
        save("aligned64.gguf", w);
    }
    {
        Writer w;
        w.set("only.key", make_string("metadata without tensors"));
        save("metadata_only.gguf", w);
    }
    {
        Writer w;
        w.add_tensor("mxfp4", 39, {32, 1, 2}, std::vector<uint8_t>(34, 5));
        w.add_tensor("q2k", 10, {256}, std::vector<uint8_t>(84, 6));
        w.add_tensor("bf16", 30, {2, 2, 2, 2}, std::vector<uint8_t>(32, 7));
        save("tensors_only.gguf", w);
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    if (const char* dir = std::getenv("DSV4_GGUF_WRITE_SEEDS")) {
        write_seeds(dir);
        std::exit(0);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<File> f;
    try {
        f = File::parse(data, size, "fuzz");
    } catch (const dsv4::Error&) {
        return 0;
    }
    volatile uint64_t sink = 0;
    for (const auto& [key, v] : f->metadata()) {
        sink = sink + touch(v) + key.size();
        // The getters must throw Error or succeed, whatever the stored type.
        try { sink = sink + f->get_u32(key); } catch (const dsv4::Error&) {}
        try { sink = sink + f->get_u64(key); } catch (const dsv4::Error&) {}
        try { sink = sink + uint64_t(f->get_f64(key) != 0); } catch (const dsv4::Error&) {}
        try { sink = sink + f->get_bool(key); } catch (const dsv4::Error&) {}
        try { sink = sink + f->get_string(key).size(); } catch (const dsv4::Error&) {}
        try { sink = sink + f->get_string_array(key).size(); } catch (const dsv4::Error&) {}
        try { sink = sink + f->get_number_array(key).size(); } catch (const dsv4::Error&) {}
    }
    for (const TensorInfo& t : f->tensors()) {
        if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
        for (uint64_t k = 0; k < t.nbytes; ++k) sink = sink + t.data[k];
        sink = sink + t.n_elements();
    }
    // Re-serialise and check the round trip is stable.
    std::vector<uint8_t> once = rewrite(*f);
    std::unique_ptr<File> g = File::parse(once.data(), once.size(), "fuzz-rewrite");
    if (g->metadata().size() != f->metadata().size() || g->tensors().size() != f->tensors().size())
        __builtin_trap();
    if (rewrite(*g) != once) __builtin_trap();
    return 0;
}
