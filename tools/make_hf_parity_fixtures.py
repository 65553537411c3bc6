#!/usr/bin/env python3
"""Builds the Hugging Face parity fixtures for mlakv's MLA attention layer.

For each geometry below this script writes tests/data/hf_parity/<name>/:

  config.json        a published-style config (legacy `rope_scaling` or transformers-5
                     `rope_parameters`), read back by transformers itself to build the layer
  model.safetensors  that one layer's attention weights under their real names
                     (model.layers.<i>.self_attn.q_a_proj.weight, ...), in the geometry's
                     checkpoint encoding: bf16, f16, DeepSeek fp8 block or ModelOpt NVFP4
  io.safetensors     hidden_states [N, D] f32 (the attention input, i.e. after
                     input_layernorm), positions [N] i64, and the references:
                       output      [N, D] f32  transformers' attention module in float32,
                                               eager attention, its own rotary embedding
                       output_f64  [N, D] f64  the same module and weights in float64 (see below)
                       inv_freq    [R/2] f32   the rotary module's inverse frequencies
                       attention_scaling [1] f64  its cos/sin multiplier
                       softmax_scale     [1] f64  the attention module's `scaling`

The references cover all N tokens in one causal pass; mlakv's tests feed the same
tokens as prefill chunks followed by single-token decode steps on one cache, which
is the same computation.

The float64 reference exists to derive tolerances: |output - output_f64| is what
transformers' own float32 arithmetic costs. transformers forces float32 in three
places even for a float64 module; for the float64 run only, they are replaced by the
same expressions in float64: the RMSNorm upcast (DeepseekV3RMSNorm & co. compute in
float32), the eager softmax (dtype=float32; the float64 run uses transformers' sdpa
attention instead) and DeepSeek-V2's complex rotation (`xq.float()`). Its cos/sin come
from the inverse frequencies evaluated in float64 by `inv_freq_f64` below (the formula
of `_compute_yarn_parameters` / the default rope init), checked against the module's
float32 ones.

Weights are random (fixed seeds), drawn so that activations stay O(1), and rounded to
the checkpoint encoding first: transformers runs on exactly the values mlakv dequantizes.

Run (CPU is enough; the project ran it on the GPU machine, which has torch 2.11 and
transformers 5.17):
    python3 tools/make_hf_parity_fixtures.py --out tests/data/hf_parity
"""

import argparse
import copy
import json
import math
import os
import sys
import traceback
import types

import torch
from safetensors.torch import save_file

L = 512  # kv_lora_rank: the compressed KV formats are defined for 512 + 64
R = 64   # qk_rope_head_dim

# name -> geometry. `enc` is the checkpoint encoding of every projection.
GEOMETRIES = {
    # DeepSeek-V3 / R1 style: q LoRA, YaRN factor 40 (mscale = mscale_all_dim = 1), pairwise
    # RoPE, DeepSeek fp8 block weights (weight + weight_scale_inv, 128 x 128 blocks).
    "deepseek_v3": dict(
        model_type="deepseek_v3", layer=0, D=64, H=4, q_lora=32, P=32, V=32, enc="fp8_block", seed=1,
        positions=list(range(0, 12)),
        config=dict(rope_theta=10000.0, max_position_embeddings=163840,
                    rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=4096,
                                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
                    quantization_config=dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                                             weight_block_size=[128, 128]))),
    # DeepSeek-V2-Lite style: no q LoRA (plain q_proj), YaRN mscale 0.707, complex-pair RoPE, bf16.
    "deepseek_v2_lite": dict(
        model_type="deepseek_v2", layer=0, D=32, H=2, q_lora=None, P=16, V=16, enc="bf16", seed=2,
        positions=list(range(100, 110)),
        config=dict(rope_theta=10000.0, max_position_embeddings=163840,
                    rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=4096,
                                      beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707))),
    # GLM-4.7-Flash style: P = 192, V = 256, theta 1e6 without scaling (transformers-5
    # rope_parameters), rms_norm_eps 1e-5, ModelOpt NVFP4 weights. kv_a_layernorm's weight is
    # small, so kv_c_normed peaks near 0.02 like GLM-5.2's shallow layers: uncalibrated NVFP4
    # group scales fall into e4m3 subnormals there, which calibration fixes.
    "glm4_moe_lite": dict(
        model_type="glm4_moe_lite", layer=0, D=32, H=2, q_lora=16, P=192, V=256, enc="nvfp4", seed=3,
        positions=list(range(0, 12)), kv_norm_scale=0.004,
        config=dict(rms_norm_eps=1e-5, max_position_embeddings=202752,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                    quantization_config=dict(quant_method="modelopt", quant_algo="NVFP4"))),
    # Kimi K2 style: theta 50000, YaRN factor 32 with beta_fast = beta_slow = 1, bf16; the
    # positions straddle original_max_position_embeddings. Layer 2 of 3.
    "kimi_k2": dict(
        model_type="kimi_k2", layer=2, D=32, H=2, q_lora=16, P=16, V=16, enc="bf16", seed=4,
        positions=list(range(4090, 4102)),
        config=dict(rope_theta=50000.0, max_position_embeddings=131072,
                    rope_scaling=dict(type="yarn", factor=32.0, original_max_position_embeddings=4096,
                                      beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))),
    # Coverage: half-split RoPE (rope_interleave false), attention biases, f16 weights, YaRN with
    # mscale != mscale_all_dim (cos/sin multiplier != 1), transformers-5 rope_parameters. Layer 1.
    "deepseek_v3_halfsplit": dict(
        model_type="deepseek_v3", layer=1, D=32, H=2, q_lora=16, P=16, V=16, enc="f16", seed=5, bias=True,
        positions=list(range(7, 18)),
        config=dict(max_position_embeddings=16384, rope_interleave=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=8.0,
                                         original_max_position_embeddings=2048, beta_fast=16.0, beta_slow=2.0,
                                         mscale=1.0, mscale_all_dim=0.5))),
}


