#!/usr/bin/env python3
"""Oracle 2: Hugging Face transformers' DeepseekV4ForCausalLM run on the weights of a dsv4 GGUF.

Self-contained: numpy, torch and transformers (>= 5.8; checked with 5.17) and nothing else.
The GGUF is parsed here (v3; F32 and I32 tensors only, as `dsv4 synth --types f32` writes
them), the config is built from the deepseek4.* metadata, every GGUF tensor is mapped onto
the HF state_dict under strict checks, and the whole sequence runs in one forward pass.

Subcommands
  keys     print the HF state_dict (names, shapes, dtypes) for a GGUF's config and the mapping
  run      HF logits for a token list in one or more precisions, each compared with --ours
  compare  compare two raw float32 logit files [n_tokens][n_vocab] (numpy only)

Precisions (run --dtypes):
  fp32         the model in float32, HF code as shipped
  fp64         the model in float64, HF code as shipped (HF keeps some float32 islands:
               RMSNorm and the hyper-connection weights are computed in float32, RoPE
               angles in float32)
  fp64-strict  float64 everywhere: while it runs, float32 casts inside HF's code are
               promoted to float64 and the RoPE inverse frequencies are recomputed in
               float64 (after checking they equal HF's float32 ones to float32 precision)

torch and transformers are imported only by `keys` and `run`.
"""
import argparse
import copy
import json
import math
import os
import struct
import sys
import time

import numpy as np

# ----------------------------------------------------------------------------------------
# GGUF v3 reader (model-spec §2.1)
# ----------------------------------------------------------------------------------------

GGML_F32, GGML_I32 = 0, 26
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
                   10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
                   17: "IQ2_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 30: "BF16", 39: "MXFP4"}

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class GGUFError(Exception):
    pass


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFError("string runs past the end of the file")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, t, depth=0):
        if t in _SCALAR:
            return self.take(_SCALAR[t])
        if t == 8:
            return self.string()
        if t == 9:
            if depth >= 8:
                raise GGUFError("metadata arrays nested deeper than 8")
            it, n = self.take("<I"), self.take("<Q")
            if it in _SCALAR and it != 7:
                fmt = _SCALAR[it]
                size = struct.calcsize(fmt)
                arr = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=n, offset=self.pos)
                self.pos += n * size
                return arr.tolist()
            return [self.value(it, depth + 1) for _ in range(n)]
        raise GGUFError(f"unknown metadata value type {t}")


def read_gguf(path):
    """Returns (metadata dict, {name: (ggml type, ne list, numpy array in torch order or None)}).

    Only F32 and I32 tensors get an array; any other type raises GGUFError naming the tensor."""
    with open(path, "rb") as f:
        buf = memoryview(f.read())
    c = _Cursor(buf)
    magic = c.take("<I")
    if magic != 0x46554747:
        raise GGUFError(f"{path}: not a GGUF file (magic {magic:#x})")
    version = c.take("<I")
    if version != 3:
        raise GGUFError(f"{path}: GGUF version {version}, only version 3 is supported")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = c.string()
        meta[k] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        nd = c.take("<I")
        if not 1 <= nd <= 8:
            raise GGUFError(f"{path}: tensor {name} has {nd} dimensions")
        ne = [c.take("<Q") for _ in range(nd)]
        t = c.take("<I")
        off = c.take("<Q")
        infos.append((name, ne, t, off))
    align = int(meta.get("general.alignment", 32))
    data_start = (c.pos + align - 1) // align * align
    tensors = {}
    bad = []
    for name, ne, t, off in infos:
        if name in tensors:
            raise GGUFError(f"{path}: tensor {name} appears twice")
        n = int(np.prod(ne, dtype=np.uint64))
        if t not in (GGML_F32, GGML_I32):
            bad.append(f"{name} ({GGML_TYPE_NAMES.get(t, t)})")
            tensors[name] = (t, ne, None)
            continue
        start = data_start + off
        if start + 4 * n > len(buf):
            raise GGUFError(f"{path}: tensor {name} runs past the end of the file")
        arr = np.frombuffer(buf, dtype="<f4" if t == GGML_F32 else "<i4", count=n, offset=start)
        tensors[name] = (t, ne, arr.reshape(list(reversed(ne))))  # ggml ne0 is innermost
    if bad:
        raise GGUFError(f"{path}: only F32 and I32 tensors are supported (write the model with "
                        f"`dsv4 synth ... --types f32`); {len(bad)} tensors have other types, e.g. "
                        + ", ".join(bad[:5]))
    return meta, tensors


