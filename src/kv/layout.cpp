// Layout: where each layer's raw ring, compressor state and compressed rows live.
#include <algorithm>

#include "dsv4/kv.h"

namespace dsv4::kv {

namespace {

// Every piece of the fixed region starts on a 256-byte boundary, so device kernels and
// vector loads see aligned rows whatever the head sizes.
constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Slack rows past ceil(ctx/ratio), as ds4 allocates them (model-spec §6.1).
constexpr uint64_t kSlackRows = 2;

}  // namespace

Accounting& Accounting::operator+=(const Accounting& o) {
    logical += o.logical;
    reserved += o.reserved;
    committed += o.committed;
    live += o.live;
    return *this;
}

uint64_t Layout::logical_bytes() const {
    return fixed_bytes + rows4_cap * (comp4_row_group_bytes() + index_row_group_bytes()) +
           rows128_cap * comp128_row_group_bytes();
}

Layout Layout::make(const model::Config& c, uint64_t ctx, uint32_t prefill_chunk) {
    if (ctx == 0) fail("KV layout: context must be at least 1 token, found 0");
    if (c.compress_ratio.size() != c.n_layer)
        fail("KV layout: compress_ratio has ", c.compress_ratio.size(), " entries, expected n_layer = ", c.n_layer);
    if (c.n_layer == 0) fail("KV layout: n_layer must be at least 1, found 0");
    if (c.head_dim == 0) fail("KV layout: head_dim must be at least 1, found 0");
    if (c.n_swa == 0) fail("KV layout: sliding window must be at least 1, found 0");

    Layout l;
    l.ctx = ctx;
    l.n_swa = c.n_swa;
    l.head_dim = c.head_dim;
    l.indexer_dim = c.indexer_head_dim;
    l.n_layer = c.n_layer;
    l.ratio = c.compress_ratio;

    // The ring holds the window plus a whole prefill chunk (model-spec §6.1), never more
    // than the context itself.
    const uint64_t window = std::min<uint64_t>(ctx, c.n_swa);
    const uint64_t raw_cap = std::max(window, std::min<uint64_t>(ctx, uint64_t(c.n_swa) + prefill_chunk));
    if (raw_cap > UINT32_MAX) fail("KV layout: raw ring of ", raw_cap, " rows does not fit 32 bits");
    l.raw_cap = uint32_t(raw_cap);

    l.slot.assign(c.n_layer, -1);
    for (uint32_t il = 0; il < c.n_layer; ++il) {
        const uint32_t r = l.ratio[il];
        if (r == 4)
            l.slot[il] = int32_t(l.n_r4++);
        else if (r == 128)
            l.slot[il] = int32_t(l.n_r128++);
        else if (r != 0)
            fail("KV layout: layer ", il, " has compression ratio ", r, ", expected 0, 4 or 128");
    }
    if (l.n_r4 > 0 && l.indexer_dim == 0)
        fail("KV layout: indexer key length must be at least 1 for ratio-4 layers, found 0");
    l.rows4_cap = l.n_r4 ? (ctx + 3) / 4 + kSlackRows : 0;
    l.rows128_cap = l.n_r128 ? (ctx + 127) / 128 + kSlackRows : 0;

    l.raw_off.assign(c.n_layer, 0);
    l.state_kv_off.assign(c.n_layer, 0);
    l.state_sc_off.assign(c.n_layer, 0);
    l.istate_kv_off.assign(c.n_layer, 0);
    l.istate_sc_off.assign(c.n_layer, 0);
    uint64_t off = 0;
    for (uint32_t il = 0; il < c.n_layer; ++il) {
        l.raw_off[il] = off;
        off = align_up(off + raw_cap * l.raw_row_bytes());
    }
    for (uint32_t il = 0; il < c.n_layer; ++il) {
        if (l.ratio[il] == 0) continue;
        l.state_kv_off[il] = off;
        off = align_up(off + l.state_bytes(il));
        l.state_sc_off[il] = off;
        off = align_up(off + l.state_bytes(il));
        if (l.ratio[il] != 4) continue;
        l.istate_kv_off[il] = off;
        off = align_up(off + l.istate_bytes());
        l.istate_sc_off[il] = off;
        off = align_up(off + l.istate_bytes());
    }
    l.fixed_bytes = off;
    return l;
}

}  // namespace dsv4::kv