def config_dict(name, g):
    c = dict(
        model_type=g["model_type"], hidden_size=g["D"], num_hidden_layers=g["layer"] + 1,
        num_attention_heads=g["H"], num_key_value_heads=g["H"], q_lora_rank=g["q_lora"], kv_lora_rank=L,
        qk_nope_head_dim=g["P"], qk_rope_head_dim=R, v_head_dim=g["V"], attention_bias=bool(g.get("bias")),
        rms_norm_eps=1e-6)
    if g["model_type"] in ("deepseek_v3", "kimi_k2"):
        c["num_nextn_predict_layers"] = 0
    c.update(g["config"])
    return c


def hf_classes(model_type):
    if model_type in ("deepseek_v3", "kimi_k2"):
        from transformers.models.deepseek_v3 import configuration_deepseek_v3 as cm, modeling_deepseek_v3 as mm
        return cm.DeepseekV3Config, mm.DeepseekV3Attention, mm.DeepseekV3RotaryEmbedding, mm
    if model_type == "deepseek_v2":
        from transformers.models.deepseek_v2 import configuration_deepseek_v2 as cm, modeling_deepseek_v2 as mm
        return cm.DeepseekV2Config, mm.DeepseekV2Attention, mm.DeepseekV2RotaryEmbedding, mm
    if model_type == "glm4_moe_lite":
        from transformers.models.glm4_moe_lite import configuration_glm4_moe_lite as cm
        from transformers.models.glm4_moe_lite import modeling_glm4_moe_lite as mm
        return cm.Glm4MoeLiteConfig, mm.Glm4MoeLiteAttention, mm.Glm4MoeLiteRotaryEmbedding, mm
    raise ValueError(model_type)


# ---- checkpoint encodings: returns (tensors to save under the prefix, dequantized f32 weight)

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def enc_fp8_block(w, bn=128, bk=128):
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    s = torch.empty(nb, kb, dtype=torch.float32)
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(nb):
        for j in range(kb):
            blk = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            sc = (blk.abs().max() / 448.0).to(torch.float32)
            s[i, j] = sc
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (blk / sc).clamp(-448, 448).to(torch.float8_e4m3fn)
    full = s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    deq = q.to(torch.float32) * full  # one f32 multiply, as mlakv's dequantize_weight
    return {"weight": q, "weight_scale_inv": s}, deq