# ----------------------------------------------------------------------------------------
# Config: deepseek4.* metadata -> DeepseekV4Config kwargs
# ----------------------------------------------------------------------------------------

def config_kwargs(meta):
    A = "deepseek4."

    def get(k, default=None):
        if A + k in meta:
            return meta[A + k]
        if default is not None:
            return default
        raise GGUFError(f"missing metadata key {A}{k}")

    if meta.get("general.architecture") != "deepseek4":
        raise GGUFError(f"general.architecture is {meta.get('general.architecture')!r}, expected 'deepseek4'")
    n_mtp = int(get("nextn_predict_layers", 0))
    if n_mtp:
        raise GGUFError("the GGUF has an MTP block (nextn_predict_layers > 0); HF DeepseekV4 has none: "
                        "write the model without --mtp")
    n_layer = int(get("block_count"))
    vocab = int(meta[A + "vocab_size"]) if A + "vocab_size" in meta else len(meta["tokenizer.ggml.tokens"])
    if int(get("attention.head_count_kv")) != 1:
        raise GGUFError("attention.head_count_kv must be 1")
    if int(get("attention.value_length")) != int(get("attention.key_length")):
        raise GGUFError("attention.value_length must equal key_length")
    if int(get("expert_shared_count")) != 1:
        raise GGUFError("HF DeepseekV4 has exactly one shared expert")
    if int(get("expert_gating_func", 4)) != 4:
        raise GGUFError("expert_gating_func must be 4 (sqrt-softplus)")
    if not bool(get("expert_weights_norm")):
        raise GGUFError("expert_weights_norm must be true")
    if meta.get(A + "rope.scaling.type", "yarn") != "yarn":
        raise GGUFError("rope.scaling.type must be yarn")
    ratios = [int(r) for r in get("attention.compress_ratios")][:n_layer]
    if len(ratios) < n_layer or any(r not in (0, 4, 128) for r in ratios):
        raise GGUFError(f"attention.compress_ratios {ratios}: need one of 0, 4, 128 per layer")
    clamp = [float(x) for x in get("swiglu_clamp_exp")][:n_layer]
    shclamp = [float(x) for x in get("swiglu_clamp_shexp", clamp)][:n_layer]
    if len(set(clamp + shclamp)) != 1:
        raise GGUFError(f"HF has one swiglu_limit for every layer and the shared expert; the GGUF has "
                        f"{sorted(set(clamp + shclamp))}")
    factor = float(get("rope.scaling.factor"))
    orig = int(get("rope.scaling.original_context_length"))
    kw = dict(
        vocab_size=vocab,
        hidden_size=int(get("embedding_length")),
        num_hidden_layers=n_layer,
        num_attention_heads=int(get("attention.head_count")),
        num_key_value_heads=1,
        head_dim=int(get("attention.key_length")),
        q_lora_rank=int(get("attention.q_lora_rank")),
        qk_rope_head_dim=int(get("rope.dimension_count")),
        o_groups=int(get("attention.output_group_count")),
        o_lora_rank=int(get("attention.output_lora_rank")),
        n_routed_experts=int(get("expert_count")),
        num_experts_per_tok=int(get("expert_used_count")),
        n_shared_experts=1,
        moe_intermediate_size=int(get("expert_feed_forward_length")),
        num_hash_layers=int(get("hash_layer_count")),
        sliding_window=int(get("attention.sliding_window")),
        index_n_heads=int(get("attention.indexer.head_count")),
        index_head_dim=int(get("attention.indexer.key_length")),
        index_topk=int(get("attention.indexer.top_k")),
        hc_mult=int(get("hyper_connection.count")),
        hc_sinkhorn_iters=int(get("hyper_connection.sinkhorn_iterations")),
        hc_eps=float(get("hyper_connection.epsilon")),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(get("rope.freq_base")),
        compress_rope_theta=float(get("attention.compress_rope_freq_base")),
        rope_parameters={"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
                         "beta_fast": float(get("rope.scaling.yarn_beta_fast")),
                         "beta_slow": float(get("rope.scaling.yarn_beta_slow"))},
        max_position_embeddings=int(round(factor * orig)),
        routed_scaling_factor=float(get("expert_weights_scale")),
        swiglu_limit=clamp[0],
        compress_ratios=ratios,
        scoring_func="sqrtsoftplus",
        norm_topk_prob=True,
        tie_word_embeddings=False,
    )
    return kw


