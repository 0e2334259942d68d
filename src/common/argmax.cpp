// Greedy picks (declared in dsv4/sampler.h). Here in the common layer, not the runtime's
// sampler, because the backends form greedy ids themselves (StepInput::greedy) and link below
// the runtime (scripts/gpu.sh builds the CUDA tests without it).
#include <algorithm>
#include <cmath>

#include "dsv4/sampler.h"

namespace dsv4 {

int32_t argmax(std::span<const float> logits) {
    // Strict '>' keeps the first of equal maxima and never lets NaN win.
    int32_t best = -1;
    float bv = -INFINITY;
    for (size_t i = 0; i < logits.size(); ++i) {
        if (logits[i] > bv) {
            bv = logits[i];
            best = int32_t(i);
        }
    }
    if (best < 0)  // every logit is -inf or NaN: the first -inf, else 0
        for (size_t i = 0; i < logits.size() && best < 0; ++i)
            if (!std::isnan(logits[i])) best = int32_t(i);
    return best < 0 && !logits.empty() ? 0 : best;
}

int32_t argmax_excluding(std::span<const float> logits, std::span<const int32_t> excluded) {
    int32_t best = -1;
    for (size_t i = 0; i < logits.size(); ++i) {
        if (std::isnan(logits[i])) continue;
        if (best >= 0 && !(logits[i] > logits[size_t(best)])) continue;
        if (std::find(excluded.begin(), excluded.end(), int32_t(i)) != excluded.end()) continue;
        best = int32_t(i);
    }
    if (best < 0)  // only NaNs left: the first id that is not excluded
        for (size_t i = 0; i < logits.size() && best < 0; ++i)
            if (std::find(excluded.begin(), excluded.end(), int32_t(i)) == excluded.end()) best = int32_t(i);
    return best;
}

}  // namespace dsv4
