// Sampler (model-spec.md §7.4): generator, greedy, and the filters' properties.
#include "dsv4/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "dsv4/common.h"

using namespace dsv4;

namespace {

std::vector<float> log_probs(std::initializer_list<double> p) {
    std::vector<float> out;
    for (double v : p) out.push_back(float(std::log(v)));
    return out;
}

std::vector<int> histogram(const std::vector<float>& logits, const SamplerParams& params, int draws) {
    std::vector<int> h(logits.size(), 0);
    Sampler s(params);
    for (int i = 0; i < draws; ++i) ++h[size_t(s.sample(logits))];
    return h;
}

}  // namespace

TEST(SamplerRng, IsXorshift64Star) {
    Rng r(1);
    EXPECT_EQ(r.next(), 0x47e4ce4b896cdd1dull);
    EXPECT_EQ(r.next(), 0xabcfa6a8e079651dull);
    Rng u(1);
    EXPECT_FLOAT_EQ(u.uniform(), 0.28083503246307373f);
    EXPECT_FLOAT_EQ(u.uniform(), 0.6711372137069702f);
    Rng z(0);  // a zero state would stay zero forever
    EXPECT_EQ(z.state(), 0x9E3779B97F4A7C15ull);
    EXPECT_EQ(z.next(), 0xd83b3e29a21487aull);
    Rng q(42);
    for (int i = 0; i < 100000; ++i) {
        const float x = q.uniform();
        ASSERT_GE(x, 0.0f);
        ASSERT_LT(x, 1.0f);
    }
}

TEST(SamplerGreedy, ArgmaxAndExclusions) {
    const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, NAN};
    EXPECT_EQ(argmax(l), 1);  // first of equal maxima
    EXPECT_EQ(argmax(std::vector<float>{NAN, 1.0f}), 1);
    EXPECT_EQ(argmax(std::vector<float>{}), -1);
    const int32_t no1[] = {1};
    EXPECT_EQ(argmax_excluding(l, no1), 3);
    const int32_t no13[] = {1, 3};
    EXPECT_EQ(argmax_excluding(l, no13), 0);
    const int32_t all[] = {0, 1, 2, 3, 4};
    EXPECT_EQ(argmax_excluding(l, all), -1);

    SamplerParams p;
    p.temperature = 0;
    Rng rng(7);
    EXPECT_EQ(sample(l, p, rng), 1);
    EXPECT_EQ(rng.state(), 7u);  // greedy draws take no random number
    EXPECT_THROW(sample(std::vector<float>{}, p, rng), Error);
}

TEST(SamplerFilters, TopKOneIsArgmax) {
    std::mt19937 gen(3);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (int trial = 0; trial < 50; ++trial) {
        std::vector<float> l(1000);
        for (float& v : l) v = nd(gen);
        SamplerParams p;
        p.top_k = 1;
        p.seed = uint64_t(trial) + 1;
        p.temperature = 1.5f;
        Sampler s(p);
        EXPECT_EQ(s.sample(l), argmax(l));
    }
}

TEST(SamplerFilters, MinPDropsUnlikelyTokens) {
    // Relative probabilities 1, 0.1, 0.01: min_p 0.05 removes the third.
    const auto l = log_probs({1.0, 0.1, 0.01});
    SamplerParams p;
    p.seed = 11;
    p.min_p = 0.05f;
    auto h = histogram(l, p, 20000);
    EXPECT_EQ(h[2], 0);
    EXPECT_NEAR(h[1] / 20000.0, 0.1 / 1.1, 0.01);
    p.min_p = 0.0f;
    h = histogram(l, p, 20000);
    EXPECT_GT(h[2], 0);
    EXPECT_NEAR(h[2] / 20000.0, 0.01 / 1.11, 0.004);
    // The same rule on the sorted (top-k) path.
    p.min_p = 0.05f;
    p.top_k = 3;
    EXPECT_EQ(histogram(l, p, 20000)[2], 0);
}

