#!/usr/bin/env python3
"""Whole-model logits fixtures for tests/model_parity_test.cc (issue 10).

Builds tiny DeepSeek-V3 and DeepSeek-V2 models with transformers (CPU torch), random
weights from a fixed seed, saves them with save_pretrained in a 16-bit dtype, and
writes the logits transformers computes for a fixed token sequence:

  tests/data/model_parity/<name>/config.json, model.safetensors   (save_pretrained)
  tests/data/model_parity/<name>/expected.safetensors
      tokens       [T] i32
      logits_f32   [T, vocab] f32  transformers in float32 (weights = the saved 16-bit values)
      logits_f64   [T, vocab] f64  the same model in float64 (the yardstick for the tolerance):
                                   transformers forces float32 in the RoPE angles and cos/sin,
                                   the RMSNorm upcast, the eager softmax and V2's complex
                                   rotation; for this run only those are float64 (the helpers
                                   of tools/make_hf_parity_fixtures.py, sdpa attention). The
                                   router stays float32 in both runs (it is in mlakv too).
      kv_max_abs   [layers] f64    max |kv_a_layernorm output| per layer (float64 run)

Models (each: one dense layer then one MoE layer, kv_lora_rank 512 and rope 64 so the
paged cache formats apply, YaRN rope):
  v3_moe  deepseek_v3, q_lora_rank 16, 8 routed experts in 4 groups (topk_group 2,
          top-3, norm_topk_prob, routed_scaling_factor 2.5), 1 shared expert, random
          e_score_correction_bias, untied lm_head, saved in bf16
  v2_moe  deepseek_v2, plain q_proj, 8 experts, group_limited_greedy (4 groups, keep 2,
          top-2), routed_scaling_factor 1.5, 2 shared experts, tied embeddings, YaRN with
          mscale_all_dim 0.707, saved in f16

Requires torch and transformers (checked with torch 2.11 CPU, transformers 5.17):
  python3 tools/make_model_parity_fixtures.py [--out tests/data/model_parity]
"""
import argparse
import json
import os
import shutil
import sys
import types

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The float64 helpers of the MLA layer fixtures (same conventions): YaRN inverse
# frequencies in float64, RMSNorm without the float32 upcast, V2's complex rotation
# without `.float()`.
from make_hf_parity_fixtures import complex_rope_f64, inv_freq_f64, rms_norm_f64  # noqa: E402

SEED = 1234
TOKENS = [3, 17, 42, 5, 88, 1, 64, 29, 77, 10, 3, 51]