# ----------------------------------------------------------------------------------------
# GGUF tensor names -> HF state_dict names (model-spec §2.3, references §2)
# ----------------------------------------------------------------------------------------

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "output_hc_fn.weight": "model.hc_head.hc_fn",
    "output_hc_base.weight": "model.hc_head.hc_base",
    "output_hc_scale.weight": "model.hc_head.hc_scale",
}

_LAYER = {
    "hc_attn_fn.weight": "attn_hc.fn",
    "hc_attn_scale.weight": "attn_hc.scale",
    "hc_attn_base.weight": "attn_hc.base",
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_norm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv.weight": "self_attn.kv_proj.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_norm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "attn_output_a.weight": "self_attn.o_a_proj.weight",
    "attn_output_b.weight": "self_attn.o_b_proj.weight",
    "attn_compressor_ape.weight": "self_attn.compressor.position_bias",
    "attn_compressor_kv.weight": "self_attn.compressor.kv_proj.weight",
    "attn_compressor_gate.weight": "self_attn.compressor.gate_proj.weight",
    "attn_compressor_norm.weight": "self_attn.compressor.kv_norm.weight",
    "indexer.attn_q_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "indexer.proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "indexer_compressor_ape.weight": "self_attn.compressor.indexer.position_bias",
    "indexer_compressor_kv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "indexer_compressor_gate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "indexer_compressor_norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "hc_ffn_fn.weight": "ffn_hc.fn",
    "hc_ffn_scale.weight": "ffn_hc.scale",
    "hc_ffn_base.weight": "ffn_hc.base",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_tid2eid.weight": "mlp.gate.tid2eid",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    # ffn_gate_exps + ffn_up_exps -> mlp.experts.gate_up_proj (concatenated, below)
}


def map_tensors(tensors, n_layer):
    """{hf name: numpy array (torch shape)} and the set of GGUF names used."""
    out, used = {}, set()
    for g, h in _GLOBAL.items():
        if g in tensors:
            out[h] = tensors[g][2]
            used.add(g)
    for il in range(n_layer):
        p, hp = f"blk.{il}.", f"model.layers.{il}."
        for g, h in _LAYER.items():
            if p + g in tensors:
                a = tensors[p + g][2]
                if g == "ffn_gate_tid2eid.weight":
                    a = a.astype(np.int64)  # GGUF I32 [n_used, vocab] ne = torch [vocab, n_used]
                out[hp + h] = a
                used.add(p + g)
        ge, ue = p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"
        if ge in tensors or ue in tensors:
            if ge not in tensors or ue not in tensors:
                raise GGUFError(f"layer {il}: ffn_gate_exps and ffn_up_exps must both be present")
            # [E, I, D] each -> [E, 2I, D]; HF chunks gate first, up second.
            out[hp + "mlp.experts.gate_up_proj"] = np.concatenate([tensors[ge][2], tensors[ue][2]], axis=1)
            used.update([ge, ue])
    unused = sorted(set(tensors) - used)
    return out, unused