TEST(SamplerFilters, TopPKeepsTheSmallestPrefix) {
    // Probabilities .533 .267 .133 .067: top_p 0.7 keeps the first two (.8 >= .7).
    const auto l = log_probs({8, 4, 2, 1});
    SamplerParams p;
    p.seed = 5;
    p.min_p = 0;
    p.top_p = 0.7f;
    auto h = histogram(l, p, 20000);
    EXPECT_EQ(h[2] + h[3], 0);
    EXPECT_NEAR(h[0] / 20000.0, 2.0 / 3.0, 0.02);
    p.top_k = 4;
    h = histogram(l, p, 20000);
    EXPECT_EQ(h[2] + h[3], 0);
    // Out-of-range top_p means no top-p.
    p.top_k = 0;
    p.top_p = 1.5f;
    h = histogram(l, p, 20000);
    EXPECT_GT(h[3], 0);
}

TEST(SamplerFilters, FollowsTheDistribution) {
    const auto l = log_probs({0.5, 0.3, 0.2});
    SamplerParams p;
    p.seed = 99;
    p.min_p = 0;
    const auto h = histogram(l, p, 40000);
    EXPECT_NEAR(h[0] / 40000.0, 0.5, 0.015);
    EXPECT_NEAR(h[1] / 40000.0, 0.3, 0.015);
    EXPECT_NEAR(h[2] / 40000.0, 0.2, 0.015);
    // A low temperature sharpens towards the best token.
    p.temperature = 0.05f;
    EXPECT_GT(histogram(l, p, 2000)[0], 1990);
}

TEST(SamplerFilters, NonFiniteLogits) {
    SamplerParams p;
    p.seed = 3;
    p.min_p = 0;
    const std::vector<float> l = {-INFINITY, 1.0f, NAN, 1.0f};
    const auto h = histogram(l, p, 2000);
    EXPECT_EQ(h[0] + h[2], 0);
    EXPECT_GT(h[1], 0);
    EXPECT_GT(h[3], 0);
    Rng rng(1);
    EXPECT_EQ(sample(std::vector<float>{0.0f, INFINITY, 5.0f}, p, rng), 1);
    p.top_k = 2;
    EXPECT_EQ(histogram(l, p, 500)[2], 0);
}

TEST(SamplerDeterminism, SameSeedSameTokens) {
    std::mt19937 gen(8);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> l(8192);
    for (float& v : l) v = nd(gen);
    for (const SamplerParams& base :
         {SamplerParams{}, SamplerParams{0.8f, 0.9f, 0.0f, 0, 0}, SamplerParams{1.2f, 1.0f, 0.1f, 40, 0}}) {
        SamplerParams p = base;
        p.seed = 1234;
        Sampler a(p), b(p);
        p.seed = 4321;
        Sampler c(p);
        std::vector<int32_t> ta, tb, tc;
        for (int i = 0; i < 50; ++i) {
            ta.push_back(a.sample(l));
            tb.push_back(b.sample(l));
            tc.push_back(c.sample(l));
        }
        EXPECT_EQ(ta, tb);
        EXPECT_NE(ta, tc);
    }
    // Each non-greedy draw takes exactly one number from the generator.
    Rng r(77), ref(77);
    SamplerParams p;
    sample(l, p, r);
    ref.next();
    EXPECT_EQ(r.state(), ref.state());
    // A temperature-0 draw in between (the DSML guard) does not shift later draws.
    SamplerParams greedy = p;
    greedy.temperature = 0;
    Sampler x(p), y(p);
    x.sample(l);
    y.sample(l);
    EXPECT_EQ(x.sample_with(l, greedy), argmax(l));
    EXPECT_EQ(x.sample(l), y.sample(l));
}

TEST(SamplerFilters, TopKIsCappedAt1024) {
    std::vector<float> l(3000);
    for (size_t i = 0; i < l.size(); ++i) l[i] = -float(i) * 0.001f;  // nearly flat, best first
    SamplerParams p;
    p.min_p = 0;
    p.top_k = 5000;
    p.seed = 9;
    Sampler s(p);
    for (int i = 0; i < 500; ++i) ASSERT_LT(s.sample(l), 1024);
}