def randomize(model, seed):
    """Weights ~ N(0, 0.1) (matrices), norms 1 + N(0, 0.1), router bias N(0, 0.05): larger
    than the default init so attention and routing are far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.05)


def capture_kv_max(model):
    maxes = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(_m, _inp, out, i=i):
            maxes[i] = max(maxes.get(i, 0.0), out.abs().max().item())
        hooks.append(layer.self_attn.kv_a_layernorm.register_forward_hook(hook))
    return maxes, hooks


def build(name, cfg, dtype, out_dir):
    cls = cfg.pop("_class")
    torch.manual_seed(SEED)
    config = transformers.AutoConfig.for_model(**cfg)
    # The eager per-expert loop (the reference semantics of the *Experts modules); the
    # grouped_mm kernel transformers picks by default has no float64 path.
    config._experts_implementation = "eager"
    model = getattr(transformers, cls)(config)
    model.eval()
    randomize(model, SEED)
    model = model.to(dtype)  # the checkpoint's values: every weight rounded to 16 bits once
    d = os.path.join(out_dir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    model.save_pretrained(d)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        # Reloaded from the saved directory as a user would (model.to(16-bit) above also
        # rounded the rotary inv_freq buffer; from_pretrained recomputes it in float32).
        m32 = getattr(transformers, cls).from_pretrained(d, dtype=torch.float32, experts_implementation="eager")
        m32.eval()
        logits32 = m32(input_ids=ids).logits[0].contiguous()
        m64 = m32.to(torch.float64)
        m64.config._attn_implementation = "sdpa"
        for mod in m64.modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.forward = types.MethodType(rms_norm_f64, mod)
        rot = m64.model.rotary_emb
        af = float(rot.attention_scaling)
        inv64 = torch.tensor(inv_freq_f64(m64.config.rope_parameters, m64.config.qk_rope_head_dim),
                             dtype=torch.float64)
        rel = ((rot.inv_freq.double() - inv64).abs() / inv64).max().item()
        assert rel < 2e-6, f"{name}: float64 inv_freq disagrees with transformers' by {rel:.3g}"
        v2 = m64.config.model_type == "deepseek_v2"

        def rope64(_self, x, position_ids):
            ang = position_ids[0].double()[:, None] * inv64[None, :]
            if v2:
                return (torch.polar(torch.ones_like(ang), ang) * af)[None]
            emb = torch.cat((ang, ang), dim=-1)
            return (emb.cos() * af)[None], (emb.sin() * af)[None]

        rot.forward = types.MethodType(rope64, rot)
        v2mod = sys.modules[type(m64).__module__]
        saved = getattr(v2mod, "apply_rotary_emb", None)
        if v2:
            v2mod.apply_rotary_emb = complex_rope_f64
        maxes, hooks = capture_kv_max(m64)
        try:
            logits64 = m64(input_ids=ids).logits[0].contiguous()
        finally:
            if v2:
                v2mod.apply_rotary_emb = saved
        for h in hooks:
            h.remove()
    kv = torch.tensor([maxes[i] for i in range(len(maxes))], dtype=torch.float64)
    save_file({"tokens": torch.tensor(TOKENS, dtype=torch.int32), "logits_f32": logits32.float(),
               "logits_f64": logits64, "kv_max_abs": kv}, os.path.join(d, "expected.safetensors"))
    err = (logits32.double() - logits64).abs().max().item()
    print(f"{name}: |hf32 - hf64| = {err:.3e}, max|logit| = {logits64.abs().max().item():.3f}, "
          f"files {sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))} B")


def routing_cases(out_dir):
    """routing.json: transformers' own routers on logits drawn from a coarse grid (so
    ties are frequent), for tests/model_moe_test.cc. The router weight is the identity
    (hidden = E), so router_logits = x exactly."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    g = torch.Generator().manual_seed(SEED + 1)
    setups = [
        ("v3", dict(model_type="deepseek_v3", n_routed_experts=16, num_local_experts=16, hidden_size=16,
                    n_group=4, topk_group=2, num_experts_per_tok=4, norm_topk_prob=True,
                    routed_scaling_factor=2.5)),
        ("v3_flat", dict(model_type="deepseek_v3", n_routed_experts=64, num_local_experts=64, hidden_size=64,
                         n_group=1, topk_group=1, num_experts_per_tok=1, norm_topk_prob=False,
                         routed_scaling_factor=1.0)),
        ("v2_group", dict(model_type="deepseek_v2", n_routed_experts=16, num_experts=16, hidden_size=16,
                          n_group=4, topk_group=2, num_experts_per_tok=3, topk_method="group_limited_greedy",
                          routed_scaling_factor=1.5)),
        ("v2_greedy", dict(model_type="deepseek_v2", n_routed_experts=16, num_experts=16, hidden_size=16,
                           n_group=1, topk_group=1, num_experts_per_tok=6, topk_method="greedy",
                           routed_scaling_factor=1.0)),
    ]
    cases = []
    for name, kw in setups:
        kw = dict(kw, num_attention_heads=1, num_key_value_heads=1)
        cfg = transformers.AutoConfig.for_model(**kw)
        router = (DeepseekV3TopkRouter if kw["model_type"] == "deepseek_v3" else DeepseekV2TopkRouter)(cfg)
        E = kw["n_routed_experts"]
        with torch.no_grad():
            router.weight.copy_(torch.eye(E))
            if hasattr(router, "e_score_correction_bias"):
                router.e_score_correction_bias.copy_(torch.randint(-2, 3, (E,), generator=g).float() / 8)
        x = torch.randint(-4, 5, (24, E), generator=g).float() / 4
        x[0] = 0.0  # every expert tied
        with torch.no_grad():
            _, w, idx = router(x)
        cases.append(dict(name=name, config={k: v for k, v in kw.items() if k not in ("num_local_experts", "num_experts", "hidden_size", "num_attention_heads", "num_key_value_heads")},
                          bias=router.e_score_correction_bias.tolist() if hasattr(router, "e_score_correction_bias") else [],
                          logits=x.tolist(), experts=idx.tolist(), weights=w.tolist()))
    with open(os.path.join(out_dir, "routing.json"), "w") as f:
        json.dump(cases, f)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "model_parity"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    common = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=512,
                  qk_nope_head_dim=16, qk_rope_head_dim=64, v_head_dim=16, first_k_dense_replace=1,
                  max_position_embeddings=256, rms_norm_eps=1e-6, attention_dropout=0.0)
    build("v3_moe", dict(common, _class="DeepseekV3ForCausalLM", model_type="deepseek_v3", q_lora_rank=16,
                         n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, n_shared_experts=1,
                         norm_topk_prob=True, routed_scaling_factor=2.5, tie_word_embeddings=False,
                         rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                              original_max_position_embeddings=64, mscale=1.0,
                                              mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0)),
          torch.bfloat16, args.out)
    build("v2_moe", dict(common, _class="DeepseekV2ForCausalLM", model_type="deepseek_v2", q_lora_rank=None,
                         n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, n_shared_experts=2,
                         topk_method="group_limited_greedy", routed_scaling_factor=1.5, tie_word_embeddings=True,
                         rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                              original_max_position_embeddings=64, mscale=0.707,
                                              mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0)),
          torch.float16, args.out)
    routing_cases(args.out)
    manifest = {"generator": "tools/make_model_parity_fixtures.py", "seed": SEED, "tokens": TOKENS,
                "torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