# ----------------------------------------------------------------------------------------
# Comparison (numpy only)
# ----------------------------------------------------------------------------------------

def load_logits(path, n_vocab, n_tokens=None):
    a = np.fromfile(path, dtype="<f4")
    if a.size % n_vocab:
        raise SystemExit(f"{path}: {a.size} floats is not a multiple of n_vocab {n_vocab}")
    a = a.reshape(-1, n_vocab)
    if n_tokens is not None and a.shape[0] != n_tokens:
        raise SystemExit(f"{path}: {a.shape[0]} rows, expected {n_tokens}")
    return a


def compare(ref, ours, tol=1e-4):
    """Max abs diff over positions x vocab, argmax agreement, first position over tol."""
    ref = np.asarray(ref, dtype=np.float64)
    ours = np.asarray(ours, dtype=np.float64)
    if ref.shape != ours.shape:
        raise SystemExit(f"shape mismatch {ref.shape} vs {ours.shape}")
    d = np.abs(ref - ours)
    per_pos = d.max(axis=1)
    am_r, am_o = ref.argmax(axis=1), ours.argmax(axis=1)
    agree = am_r == am_o
    over = np.nonzero(per_pos > tol)[0]
    res = {
        "n_tokens": int(ref.shape[0]),
        "n_vocab": int(ref.shape[1]),
        "max_abs_diff": float(d.max()),
        "max_abs_diff_pos": int(per_pos.argmax()),
        "mean_abs_diff": float(d.mean()),
        "ref_logit_std": float(ref.std()),
        "argmax_agree": int(agree.sum()),
        "argmax_first_disagree": int(np.nonzero(~agree)[0][0]) if (~agree).any() else None,
        "tol": tol,
        "first_pos_over_tol": int(over[0]) if over.size else None,
        "n_pos_over_tol": int(over.size),
    }
    if over.size:
        p = int(over[0])
        res["max_abs_diff_before_first_over"] = float(per_pos[:p].max()) if p else 0.0
        res["per_pos_diff_around_first_over"] = {int(i): float(per_pos[i]) for i in range(max(0, p - 2), min(len(per_pos), p + 6))}
    return res


def fmt_cmp(label, r):
    s = (f"{label}: max|d|={r['max_abs_diff']:.3e} (pos {r['max_abs_diff_pos']}), argmax {r['argmax_agree']}/"
         f"{r['n_tokens']}, first pos > {r['tol']:g}: {r['first_pos_over_tol']}")
    if r["first_pos_over_tol"] is not None:
        s += f" ({r['n_pos_over_tol']} positions over; max before it {r['max_abs_diff_before_first_over']:.2e})"
    return s


# ----------------------------------------------------------------------------------------
# HF model
# ----------------------------------------------------------------------------------------

def build_config(meta, experts_eager=True):
    from transformers import DeepseekV4Config
    kw = config_kwargs(meta)
    cfg = DeepseekV4Config(**copy.deepcopy(kw))  # HF edits the dicts it is given
    if experts_eager:
        cfg._experts_implementation = "eager"  # the grouped_mm backend rejects float64
    want_types = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    got = list(cfg.layer_types)
    if got != [want_types[r] for r in kw["compress_ratios"]]:
        raise GGUFError(f"config layer_types {got} do not follow compress_ratios {kw['compress_ratios']}")
    n_hash = kw["num_hash_layers"]
    want_mlp = ["hash_moe"] * min(n_hash, kw["num_hidden_layers"]) + ["moe"] * max(0, kw["num_hidden_layers"] - n_hash)
    if list(cfg.mlp_layer_types) != want_mlp:
        raise GGUFError(f"config mlp_layer_types {cfg.mlp_layer_types} != {want_mlp}")
    if cfg.compress_rates != {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}:
        raise GGUFError(f"unexpected compress_rates {cfg.compress_rates}")
    if cfg.qk_rope_head_dim != kw["qk_rope_head_dim"]:
        raise GGUFError(f"qk_rope_head_dim {cfg.qk_rope_head_dim} != {kw['qk_rope_head_dim']}")
    return cfg, kw


