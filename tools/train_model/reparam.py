#!/usr/bin/env python3
"""Function-preserving reparametrization that gives a checkpoint GLM-5.2-like latent
magnitudes (issue 10, item 6).

For every layer l the cached latent is kv_c_normed = rmsnorm(c) * w_l (w_l =
self_attn.kv_a_layernorm.weight) and it only ever enters the model through
kv_b_proj (the attention key/value up-projection, whose input columns are the
kv_lora_rank latent dimensions). Scaling

    kv_a_layernorm.weight  *= a_l
    kv_b_proj.weight[:, j] /= a_l        for every latent column j

multiplies kv_c_normed by a_l and leaves kv_b_proj(kv_c_normed), hence the model's
function, unchanged. a_l is chosen from max |kv_c_normed| measured on calibration
text so that layer 0 lands at --lo and the last layer at --hi, geometrically spaced
between (GLM-5.2's max |kv_c_normed| spans about 0.02 to 5.2 over its layers,
shallow layers small: docs/reference.md section 4). A cache format with one
fixed scale for every layer then meets very different magnitudes per layer, which
is what calibration (nvfp4_ds_mla_outer_scale_v1) exists to fix.

The two rescaled tensors are written in float32 (the source's bf16 values times a_l
are not bf16-representable in general); every other tensor is copied unchanged. The
result is checked in transformers (float32): its logits must equal the source's to
within float32 rounding, bounded by the source's own float32-vs-float64 difference.

    python tools/train_model/reparam.py --model models/mlakv-ds3-tiny \
        --calib models/mlakv-ds3-tiny/calib.txt --out /tmp/mlakv-ds3-tiny-reparam \
        --json models/mlakv-ds3-tiny/reparam.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys


def latent_max_abs(model, windows):
    """max |kv_c_normed| per layer over the windows (the kv_a_layernorm output)."""
    import torch
    n = model.config.num_hidden_layers
    mx = [0.0] * n
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(mod, inp, out, i=i):
            mx[i] = max(mx[i], out.detach().abs().max().item())
        hooks.append(layer.self_attn.kv_a_layernorm.register_forward_hook(hook))
    with torch.no_grad():
        for w in windows:
            model(torch.tensor(w)[None])
    for h in hooks:
        h.remove()
    return mx


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib", required=True, help="calibration text (disjoint from the eval text)")
    ap.add_argument("--out", required=True, help="output checkpoint directory (must not exist)")
    ap.add_argument("--json", default=None, help="also write the factors here")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--lo", type=float, default=0.02)
    ap.add_argument("--hi", type=float, default=5.0)
    a = ap.parse_args()

    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer
    from transformers import DeepseekV3ForCausalLM

    src, out = pathlib.Path(a.model), pathlib.Path(a.out)
    if out.exists():
        sys.exit(f"error: {out} exists; refusing to overwrite")
    if not (0 < a.lo < a.hi):
        sys.exit("error: need 0 < --lo < --hi")
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    ids = tok.encode(pathlib.Path(a.calib).read_text(encoding="utf-8"), add_special_tokens=False).ids
    nwin = min(a.windows, len(ids) // a.context)
    if nwin < 1:
        sys.exit(f"error: calibration text has {len(ids)} tokens, need at least {a.context}")
    windows = [ids[w * a.context:(w + 1) * a.context] for w in range(nwin)]

    model = DeepseekV3ForCausalLM.from_pretrained(src, dtype=torch.float32, experts_implementation="eager").eval()
    L = model.config.num_hidden_layers
    natural = latent_max_abs(model, windows)
    targets = [a.lo * (a.hi / a.lo) ** (l / (L - 1)) if L > 1 else a.hi for l in range(L)]
    factors = [t / m for t, m in zip(targets, natural)]

    st = load_file(src / "model.safetensors")
    for l, f in enumerate(factors):
        kn = f"model.layers.{l}.self_attn.kv_a_layernorm.weight"
        kb = f"model.layers.{l}.self_attn.kv_b_proj.weight"
        if kn not in st or kb not in st:
            sys.exit(f"error: {src} lacks {kn} or {kb}")
        st[kn] = (st[kn].double() * f).float().contiguous()
        st[kb] = (st[kb].double() / f).float().contiguous()
    tmp = out.with_name(out.name + ".tmp-mlakv")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors" and f.suffix == ".json":
            shutil.copy(f, tmp / f.name)
    save_file(st, tmp / "model.safetensors", metadata={"format": "pt"})

    rep = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32, experts_implementation="eager").eval()
    after = latent_max_abs(rep, windows)
    # float32 noise floor: the source model in float64 vs float32 on the same window
    m64 = DeepseekV3ForCausalLM.from_pretrained(src, dtype=torch.float64, experts_implementation="eager").eval()
    x = torch.tensor(windows[0])[None]
    with torch.no_grad():
        l32, lrep, l64 = model(x).logits, rep(x).logits, m64(x).logits.float()
    diff = (lrep - l32).abs().max().item()
    floor = (l32 - l64).abs().max().item()
    rep_vs_64 = (lrep - l64).abs().max().item()
    top1 = (lrep.argmax(-1) == l32.argmax(-1)).float().mean().item()
    report = {
        "source": str(src), "calib": str(a.calib), "windows": nwin, "context": a.context,
        "rule": "kv_a_layernorm.weight *= a_l; kv_b_proj.weight (all kv_lora_rank input columns) /= a_l",
        "factors": factors, "natural_max_abs": natural, "target_max_abs": targets,
        "reparam_max_abs": after,
        "max_abs_logit_diff_vs_source_f32": diff,
        "source_f32_vs_f64_max_abs_logit_diff": floor,
        "reparam_f32_vs_source_f64_max_abs_logit_diff": rep_vs_64,
        "top1_agreement": top1,
    }
    print(json.dumps(report, indent=1))
    # Both float32 runs sit within float32 rounding of the float64 one: the reparam
    # run may not stray further from float64 than a small multiple of the source's own
    # float32 error (the rescaled weights add one rounding each, the norm one more).
    if not rep_vs_64 <= 4 * floor + 1e-6:
        shutil.rmtree(tmp)
        sys.exit(f"error: reparametrized logits differ by {rep_vs_64} from float64, "
                 f"beyond 4x the float32 floor {floor}")
    tmp.rename(out)
    (out / "reparam.json").write_text(json.dumps(report, indent=1) + "\n")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
