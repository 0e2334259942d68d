// Weight binding by tensor name with shape and type checks (model-spec §2.3).
#include <set>

#include "dsv4/model.h"
#include "model/tensors.h"

namespace dsv4::model {

namespace {

std::string shape_string(const std::vector<uint64_t>& ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// Trailing 1s do not change a shape ([4096, 1] == [4096]).
std::vector<uint64_t> squeeze(std::vector<uint64_t> ne) {
    while (ne.size() > 1 && ne.back() == 1) ne.pop_back();
    return ne;
}

}  // namespace

const uint8_t* Tensor::row(uint64_t r) const { return info->data + r * row_bytes(); }

size_t Tensor::row_bytes() const { return quant::row_bytes(type(), ne(0)); }

Weights Weights::bind(const gguf::File& f, const Config& c) {
    Weights w;
    w.layers.resize(c.n_layer);

    std::string mtp_scheme;
    bool has_mtp0 = false;
    for (const auto& t : f.tensors())
        if (t.name.rfind("mtp.0.", 0) == 0) has_mtp0 = true;
    if (has_mtp0)
        mtp_scheme = "mtp.0";
    else if (c.n_mtp > 0)
        mtp_scheme = "blk.N";
    w.mtp.present = !mtp_scheme.empty();
    w.mtp.scheme = mtp_scheme == "blk.N" ? cat("blk.", c.n_layer) : mtp_scheme;

    std::set<std::string> bound;
    for (const TensorSpec& s : tensor_specs(c, mtp_scheme)) {
        const gguf::TensorInfo* t = f.find_tensor(s.name);
        if (!t) {
            if (s.required) fail(f.path(), ": missing tensor '", s.name, "' (expected shape ", shape_string(s.ne), ")");
            continue;
        }
        if (squeeze(t->ne) != squeeze(s.ne))
            fail(f.path(), ": tensor '", s.name, "' has shape ", shape_string(t->ne), ", expected ",
                 shape_string(s.ne));
        if (!quant::traits(t->type) || !type_allowed(s.role, quant::Type(t->type)))
            fail(f.path(), ": tensor '", s.name, "' has type ", quant::type_name(t->type),
                 ", which is not supported for this tensor");
        s.slot(w).info = t;
        w.total_bytes += t->nbytes;
        bound.insert(s.name);
    }
    for (const auto& t : f.tensors())
        if (!bound.count(t.name))
            fail(f.path(), ": unexpected tensor '", t.name, "' (not part of a DeepSeek V4 model with ", c.n_layer,
                 " layers and this layer schedule)");
    return w;
}

std::unique_ptr<Model> Model::load(const std::string& path) {
    auto m = std::make_unique<Model>();
    m->file = gguf::File::open(path);
    m->config = Config::from_gguf(*m->file);
    m->weights = Weights::bind(*m->file, m->config);
    return m;
}

}  // namespace dsv4::model