def state_dict_for(model, mapped, torch, dtype):
    """Strictly assigns every HF state_dict entry from `mapped`; returns (state dict, defaulted names)."""
    sd = model.state_dict()
    new, missing, defaulted, shape_err = {}, [], [], []
    for k, v in sd.items():
        if k in mapped:
            a = mapped[k]
            if tuple(a.shape) != tuple(v.shape):
                shape_err.append(f"{k}: GGUF gives {tuple(a.shape)}, HF wants {tuple(v.shape)}")
                continue
            t = torch.from_numpy(np.array(a))  # a writable copy (the GGUF buffer is read-only)
            new[k] = t if not t.is_floating_point() else t.to(dtype)
        elif k.endswith("mlp.gate.e_score_correction_bias"):
            # exp_probs_b is optional in the GGUF: no selection bias = zeros.
            new[k] = torch.zeros(v.shape, dtype=dtype)
            defaulted.append(k)
        else:
            missing.append(k)
    extra = sorted(set(mapped) - set(sd))
    errs = []
    if shape_err:
        errs.append("shape mismatches:\n  " + "\n  ".join(shape_err))
    if missing:
        errs.append("HF entries with no GGUF tensor:\n  " + "\n  ".join(missing))
    if extra:
        errs.append("mapped GGUF tensors with no HF entry:\n  " + "\n  ".join(extra))
    if errs:
        raise GGUFError("\n".join(errs))
    return new, defaulted


def yarn_inv_freq64(dim, base, factor, orig, beta_fast, beta_slow):
    """dsv4 / official formula (model-spec §5.4) in float64."""
    i = np.arange(dim // 2, dtype=np.float64)
    extrap = 1.0 / base ** (2 * i / dim)

    def corr(beta):
        return dim * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), dim - 1)
    ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
    return extrap / factor * (1 - ramp) + extrap * ramp


