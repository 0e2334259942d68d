// Sampling (model-spec.md §7.4), reproducing ds4's algorithm so that a seed means the same
// thing here as there: relative probabilities against the best logit, min-p against the
// best token, top-p over a sorted prefix, and one xorshift64* draw per sampled token.
#include "dsv4/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dsv4/common.h"

namespace dsv4 {

uint64_t Rng::next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
}

float Rng::uniform() { return float((next() >> 40) & 0xFFFFFF) / 16777216.0f; }

namespace {

// Candidate in descending-logit order; ties go to the lower id, like argmax.
struct Cand {
    float logit;
    int32_t id;
};
bool before(const Cand& a, const Cand& b) { return a.logit != b.logit ? a.logit > b.logit : a.id < b.id; }

// The prefix rule shared by top-k and top-p: keep tokens (sorted, probabilities p relative
// to `total`) while p >= p_first * min_p, stop once the kept mass reaches top_p, then draw
// from the kept prefix with one uniform number.
int32_t draw_prefix(std::span<const Cand> sorted, std::span<const float> p, double total, float min_p, float top_p,
                    Rng& rng) {
    const float floor_p = p[0] * min_p;
    size_t kept = 0;
    double mass = 0;
    for (size_t j = 0; j < sorted.size(); ++j) {
        if (j > 0 && p[j] < floor_p) break;
        mass += p[j];
        ++kept;
        if (top_p < 1.0f && mass / total >= top_p) break;
    }
    double r = double(rng.uniform()) * mass;
    for (size_t j = 0; j < kept; ++j) {
        r -= p[j];
        if (r <= 0) return sorted[j].id;
    }
    return sorted[kept - 1].id;  // rounding left a sliver of r
}

}  // namespace

int32_t sample(std::span<const float> logits, const SamplerParams& params, Rng& rng) {
    if (logits.empty()) fail("sampler: no logits to sample from");
    const float temp = params.temperature;
    if (!(temp > 0)) return argmax(logits);
    const float top_p = (params.top_p > 0 && params.top_p <= 1) ? params.top_p : 1.0f;
    const float min_p = params.min_p >= 0 ? std::min(params.min_p, 1.0f) : 0.0f;  // above 1 no token would qualify
    const int top_k = std::min(params.top_k, 1024);
    const float inv_t = 1.0f / temp;

    // A +inf logit is certain; with no finite logit at all there is nothing to weigh.
    float m = -INFINITY;
    for (size_t i = 0; i < logits.size(); ++i) {
        if (logits[i] == INFINITY) return int32_t(i);
        if (std::isfinite(logits[i])) m = std::max(m, logits[i]);
    }
    if (m == -INFINITY) return argmax(logits);

    if (top_k <= 0) {
        // Relative probabilities: the best token has p = 1, so min_p is a plain threshold.
        if (top_p >= 1.0f) {
            // p >= min_p means logit >= m + T*ln(min_p): a cheap pre-filter (with a margin
            // wider than any rounding) spares the exp of the whole vocabulary; the exact
            // test on p below decides.
            const float cut =
                min_p > 0 ? m + temp * std::log(min_p) - (0.01f * temp + 1e-4f * (std::fabs(m) + 1.0f)) : -INFINITY;
            thread_local std::vector<std::pair<int32_t, float>> kept;
            kept.clear();
            double total = 0;
            for (size_t i = 0; i < logits.size(); ++i) {
                if (!(logits[i] >= cut) || !std::isfinite(logits[i])) continue;
                const float pi = std::exp((logits[i] - m) * inv_t);
                if (pi > 0 && pi >= min_p) {
                    kept.emplace_back(int32_t(i), pi);
                    total += pi;
                }
            }
            // Walk ids in increasing order: no sort needed on the default path.
            double r = double(rng.uniform()) * total;
            for (const auto& [id, pi] : kept) {
                r -= pi;
                if (r <= 0) return id;
            }
            return kept.back().first;
        }
        thread_local std::vector<float> p;
        p.resize(logits.size());
        for (size_t i = 0; i < logits.size(); ++i)
            p[i] = std::isfinite(logits[i]) ? std::exp((logits[i] - m) * inv_t) : 0.0f;
        double total = 0;
        for (float v : p) total += v;
        // Only tokens with p >= min_p can be in the prefix (p_first = 1), and the prefix
        // usually ends long before the vocabulary does: sort the best k, grow k only when
        // their mass falls short of top_p. The order (logit desc, id asc) is total, so this
        // draws exactly what a full sort would.
        std::vector<Cand> cand;
        for (size_t i = 0; i < p.size(); ++i)
            if (p[i] > 0 && p[i] >= min_p) cand.push_back({logits[i], int32_t(i)});
        std::vector<float> ps;
        for (size_t k = std::min<size_t>(cand.size(), 256);; k = std::min(cand.size(), k * 4)) {
            if (k < cand.size()) std::nth_element(cand.begin(), cand.begin() + std::ptrdiff_t(k), cand.end(), before);
            std::sort(cand.begin(), cand.begin() + std::ptrdiff_t(k), before);
            ps.resize(k);
            double mass = 0;
            for (size_t j = 0; j < k; ++j) mass += ps[j] = p[size_t(cand[j].id)];
            if (k == cand.size() || mass / total >= top_p)
                return draw_prefix(std::span(cand).first(k), ps, total, min_p, top_p, rng);
        }
    }

    // top-k: the k best logits, softmax with temperature over just those.
    std::vector<Cand> all;
    all.reserve(logits.size());
    for (size_t i = 0; i < logits.size(); ++i)
        if (std::isfinite(logits[i])) all.push_back({logits[i], int32_t(i)});
    const size_t k = std::min(all.size(), size_t(top_k));
    std::partial_sort(all.begin(), all.begin() + std::ptrdiff_t(k), all.end(), before);
    all.resize(k);
    std::vector<float> ps(k);
    double total = 0;
    for (size_t j = 0; j < k; ++j) total += ps[j] = std::exp((all[j].logit - all[0].logit) * inv_t);
    for (float& v : ps) v = float(v / total);
    return draw_prefix(all, ps, 1.0, min_p, top_p, rng);
}

int32_t Sampler::sample(std::span<const float> logits) { return dsv4::sample(logits, params_, rng_); }

int32_t Sampler::sample_with(std::span<const float> logits, const SamplerParams& params) {
    return dsv4::sample(logits, params, rng_);
}

}  // namespace dsv4
