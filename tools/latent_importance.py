#!/usr/bin/env python3
"""Per-dim loss importance of the cached MLA latent, for `mlakv calibrate --importance file:PATH`.

The mlakv recipe's per-dim scale is d_i = sqrt(w_i) / sd_i^(1/2) (docs/calibration.md "The mlakv
recipe"), with w_i^2 the weight an error on latent dim i carries in the loss. This tool measures
it with autograd on a transformers checkpoint (DeepseekV3ForCausalLM and the other MLA models whose
attention has `kv_a_layernorm`): for every layer l and dim i,

    w2[l][i] = mean over scored positions t of (d loss / d kv_c_normed[l, t, i])^2

where kv_c_normed is the output of `kv_a_layernorm` (the 512 dims the cache stores) and loss is
the sum over positions of the next-token negative log-likelihood. Two estimates:

  fisher    (default) the labels are drawn from the model's own next-token distribution,
            `--samples` draws per window; E[g g^T] over the draws is the Fisher information of
            the model's output, which is the Hessian of the teacher-forced KLD against the
            unquantized model at zero error: the quantity `mlakv eval` measures. Its diagonal
            is what w2 estimates (cross-position terms vanish in expectation since
            E_y[d log p(y) / d theta] = 0).
  gradient  the text's own next tokens (the "empirical Fisher"; the issue 14 study's estimate).

Windows are cut as `mlakv calibrate` cuts them: the text tokenized with the model's
tokenizer.json (no special tokens), `--windows` consecutive windows of `--context` tokens from
the start; the last position of a window has no next token and is not scored. Only ever give it
calibration text (never the eval text: what it measures is then what the recipe is fitted to).

Writes `mlakv_latent_importance_v1` (docs/calibration.md "The importance file"), atomically:
  {"format": "mlakv_latent_importance_v1", "num_layers": N, "latent_dim": 512,
   "estimate": "fisher" | "gradient",
   "source": {"tool": "tools/latent_importance.py", "text": NAME, "sha256": HEX, "context": C,
              "windows": W, "samples": S, "seed": K, "positions": P},
   "layers": [{"w2": [512 numbers]}, ...]}

Needs torch, transformers, tokenizers, safetensors (tools/train_model/README.md pins the versions
the shipped model was made with: torch 2.11.0, transformers 5.17.0, tokenizers 0.23.2).
"""
import argparse
import hashlib
import json
import os
import struct
import sys

FORMAT = "mlakv_latent_importance_v1"
LATENT_DIM = 512


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory (config.json, model.safetensors, tokenizer.json)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="calibration text (never the eval text), tokenized with the model's tokenizer.json")
    src.add_argument("--tokens", help="or calibration token ids: little-endian int32 (as `mlakv calibrate --tokens`)")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--estimate", choices=["fisher", "gradient"], default="fisher")
    p.add_argument("--samples", type=int, default=4, help="fisher: label draws per window")
    p.add_argument("--seed", type=int, default=0, help="fisher: the label sampler's seed")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.context < 2:
        p.error(f"--context must be >= 2, got {a.context}")
    if a.windows < 1:
        p.error(f"--windows must be >= 1, got {a.windows}")
    if a.samples < 1:
        p.error(f"--samples must be >= 1, got {a.samples}")
    if a.estimate == "gradient" and a.samples != 1:
        a.samples = 1  # one pass: the labels are the text's
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    path = a.text if a.text is not None else a.tokens
    with open(path, "rb") as f:
        raw = f.read()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    vocab = model.config.vocab_size
    if a.text is not None:
        tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
        ids = tok.encode(raw.decode("utf-8"), add_special_tokens=False).ids
    else:
        if len(raw) % 4 != 0:
            sys.exit(f"error: {path}: {len(raw)} bytes is not a whole number of int32 ids")
        ids = list(struct.unpack(f"<{len(raw) // 4}i", raw))
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            sys.exit(f"error: {path}: token id {bad[0]} is outside [0, {vocab})")
    need = a.context * a.windows
    if len(ids) < need:
        sys.exit(f"error: {path} has {len(ids)} tokens; {a.windows} windows of {a.context} tokens need {need}")
    model.eval()
    layers = model.model.layers
    norms = []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        if not hasattr(attn, "kv_a_layernorm") or getattr(attn, "kv_lora_rank", None) != LATENT_DIM:
            sys.exit(f"error: layer {i}: no MLA kv_a_layernorm with kv_lora_rank {LATENT_DIM}")
        norms.append(attn.kv_a_layernorm)
    captured = [None] * len(layers)

    def hook(idx):
        def f(_mod, _inp, out):
            out.retain_grad()
            captured[idx] = out
        return f

    handles = [n.register_forward_hook(hook(i)) for i, n in enumerate(norms)]
    for p_ in model.parameters():
        p_.requires_grad_(False)
    acc = [torch.zeros(LATENT_DIM, dtype=torch.float64) for _ in layers]
    gen = torch.Generator().manual_seed(a.seed)
    positions = 0
    passes = 0
    for w in range(a.windows):
        win = torch.tensor(ids[w * a.context:(w + 1) * a.context], dtype=torch.long)[None]
        for s in range(a.samples):
            # Gradients flow from the latent on: make the embeddings a leaf that needs no grad,
            # and let the hooks' outputs carry the graph (parameters are frozen).
            emb = model.model.embed_tokens(win).detach().requires_grad_(True)
            logits = model(inputs_embeds=emb, use_cache=False).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            if a.estimate == "gradient":
                labels = win[0, 1:]
            else:
                labels = torch.multinomial(logp.detach().exp(), 1, generator=gen)[:, 0]
            loss = -logp.gather(1, labels[:, None]).sum()
            loss.backward()
            for l, c in enumerate(captured):
                g = c.grad[0, :-1].double()  # the last position's latent only feeds itself (not scored)
                acc[l] += (g * g).sum(0)
            passes += 1
            print(f"window {w + 1}/{a.windows} draw {s + 1}/{a.samples}: loss/position {loss.item() / labels.numel():.4f}",
                  file=sys.stderr)
        positions += a.context - 1
    for h in handles:
        h.remove()
    out_layers = []
    for l, v in enumerate(acc):
        w2 = (v / (positions * a.samples)).tolist()
        if not all(x >= 0.0 and x == x and x != float("inf") for x in w2) or max(w2) <= 0.0:
            sys.exit(f"error: layer {l}: the importance is not finite and > 0")
        out_layers.append({"w2": w2})
    j = {
        "format": FORMAT,
        "num_layers": len(layers),
        "latent_dim": LATENT_DIM,
        "estimate": a.estimate,
        "source": {
            "tool": "tools/latent_importance.py",
            "text": os.path.basename(path),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "context": a.context,
            "windows": a.windows,
            "samples": a.samples,
            "seed": a.seed,
            "positions": positions,
        },
        "layers": out_layers,
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(j, f, indent=1)
        f.write("\n")
    os.replace(tmp, a.out)
    print(f"wrote {a.out} ({FORMAT}, {len(layers)} layers, {a.estimate}, {passes} backward passes, "
          f"{positions} positions)", file=sys.stderr)


if __name__ == "__main__":
    main()