def rope_check_and_promote(model, kw, torch, promote):
    """Compares HF's inverse frequencies with the float64 formula; with promote, installs the latter."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
    dim = kw["qk_rope_head_dim"]
    rp = kw["rope_parameters"]
    ref = {
        "main": 1.0 / kw["rope_theta"] ** (2 * np.arange(dim // 2, dtype=np.float64) / dim),
        "compress": yarn_inv_freq64(dim, kw["compress_rope_theta"], rp["factor"],
                                    rp["original_max_position_embeddings"], rp["beta_fast"], rp["beta_slow"]),
    }
    report = {}
    n = 0
    for name, mod in model.named_modules():
        if not isinstance(mod, M.DeepseekV4RotaryEmbedding):
            continue
        n += 1
        for lt in mod.layer_types:
            buf = getattr(mod, f"{lt}_inv_freq")
            hf = buf.detach().double().cpu().numpy()
            r = ref[lt]
            rel = float(np.max(np.abs(hf - r) / r)) if hf.shape == r.shape else float("inf")
            report[f"{lt}_max_rel_err"] = max(report.get(f"{lt}_max_rel_err", 0.0), rel)
            scale = float(getattr(mod, f"{lt}_attention_scaling"))
            if scale != 1.0:
                report[f"{lt}_attention_scaling"] = scale
            if promote:
                if rel > 1e-6 or scale != 1.0:
                    raise GGUFError(f"{name}: HF {lt} RoPE differs from the formula (rel {rel:.2e}, scaling "
                                    f"{scale}); not promoting")
                t = torch.tensor(r, dtype=torch.float64, device=buf.device)
                setattr(mod, f"{lt}_inv_freq", t)
                setattr(mod, f"{lt}_original_inv_freq", t.clone())
    report["modules"] = n
    return report


class Promote64:
    """While active, float32 requests inside HF's forward (x.float(), x.to(torch.float32),
    softmax(dtype=torch.float32)) give float64 instead."""

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        torch = self.torch
        T = torch.Tensor
        self.saved = (T.float, T.to, T.softmax, torch.softmax, torch.nn.functional.softmax)
        f32, f64 = torch.float32, torch.float64
        o_to, o_sm, o_tsm, o_fsm = self.saved[1], self.saved[2], self.saved[3], self.saved[4]

        def _float(t, *a, **k):
            return o_to(t, f64)

        def _to(t, *a, **k):
            a = tuple(f64 if x is f32 else x for x in a)
            if k.get("dtype") is f32:
                k["dtype"] = f64
            return o_to(t, *a, **k)

        def _sm(fn):
            def w(*a, **k):
                if k.get("dtype") is f32:
                    k["dtype"] = f64
                a = tuple(f64 if x is f32 else x for x in a)
                return fn(*a, **k)
            return w

        T.float, T.to, T.softmax = _float, _to, _sm(o_sm)
        torch.softmax, torch.nn.functional.softmax = _sm(o_tsm), _sm(o_fsm)
        return self

    def __exit__(self, *exc):
        torch = self.torch
        T = torch.Tensor
        T.float, T.to, T.softmax, torch.softmax, torch.nn.functional.softmax = self.saved
        return False


def install_margin_hooks(model, cfg, torch):
    """Records, per layer, the selection margin (k-th minus (k+1)-th score) of the indexer
    top-k (only where more rows are visible than top_k) and of the expert top-k (score+bias)."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
    rec = {"indexer": [], "router": []}
    hooks = []
    ratio = cfg.compress_rates["compressed_sparse_attention"]
    k_idx = cfg.index_topk

    def layer_of(name):
        parts = name.split(".")
        return int(parts[parts.index("layers") + 1])

    Scorer = getattr(M, "DeepseekV4IndexerScorer", None)
    Router = getattr(M, "DeepseekV4TopKRouter", None)
    if Scorer is None or Router is None:
        print("note: DeepseekV4IndexerScorer/TopKRouter not found; no selection margins", flush=True)
    for name, mod in model.named_modules():
        if Scorer is not None and isinstance(mod, Scorer):
            il = layer_of(name)

            def hook(m, inp, out, il=il):
                s = out[0].double()  # [S, T]
                S, T = s.shape
                pos = torch.arange(S, device=s.device)
                vis = (pos + 1) // ratio
                mask = torch.arange(T, device=s.device)[None, :] >= vis[:, None]
                s = s.masked_fill(mask, float("-inf"))
                sel = vis > k_idx
                if not bool(sel.any()) or T <= k_idx:
                    return
                top = torch.topk(s, k_idx + 1, dim=-1).values
                margin = (top[:, k_idx - 1] - top[:, k_idx])
                margin = torch.where(sel, margin, torch.full_like(margin, float("inf")))
                rec["indexer"].append((il, margin.cpu().numpy(), top[:, k_idx - 1].abs().cpu().numpy()))
            hooks.append(mod.register_forward_hook(hook))
        elif Router is not None and isinstance(mod, Router):
            il = layer_of(name)

            def hook(m, inp, out, il=il):
                logits = out[0].double()
                s = m.score_fn(logits) + m.e_score_correction_bias.double()
                k = m.top_k
                if s.shape[-1] <= k:
                    return
                top = torch.topk(s, k + 1, dim=-1).values
                margin = top[:, k - 1] - top[:, k]
                rec["router"].append((il, margin.cpu().numpy(), top[:, k - 1].abs().cpu().numpy()))
            hooks.append(mod.register_forward_hook(hook))
    return rec, hooks