def enc_nvfp4(w):
    n, k = w.shape
    assert k % 16 == 0
    g = w.reshape(n, k // 16, 16)
    s2 = 2.0 ** math.ceil(math.log2(float(w.abs().max()) / (6 * 448)))  # power of two: exact products
    sc = (g.abs().amax(-1) / 6 / s2).clamp(max=448).to(torch.float8_e4m3fn)
    scf = sc.to(torch.float32)
    x = g / torch.where(scf > 0, scf * s2, torch.ones_like(scf))[..., None]
    idx = (x.abs().clamp(max=6)[..., None] - E2M1).abs().argmin(-1)
    neg = (x < 0) & (idx > 0)
    code = (idx | (neg.long() << 3)).reshape(n, k)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    val = E2M1[idx] * torch.where(neg, -1.0, 1.0)
    deq = ((val * scf[..., None]) * s2).reshape(n, k).to(torch.float32)
    return {"weight": packed, "weight_scale": sc, "weight_scale_2": torch.tensor(s2, dtype=torch.float32)}, deq


def encode(w, enc):
    if enc == "fp8_block":
        return enc_fp8_block(w)
    if enc == "nvfp4":
        return enc_nvfp4(w)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[enc]
    q = w.to(dt)
    return {"weight": q}, q.to(torch.float32)


def small_dtype(enc):
    return {"f16": torch.float16, "f32": torch.float32}.get(enc, torch.bfloat16)


# ---- the float64 RoPE tables (see the module docstring)

def inv_freq_f64(rp, dim):
    base = float(rp["rope_theta"])
    pos_freqs = [base ** (2 * i / dim) for i in range(dim // 2)]
    t = rp.get("rope_type", "default")
    if t == "default":
        return [1.0 / p for p in pos_freqs]
    assert t == "yarn", t
    factor = float(rp["factor"])
    orig = rp["original_max_position_embeddings"]
    beta_fast = rp.get("beta_fast") or 32
    beta_slow = rp.get("beta_slow") or 1

    def corr_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if rp.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i, p in enumerate(pos_freqs):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrap = 1.0 - ramp
        out.append((1.0 / (factor * p)) * (1.0 - extrap) + (1.0 / p) * extrap)
    return out


def rms_norm_f64(self, x):  # RMSNorm without the float32 upcast, for the float64 run only
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def complex_rope_f64(xq, xk, freqs_cis):  # DeepSeek-V2's apply_rotary_emb without `.float()`
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2).contiguous())
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2).contiguous())
    f = freqs_cis.unsqueeze(1)
    return torch.view_as_real(xq_ * f).flatten(3), torch.view_as_real(xk_ * f).flatten(3)


