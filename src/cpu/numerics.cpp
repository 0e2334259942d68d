#include "cpu/numerics.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace dsv4::cpu {

namespace {

// All non-negative E4M3FN values in code order: code k = 8e + m.
std::array<float, 127> make_e4m3_table() {
    std::array<float, 127> t{};
    for (int k = 0; k < 127; ++k) {
        const int e = k >> 3, m = k & 7;
        t[size_t(k)] = e == 0 ? float(m) * 0x1p-9f : (1.0f + float(m) / 8.0f) * std::ldexp(1.0f, e - 7);
    }
    return t;
}

// Nearest entry of an ascending table; ties go to the even index.
template <size_t N>
float nearest_even(const std::array<float, N>& t, float a) {
    auto it = std::lower_bound(t.begin(), t.end(), a);
    if (it == t.begin()) return t.front();
    if (it == t.end()) return t.back();
    const size_t hi = size_t(it - t.begin()), lo = hi - 1;
    const float dlo = a - t[lo], dhi = t[hi] - a;
    if (dlo < dhi) return t[lo];
    if (dhi < dlo) return t[hi];
    return (lo % 2 == 0) ? t[lo] : t[hi];
}

const std::array<float, 127> kE4M3 = make_e4m3_table();
const std::array<float, 8> kE2M1 = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

template <typename Round>
void block_sim(float* x, uint32_t n, uint32_t block, float qmax, float amax_floor, Round round) {
    for (uint32_t b = 0; b < n; b += block) {
        const uint32_t e = std::min(n, b + block);
        float amax = 0;
        for (uint32_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
        amax = std::max(amax, amax_floor);
        const float scale = pow2_ceil(amax / qmax);
        for (uint32_t i = b; i < e; ++i) {
            const float v = std::clamp(x[i] / scale, -qmax, qmax);
            x[i] = round(v) * scale;
        }
    }
}

}  // namespace

float e4m3_round(float v) {
    const float a = nearest_even(kE4M3, std::fabs(v));
    return std::signbit(v) ? -a : a;
}

float e2m1_round(float v) {
    const float a = nearest_even(kE2M1, std::fabs(v));
    return std::signbit(v) ? -a : a;
}

float pow2_ceil(float x) {
    int e;
    const float m = std::frexp(x, &e);   // x = m * 2^e, m in [0.5, 1)
    return m == 0.5f ? std::ldexp(1.0f, e - 1) : std::ldexp(1.0f, e);
}

void fp8_sim(float* x, uint32_t n) { block_sim(x, n, 64, 448.0f, 1e-4f, e4m3_round); }

void fp4_sim(float* x, uint32_t n) { block_sim(x, n, 32, 6.0f, 7.052966104933725e-38f, e2m1_round); }

void hadamard(float* x, uint32_t n) {
    for (uint32_t stride = 1; stride < n; stride <<= 1)
        for (uint32_t i = 0; i < n; ++i)
            if (!(i & stride)) {
                const float a = x[i], b = x[i + stride];
                x[i] = a + b;
                x[i + stride] = a - b;
            }
    const float s = float(1.0 / std::sqrt(double(n)));
    for (uint32_t i = 0; i < n; ++i) x[i] *= s;
}

Rope::Rope(const model::Config& c, bool compressed) : n_rot_(c.n_rot) {
    const double base = compressed ? c.compress_rope_freq_base : c.rope_freq_base;
    const uint32_t pairs = n_rot_ / 2;
    inv_freq_.resize(pairs);
    double low = 0, high = 0;
    const bool yarn = compressed && c.rope_scaling_factor > 1;
    if (yarn) {
        // Correction range of YaRN: pairs below `low` keep their frequency, pairs above
        // `high` are interpolated by 1/factor, the ones between blend linearly.
        auto corr = [&](double beta) {
            return n_rot_ * std::log(double(c.rope_orig_ctx) / (beta * 2 * M_PI)) / (2 * std::log(base));
        };
        low = std::max(0.0, std::floor(corr(c.yarn_beta_fast)));
        high = std::min(double(n_rot_ - 1), std::ceil(corr(c.yarn_beta_slow)));
    }
    for (uint32_t i = 0; i < pairs; ++i) {
        const double extrap = std::pow(base, -2.0 * i / n_rot_);
        if (!yarn) {
            inv_freq_[i] = extrap;
            continue;
        }
        const double interp = extrap / c.rope_scaling_factor;
        const double ramp = 1.0 - std::clamp((double(i) - low) / std::max(0.001, high - low), 0.0, 1.0);
        inv_freq_[i] = interp * (1 - ramp) + extrap * ramp;
    }
}

double Rope::theta(uint64_t pos, uint32_t pair) const { return double(pos) * inv_freq_[pair]; }

void Rope::cos_sin(uint64_t pos, float* cs) const {
    for (uint32_t i = 0; i < n_rot_ / 2; ++i) {
        const double th = theta(pos, i);
        cs[2 * i] = float(std::cos(th));
        cs[2 * i + 1] = float(std::sin(th));
    }
}

void Rope::apply_cs(float* x, uint32_t width, const float* cs, bool inverse) const {
    float* t = x + (width - n_rot_);
    for (uint32_t i = 0; i < n_rot_ / 2; ++i) {
        const float c = cs[2 * i], s = inverse ? -cs[2 * i + 1] : cs[2 * i + 1];
        const float x0 = t[2 * i], x1 = t[2 * i + 1];
        t[2 * i] = x0 * c - x1 * s;
        t[2 * i + 1] = x0 * s + x1 * c;
    }
}

void Rope::apply(float* x, uint32_t width, uint64_t pos, bool inverse) const {
    std::vector<float> cs(n_rot_);
    cos_sin(pos, cs.data());
    apply_cs(x, width, cs.data(), inverse);
}

}  // namespace dsv4::cpu