def summarize_margins(rec, near=1e-5):
    out = {}
    for kind, items in rec.items():
        rows = []
        for il, m, mag in items:
            finite = np.isfinite(m)
            if not finite.any():
                continue
            mm = np.where(finite, m, np.inf)
            p = int(mm.argmin())
            close = np.nonzero(mm < near)[0]
            rows.append({"layer": il, "min_margin": float(mm[p]), "at_pos": p, "score_there": float(mag[p]),
                         "n_near_ties": int(close.size), "near_tie_positions": [int(x) for x in close[:20]]})
        out[kind] = rows
    return out


def first_near_tie(margins):
    best = None
    for kind, rows in margins.items():
        for r in rows:
            for p in r["near_tie_positions"]:
                if best is None or p < best[0]:
                    best = (p, kind, r["layer"])
    return best


def run_model(meta, tensors, ids, dtype_name, device, torch, want_margins):
    from transformers import DeepseekV4ForCausalLM
    cfg, kw = build_config(meta)
    mapped, unused = map_tensors(tensors, kw["num_hidden_layers"])
    if unused:
        raise GGUFError("GGUF tensors that map to nothing in HF: " + ", ".join(unused))
    dtype = torch.float32 if dtype_name == "fp32" else torch.float64
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(cfg).to(dtype)
    sd, defaulted = state_dict_for(model, mapped, torch, dtype)
    model.load_state_dict(sd, strict=True)
    model = model.to(device).eval()
    # Paranoia: every entry now equals the GGUF value.
    for k, v in model.state_dict().items():
        if k in mapped:
            a = mapped[k]
            got = v.detach().cpu().numpy()
            if not np.array_equal(got.astype(a.dtype) if got.dtype != a.dtype else got, a):
                raise GGUFError(f"{k}: value after load differs from the GGUF")
    rope = rope_check_and_promote(model, kw, torch, promote=(dtype_name == "fp64-strict"))
    rec, hooks = install_margin_hooks(model, cfg, torch) if want_margins else ({}, [])
    x = torch.tensor([ids], dtype=torch.long, device=device)
    t0 = time.time()
    with torch.no_grad():
        if dtype_name == "fp64-strict":
            with Promote64(torch):
                out = model(input_ids=x, use_cache=False)
        else:
            out = model(input_ids=x, use_cache=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dt = time.time() - t0
    for h in hooks:
        h.remove()
    logits = out.logits[0].detach().double().cpu().numpy()
    info = {"dtype": dtype_name, "forward_s": round(dt, 3), "logits_dtype": str(out.logits.dtype),
            "defaulted_entries": defaulted, "rope_inv_freq_max_rel_err_vs_formula": rope,
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            "experts_implementation": getattr(cfg, "_experts_implementation", None)}
    if want_margins:
        info["margins"] = summarize_margins(rec)
    return logits, info, cfg, kw


def read_tokens(path):
    with open(path) as f:
        txt = f.read().replace("\n", ",")
    return [int(t) for t in txt.split(",") if t.strip()]


def cmd_keys(args):
    import torch
    from transformers import DeepseekV4ForCausalLM
    meta, tensors = read_gguf(args.gguf)
    cfg, kw = build_config(meta)
    print("config kwargs:", json.dumps(kw))
    print("layer_types:", cfg.layer_types, "mlp_layer_types:", cfg.mlp_layer_types)
    print("rope_parameters:", cfg.rope_parameters)
    model = DeepseekV4ForCausalLM(cfg)
    mapped, unused = map_tensors(tensors, kw["num_hidden_layers"])
    sd = model.state_dict()
    for k, v in sd.items():
        src = "GGUF" if k in mapped else "-- UNMAPPED --"
        shp = tuple(mapped[k].shape) if k in mapped else None
        ok = "" if shp is None or shp == tuple(v.shape) else f"  SHAPE MISMATCH (GGUF {shp})"
        print(f"{k:70s} {str(tuple(v.shape)):22s} {str(v.dtype):14s} {src}{ok}")
    print("GGUF tensors mapped to nothing:", unused)
    print("mapped names not in HF:", sorted(set(mapped) - set(sd)))


def cmd_run(args):
    import torch
    import transformers
    meta, tensors = read_gguf(args.gguf)
    ids = read_tokens(args.tokens)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    n_vocab = config_kwargs(meta)["vocab_size"]
    ours = load_logits(args.ours, n_vocab, len(ids)) if args.ours else None
    summary = {"gguf": os.path.basename(args.gguf), "n_tokens": len(ids), "n_vocab": n_vocab,
               "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
               "torch": torch.__version__, "transformers": transformers.__version__,
               "config": config_kwargs(meta), "runs": {}}
    results = {}
    for dn in args.dtypes.split(","):
        try:
            logits, info, cfg, kw = run_model(meta, tensors, ids, dn, device, torch,
                                              want_margins=dn.startswith("fp64"))
        except Exception as e:  # report and go on with the other precisions
            import traceback
            traceback.print_exc()
            summary["runs"][dn] = {"error": f"{type(e).__name__}: {e}"}
            print(f"[{os.path.basename(args.gguf)}] {dn}: ERROR {type(e).__name__}: {e}", flush=True)
            continue
        results[dn] = logits
        if args.out_prefix:
            logits.astype("<f4").tofile(f"{args.out_prefix}.{dn}.bin")
        if ours is not None:
            info["vs_ours"] = compare(logits, ours, args.tol)
            print(f"[{os.path.basename(args.gguf)}] " + fmt_cmp(f"dsv4 vs HF {dn}", info["vs_ours"]), flush=True)
            fo = info["vs_ours"]["first_pos_over_tol"]
            if fo is not None and "margins" in info:
                t = first_near_tie(info["margins"])
                info["first_near_tie"] = t
                print(f"    first near-tie (margin < 1e-5) in HF {dn}: {t} (pos, kind, layer)", flush=True)
        if "margins" in info:
            for kind, rows in info["margins"].items():
                for r in rows:
                    print(f"    {dn} {kind} layer {r['layer']}: min margin {r['min_margin']:.3e} at pos "
                          f"{r['at_pos']} (|score| {r['score_there']:.3g}), near ties {r['n_near_ties']}",
                          flush=True)
        summary["runs"][dn] = info
    names = list(results)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            r = compare(results[names[i]], results[names[j]], args.tol)
            summary.setdefault("hf_vs_hf", {})[f"{names[i]}_vs_{names[j]}"] = r
            print(f"[{os.path.basename(args.gguf)}] " + fmt_cmp(f"HF {names[i]} vs HF {names[j]}", r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if all("error" not in v for v in summary["runs"].values()) else 1


def cmd_compare(args):
    a = load_logits(args.ref, args.vocab)
    b = load_logits(args.ours, args.vocab)
    r = compare(a, b, args.tol)
    print(fmt_cmp(f"{args.ours} vs {args.ref}", r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0 if r["first_pos_over_tol"] is None and r["argmax_agree"] == r["n_tokens"] else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keys", help="print HF state_dict keys/shapes and the GGUF mapping")
    k.add_argument("gguf")
    r = sub.add_parser("run", help="HF logits for a token list")
    r.add_argument("--gguf", required=True)
    r.add_argument("--tokens", required=True, help="file of comma- or newline-separated token ids")
    r.add_argument("--dtypes", default="fp64,fp32,fp64-strict")
    r.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    r.add_argument("--ours", help="dsv4 logits to compare with (float32 [n_tokens][n_vocab])")
    r.add_argument("--out-prefix", help="write HF logits to PREFIX.<dtype>.bin (float32 [n][vocab])")
    r.add_argument("--json", help="write a JSON summary here")
    r.add_argument("--tol", type=float, default=1e-4)
    c = sub.add_parser("compare", help="compare two float32 logit files")
    c.add_argument("--ref", required=True)
    c.add_argument("--ours", required=True)
    c.add_argument("--vocab", type=int, required=True)
    c.add_argument("--tol", type=float, default=1e-4)
    c.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        return {"keys": cmd_keys, "run": cmd_run, "compare": cmd_compare}[args.cmd](args)
    except GGUFError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
