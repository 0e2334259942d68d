// SessionKV: one session's regions, their growth policy, row addressing and accounting.
#include <algorithm>
#include <cmath>

#include "dsv4/kv.h"

namespace dsv4::kv {

namespace {

// Rows of `group_bytes` that have memory behind them, never more than the capacity
// (chunk rounding commits a little past the rows asked for).
uint64_t rows_in(const Region* r, uint64_t group_bytes, uint64_t cap_rows) {
    if (!r || group_bytes == 0) return 0;
    return std::min(cap_rows, r->committed_bytes() / group_bytes);
}

}  // namespace

SessionKV::SessionKV(const model::Config& c, const Layout& layout, const Options& opt, Budget* budget,
                     const RegionFactory& factory)
    : config_(c), layout_(layout), opt_(opt), budget_(budget) {
    // The layout is made from a config; one made from another config would address rows
    // the forward pass does not expect.
    if (layout_.n_layer != c.n_layer || layout_.ratio != c.compress_ratio || layout_.head_dim != c.head_dim ||
        layout_.indexer_dim != c.indexer_head_dim || layout_.n_swa != c.n_swa)
        fail(opt_.label, ": KV layout was made for another config (n_layer ", layout_.n_layer, " vs ", c.n_layer,
             ", head_dim ", layout_.head_dim, " vs ", c.head_dim, ", indexer_dim ", layout_.indexer_dim, " vs ",
             c.indexer_head_dim, ", n_swa ", layout_.n_swa, " vs ", c.n_swa, ")");
    if (!(opt_.growth >= 1.0) || !std::isfinite(opt_.growth))
        fail(opt_.label, ": KV growth factor must be a finite number >= 1, found ", opt_.growth);

    auto make = [&](uint64_t bytes, const char* what) {
        std::unique_ptr<Region> r = factory(bytes, budget_, region_label(what));
        if (!r) fail(region_label(what), ": the region factory returned no region");
        return r;
    };
    fixed_ = make(layout_.fixed_bytes, "fixed");
    if (layout_.n_r4) {
        comp4_ = make(layout_.rows4_cap * layout_.comp4_row_group_bytes(), "comp4");
        index_ = make(layout_.rows4_cap * layout_.index_row_group_bytes(), "index");
    }
    if (layout_.n_r128) comp128_ = make(layout_.rows128_cap * layout_.comp128_row_group_bytes(), "comp128");

    auto commit = [&](Region* r, uint64_t bytes) {
        if (!r) return;
        Status s = r->commit(bytes);
        if (!s) throw Error(s.message);
    };
    commit(fixed_.get(), layout_.fixed_bytes);
    const uint64_t rows4 = opt_.eager ? layout_.rows4_cap : std::min(opt_.initial_rows, layout_.rows4_cap);
    // The ratio-128 stream gets the rows that cover the same tokens as the ratio-4 rows: 4096
    // ratio-128 rows would cover 512K tokens, and a short conversation should commit little.
    const uint64_t rows128 = opt_.eager ? layout_.rows128_cap
                                        : std::min((opt_.initial_rows * 4 + 127) / 128, layout_.rows128_cap);
    commit(comp4_.get(), rows4 * layout_.comp4_row_group_bytes());
    commit(index_.get(), rows4 * layout_.index_row_group_bytes());
    commit(comp128_.get(), rows128 * layout_.comp128_row_group_bytes());

    reset();
}

SessionKV::~SessionKV() = default;

std::string SessionKV::region_label(const char* what) const { return cat(opt_.label, " ", what); }

Region* SessionKV::region(RegionId id) const {
    switch (id) {
        case RegionId::fixed: return fixed_.get();
        case RegionId::comp4: return comp4_.get();
        case RegionId::index: return index_.get();
        case RegionId::comp128: return comp128_.get();
    }
    return nullptr;
}

bool SessionKV::on_device() const { return fixed_->on_device(); }

uint64_t SessionKV::committed_rows(uint32_t ratio) const {
    if (ratio == 4)
        return std::min(rows_in(comp4_.get(), layout_.comp4_row_group_bytes(), layout_.rows4_cap),
                        rows_in(index_.get(), layout_.index_row_group_bytes(), layout_.rows4_cap));
    if (ratio == 128) return rows_in(comp128_.get(), layout_.comp128_row_group_bytes(), layout_.rows128_cap);
    return 0;
}

// ---- growth and the guard ----------------------------------------------------------------

Status SessionKV::check(uint64_t n_end) const {
    if (n_end > layout_.ctx)
        return Status::failure(cat(opt_.label, ": context full: a step ending at ", n_end,
                                   " tokens does not fit the context of ", layout_.ctx, " tokens"));
    struct Stream {
        uint32_t ratio;
        uint32_t n_layers;
        uint64_t cap;
    };
    const Stream streams[] = {{4, layout_.n_r4, layout_.rows4_cap}, {128, layout_.n_r128, layout_.rows128_cap}};
    for (const Stream& s : streams) {
        if (s.n_layers == 0) continue;
        const uint64_t need = rows_after(n_end, s.ratio);
        if (need > s.cap)
            return Status::failure(cat(opt_.label, ": context full: a step ending at ", n_end, " tokens needs ", need,
                                       " ratio-", s.ratio, " rows, capacity is ", s.cap));
        const uint64_t have = committed_rows(s.ratio);
        if (need > have)
            return Status::failure(cat(opt_.label, ": KV guard: a step ending at ", n_end, " tokens writes ratio-",
                                       s.ratio, " rows up to ", need, " but only ", have, " rows are committed"));
    }
    return Status::success();
}

Status SessionKV::grow_stream(Region& r, uint64_t rows_needed, uint64_t row_group_bytes, uint64_t cap_rows,
                              const char* what) {
    const uint64_t have = rows_in(&r, row_group_bytes, cap_rows);
    if (rows_needed <= have) return Status::success();
    // Geometric growth keeps the number of growth points logarithmic in the context; a
    // budget that cannot cover the geometric step may still cover the rows actually needed.
    const double geometric = std::ceil(double(have) * opt_.growth);
    uint64_t target = geometric >= double(cap_rows) ? cap_rows : std::max(rows_needed, uint64_t(geometric));
    target = std::min(target, cap_rows);
    Status s = r.commit(target * row_group_bytes);
    if (!s && target > rows_needed) s = r.commit(rows_needed * row_group_bytes);
    if (!s) return Status::failure(cat(region_label(what), ": growing to ", rows_needed, " rows failed: ", s.message));
    return s;
}

Status SessionKV::ensure_tokens(uint64_t n_end) {
    if (!opt_.allow_growth) return check(n_end);
    if (n_end > layout_.ctx) return check(n_end);   // the context-full message
    if (layout_.n_r4) {
        const uint64_t need = rows_after(n_end, 4);
        if (need > layout_.rows4_cap) return check(n_end);
        Status s = grow_stream(*comp4_, need, layout_.comp4_row_group_bytes(), layout_.rows4_cap, "comp4");
        if (s) s = grow_stream(*index_, need, layout_.index_row_group_bytes(), layout_.rows4_cap, "index");
        if (!s) return s;
    }
    if (layout_.n_r128) {
        const uint64_t need = rows_after(n_end, 128);
        if (need > layout_.rows128_cap) return check(n_end);
        Status s = grow_stream(*comp128_, need, layout_.comp128_row_group_bytes(), layout_.rows128_cap, "comp128");
        if (!s) return s;
    }
    return Status::success();
}

// ---- addressing ---------------------------------------------------------------------------

float* SessionKV::raw_row(uint32_t il, uint64_t pos) const {
    return reinterpret_cast<float*>(fixed_->base() + layout_.raw_off[il] +
                                    (pos % layout_.raw_cap) * layout_.raw_row_bytes());
}

float* SessionKV::comp_row(uint32_t il, uint64_t c) const {
    const uint32_t r = layout_.ratio[il];
    const Region* reg = r == 4 ? comp4_.get() : r == 128 ? comp128_.get() : nullptr;
    if (!reg) return nullptr;
    return reinterpret_cast<float*>(reg->base()) + c * comp_stride(il) + uint64_t(layout_.slot[il]) * layout_.head_dim;
}

float* SessionKV::index_row(uint32_t il, uint64_t c) const {
    if (layout_.ratio[il] != 4) return nullptr;
    return reinterpret_cast<float*>(index_->base()) + c * index_stride() +
           uint64_t(layout_.slot[il]) * layout_.indexer_dim;
}

uint64_t SessionKV::comp_stride(uint32_t il) const {
    const uint32_t r = layout_.ratio[il];
    if (r == 4) return uint64_t(layout_.n_r4) * layout_.head_dim;
    if (r == 128) return uint64_t(layout_.n_r128) * layout_.head_dim;
    return 0;
}

float* SessionKV::state_kv(uint32_t il) const {
    if (layout_.ratio[il] == 0) return nullptr;
    return reinterpret_cast<float*>(fixed_->base() + layout_.state_kv_off[il]);
}
float* SessionKV::state_score(uint32_t il) const {
    if (layout_.ratio[il] == 0) return nullptr;
    return reinterpret_cast<float*>(fixed_->base() + layout_.state_sc_off[il]);
}
float* SessionKV::istate_kv(uint32_t il) const {
    if (layout_.ratio[il] != 4) return nullptr;
    return reinterpret_cast<float*>(fixed_->base() + layout_.istate_kv_off[il]);
}
float* SessionKV::istate_score(uint32_t il) const {
    if (layout_.ratio[il] != 4) return nullptr;
    return reinterpret_cast<float*>(fixed_->base() + layout_.istate_sc_off[il]);
}

// ---- reset and accounting -----------------------------------------------------------------

void SessionKV::reset() {
    // Region calls, not pointers, so device regions are initialised on the device.
    uint64_t max_bytes = layout_.n_r4 ? layout_.istate_bytes() : 0;
    for (uint32_t il = 0; il < layout_.n_layer; ++il)
        if (layout_.ratio[il]) max_bytes = std::max(max_bytes, layout_.state_bytes(il));
    const std::vector<float> neg_inf(max_bytes / 4, kNegInf);
    for (uint32_t il = 0; il < layout_.n_layer; ++il) {
        if (layout_.ratio[il] == 0) continue;
        fixed_->zero(layout_.state_kv_off[il], layout_.state_bytes(il));
        fixed_->copy_in(layout_.state_sc_off[il], neg_inf.data(), layout_.state_bytes(il));
        if (layout_.ratio[il] != 4) continue;
        fixed_->zero(layout_.istate_kv_off[il], layout_.istate_bytes());
        fixed_->copy_in(layout_.istate_sc_off[il], neg_inf.data(), layout_.istate_bytes());
    }
    n_tokens_ = 0;
}

Accounting SessionKV::accounting() const {
    Accounting a;
    a.logical = layout_.logical_bytes();
    for (const Region* r : {fixed_.get(), comp4_.get(), index_.get(), comp128_.get()}) {
        if (!r) continue;
        a.reserved += r->reserved_bytes();
        a.committed += r->committed_bytes();
    }
    uint64_t states = 0;
    for (uint32_t il = 0; il < layout_.n_layer; ++il) {
        if (layout_.ratio[il]) states += 2 * layout_.state_bytes(il);
        if (layout_.ratio[il] == 4) states += 2 * layout_.istate_bytes();
    }
    const uint64_t raw_rows = std::min<uint64_t>(n_tokens_, layout_.raw_cap);
    a.live = raw_rows * layout_.raw_row_bytes() * layout_.n_layer + states +
             rows_after(n_tokens_, 4) * (layout_.comp4_row_group_bytes() + layout_.index_row_group_bytes()) +
             rows_after(n_tokens_, 128) * layout_.comp128_row_group_bytes();
    return a;
}

}  // namespace dsv4::kv