namespace {

// §7.4 written out plainly (full exp, full sort), to check the fast paths draw the same ids.
int32_t reference_sample(const std::vector<float>& l, const SamplerParams& prm, Rng& rng) {
    if (!(prm.temperature > 0)) return argmax(l);
    const float T = prm.temperature;
    const float top_p = (prm.top_p > 0 && prm.top_p <= 1) ? prm.top_p : 1.0f;
    const float min_p = prm.min_p >= 0 ? std::min(prm.min_p, 1.0f) : 0.0f;
    const int top_k = std::min(prm.top_k, 1024);
    float m = -INFINITY;
    for (float v : l)
        if (std::isfinite(v)) m = std::max(m, v);
    std::vector<int32_t> order;
    for (size_t i = 0; i < l.size(); ++i)
        if (std::isfinite(l[i])) order.push_back(int32_t(i));
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
    std::vector<float> p(l.size(), 0.0f);
    for (size_t i = 0; i < l.size(); ++i)
        if (std::isfinite(l[i])) p[i] = std::exp((l[i] - m) * (1.0f / T));
    auto draw = [&](const std::vector<int32_t>& ids, const std::vector<float>& pr) {
        double mass = 0;
        for (float v : pr) mass += v;
        double r = double(rng.uniform()) * mass;
        for (size_t j = 0; j < ids.size(); ++j) {
            r -= pr[j];
            if (r <= 0) return ids[j];
        }
        return ids.back();
    };
    std::vector<int32_t> ids;
    std::vector<float> pr;
    if (top_k <= 0 && top_p >= 1.0f) {
        for (size_t i = 0; i < l.size(); ++i)
            if (p[i] > 0 && p[i] >= min_p) {
                ids.push_back(int32_t(i));
                pr.push_back(p[i]);
            }
        return draw(ids, pr);
    }
    double total = 0;
    std::vector<float> q;
    if (top_k <= 0) {
        for (float v : p) total += v;
        for (int32_t id : order) q.push_back(p[size_t(id)]);
    } else {
        order.resize(std::min(order.size(), size_t(top_k)));
        for (int32_t id : order) total += std::exp((l[size_t(id)] - l[size_t(order[0])]) * (1.0f / T));
        for (int32_t id : order)
            q.push_back(float(std::exp((l[size_t(id)] - l[size_t(order[0])]) * (1.0f / T)) / total));
        total = 1.0;
    }
    double mass = 0;
    for (size_t j = 0; j < order.size(); ++j) {
        if (j > 0 && (q[j] < q[0] * min_p || q[j] <= 0)) break;
        ids.push_back(order[j]);
        pr.push_back(q[j]);
        mass += q[j];
        if (top_p < 1.0f && mass / total >= top_p) break;
    }
    return draw(ids, pr);
}

}  // namespace

TEST(SamplerDeterminism, FastPathsDrawWhatThePlainAlgorithmDraws) {
    std::mt19937 gen(21);
    const SamplerParams configs[] = {
        {1.0f, 1.0f, 0.05f, 0, 0}, {0.7f, 1.0f, 0.2f, 0, 0},   {1.3f, 1.0f, 0.0f, 0, 0},
        {0.8f, 0.9f, 0.05f, 0, 0}, {0.6f, 0.5f, 0.0f, 0, 0},   {1.0f, 0.95f, 0.1f, 40, 0},
        {1.0f, 1.0f, 0.05f, 8, 0}, {0.01f, 1.0f, 0.05f, 0, 0}, {1.0f, 1.0f, 3.0f, 0, 0},
    };
    for (const SamplerParams& cfg : configs) {
        for (int trial = 0; trial < 40; ++trial) {
            std::normal_distribution<float> nd(0.0f, 1.0f + float(trial % 5));
            std::vector<float> l(2000 + size_t(trial) * 37);
            for (float& v : l) v = nd(gen);
            l[size_t(trial) % l.size()] = l[(size_t(trial) * 7) % l.size()];  // a tie now and then
            Rng a(uint64_t(trial) + 100), b(uint64_t(trial) + 100);
            for (int k = 0; k < 5; ++k)
                ASSERT_EQ(sample(l, cfg, a), reference_sample(l, cfg, b))
                    << "T " << cfg.temperature << " top_p " << cfg.top_p << " min_p " << cfg.min_p << " top_k "
                    << cfg.top_k << " trial " << trial;
        }
    }
}