def build(name, g, out_dir):
    torch.manual_seed(g["seed"])
    gen = torch.Generator().manual_seed(g["seed"])
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    cfg_json = config_dict(name, g)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
        f.write("\n")

    cfg_cls, attn_cls, rot_cls, mod = hf_classes(g["model_type"])
    config = cfg_cls.from_pretrained(d)  # transformers reads the very file mlakv reads
    config._attn_implementation = "eager"
    D, H, P, V, QL = g["D"], g["H"], g["P"], g["V"], g["q_lora"]
    layer = g["layer"]
    enc = g["enc"]
    sdt = small_dtype(enc)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(torch.float32) * std

    # Linear weights ~ N(0, 1/in_features): activations stay O(1).
    lin = {}
    if QL is None:
        lin["q_proj"] = randn(H * (P + R), D, std=D ** -0.5)
    else:
        lin["q_a_proj"] = randn(QL, D, std=D ** -0.5)
        lin["q_b_proj"] = randn(H * (P + R), QL, std=QL ** -0.5)
    lin["kv_a_proj_with_mqa"] = randn(L + R, D, std=D ** -0.5)
    lin["kv_b_proj"] = randn(H * (P + V), L, std=L ** -0.5)
    lin["o_proj"] = randn(D, H * V, std=(H * V) ** -0.5)

    prefix = f"model.layers.{layer}.self_attn."
    saved, state = {}, {}
    for lname, w in lin.items():
        tensors, deq = encode(w, enc)
        for k, t in tensors.items():
            saved[prefix + lname + "." + k] = t.contiguous()
        state[lname + ".weight"] = deq
    norms = {"kv_a_layernorm": (torch.rand(L, generator=gen) + 0.5) * g.get("kv_norm_scale", 1.0)}
    if QL is not None:
        norms["q_a_layernorm"] = torch.rand(QL, generator=gen) + 0.5
    for nname, w in norms.items():
        q = w.to(sdt)
        saved[prefix + nname + ".weight"] = q.contiguous()
        state[nname + ".weight"] = q.to(torch.float32)
    if g.get("bias"):
        for bname, n in (("q_a_proj", QL), ("kv_a_proj_with_mqa", L + R), ("o_proj", D)):
            q = randn(n, std=0.5).to(sdt)
            saved[prefix + bname + ".bias"] = q.contiguous()
            state[bname + ".bias"] = q.to(torch.float32)
    save_file(saved, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    attn = attn_cls(config, layer_idx=layer)
    attn.load_state_dict(state, strict=True)
    attn.eval()

    N = len(g["positions"])
    hidden = randn(1, N, D)
    pos = torch.tensor([g["positions"]], dtype=torch.int64)

    # float32: transformers' own path.
    rot = rot_cls(config)
    pe = rot(hidden, pos)
    mask = torch.full((N, N), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        if g["model_type"] == "deepseek_v2":
            out32 = attn(hidden_states=hidden, attention_mask=mask, position_embeddings=pe)[0]
        else:
            out32 = attn(hidden_states=hidden, position_embeddings=pe, attention_mask=mask)[0]

    # float64 (see the docstring).
    rp = config.rope_parameters
    inv64 = torch.tensor(inv_freq_f64(rp, R), dtype=torch.float64)
    inv_hf = rot.inv_freq.to(torch.float32)
    rel = ((inv_hf.double() - inv64).abs() / inv64).max().item()
    assert rel < 2e-6, f"{name}: float64 inv_freq disagrees with transformers' by {rel:.3g} (relative)"
    af = float(rot.attention_scaling)
    ang = pos[0].double()[:, None] * inv64[None, :]
    attn64 = copy.deepcopy(attn).double()
    attn64.config._attn_implementation = "sdpa"
    for nname in norms:
        m = getattr(attn64, nname)
        m.forward = types.MethodType(rms_norm_f64, m)
    with torch.no_grad():
        if g["model_type"] == "deepseek_v2":
            freqs_cis = (torch.polar(torch.ones_like(ang), ang) * af)[None]
            saved_fn = mod.apply_rotary_emb
            mod.apply_rotary_emb = complex_rope_f64
            try:
                out64 = attn64(hidden_states=hidden.double(), attention_mask=None, position_embeddings=freqs_cis)[0]
            finally:
                mod.apply_rotary_emb = saved_fn
        else:
            emb = torch.cat((ang, ang), dim=-1)
            pe64 = ((emb.cos() * af)[None], (emb.sin() * af)[None])
            out64 = attn64(hidden_states=hidden.double(), position_embeddings=pe64, attention_mask=None)[0]

    io = {
        "hidden_states": hidden[0].contiguous(),
        "positions": pos[0].contiguous(),
        "output": out32[0].to(torch.float32).contiguous(),
        "output_f64": out64[0].to(torch.float64).contiguous(),
        "inv_freq": inv_hf.contiguous(),
        "attention_scaling": torch.tensor([af], dtype=torch.float64),
        "softmax_scale": torch.tensor([float(attn.scaling)], dtype=torch.float64),
    }
    import transformers
    meta = {"generator": "tools/make_hf_parity_fixtures.py", "transformers": transformers.__version__,
            "torch": torch.__version__, "geometry": name, "layer": str(layer), "encoding": enc}
    save_file(io, os.path.join(d, "io.safetensors"), metadata=meta)

    e_ref = (out32[0].double() - out64[0]).abs().max().item()
    ref_max = out64[0].abs().max().item()
    return {"name": name, "tokens": N, "e_ref": e_ref, "ref_max_abs": ref_max, "inv_freq_rel": rel,
            "attention_scaling": af, "softmax_scale": float(attn.scaling),
            "bytes": sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (tests/data/hf_parity)")
    ap.add_argument("--only", default="", help="comma-separated geometry names")
    args = ap.parse_args()
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {sys.version.split()[0]}")
    torch.set_num_threads(4)
    os.makedirs(args.out, exist_ok=True)
    names = [n for n in GEOMETRIES if not args.only or n in args.only.split(",")]
    results, failed = [], []
    for name in names:
        try:
            r = build(name, GEOMETRIES[name], args.out)
            results.append(r)
            print(f"{name:24s} N={r['tokens']:3d}  |f32-f64| max {r['e_ref']:.3e}  max|out| {r['ref_max_abs']:.3e}  "
                  f"inv_freq rel {r['inv_freq_rel']:.2e}  af {r['attention_scaling']:.6f}  "
                  f"scale {r['softmax_scale']:.6f}  {r['bytes']} B")
        except Exception:
            failed.append(name)
            print(f"{name}: FAILED")
            traceback.print_exc()
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump({"results": results, "failed": failed}, f, indent=2, sort_keys=True)
        f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
