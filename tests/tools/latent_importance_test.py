#!/usr/bin/env python3
"""tools/latent_importance.py against independent references, on the 2-layer fixture model.

- `--estimate gradient`: every per-position gradient of the summed next-token loss w.r.t.
  kv_c_normed, recomputed by central finite differences (Richardson-extrapolated) in float64 (a hook adds +-eps to one
  latent entry), and w2 = their mean square, against the tool's autograd figures in float32.
- `--estimate fisher`: on one scored position, the exact Fisher diagonal
  diag(J^T (diag p - p p^T) J), J = d logits / d kv_c_normed from the Jacobian, against the
  tool's sampled-label estimate (many draws; a statistical tolerance).
- the file is what `mlakv calibrate --importance file:PATH` parses (format, keys, sizes).
Exits 77 (ctest's skip) when torch or transformers is missing: CI need not have them.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "tests", "data", "model_parity", "v3_moe")
TOOL = os.path.join(ROOT, "tools", "latent_importance.py")

try:
    import torch
    import transformers  # noqa: F401
    import tokenizers  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
from transformers import AutoModelForCausalLM


def run_tool(tmp, tokens, context, windows, estimate, samples=1, seed=0):
    tk = os.path.join(tmp, "t.bin")
    with open(tk, "wb") as f:
        f.write(struct.pack(f"<{len(tokens)}i", *tokens))
    out = os.path.join(tmp, f"{estimate}.json")
    r = subprocess.run([sys.executable, TOOL, "--model", MODEL, "--tokens", tk, "--context", str(context),
                        "--windows", str(windows), "--estimate", estimate, "--samples", str(samples),
                        "--seed", str(seed), "--threads", "1", "--out", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(out) as f:
        return json.load(f)


def load64():
    m = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float64, experts_implementation="eager")
    m.eval()
    return m


def loss_with(m, ids, layer, t, i, eps):
    """The summed next-token NLL with eps added to kv_c_normed[layer, t, i]."""
    def hook(_mod, _inp, out):
        out = out.clone()
        out[0, t, i] += eps
        return out
    h = m.model.layers[layer].self_attn.kv_a_layernorm.register_forward_hook(hook)
    try:
        with torch.no_grad():
            logp = torch.log_softmax(m(torch.tensor([ids]), use_cache=False).logits[0, :-1], -1)
    finally:
        h.remove()
    return -logp.gather(1, torch.tensor(ids[1:])[:, None]).sum().item()


def check_file(j, layers):
    assert j["format"] == "mlakv_latent_importance_v1"
    assert j["num_layers"] == layers and j["latent_dim"] == 512
    assert set(j) == {"format", "num_layers", "latent_dim", "estimate", "source", "layers"}
    assert len(j["layers"]) == layers
    for L in j["layers"]:
        assert set(L) == {"w2"} and len(L["w2"]) == 512 and min(L["w2"]) >= 0 and max(L["w2"]) > 0


def test_gradient(tmp):
    g = torch.Generator().manual_seed(3)
    context, windows = 3, 2
    tokens = torch.randint(0, 96, (context * windows,), generator=g).tolist()
    j = run_tool(tmp, tokens, context, windows, "gradient")
    check_file(j, 2)
    assert j["estimate"] == "gradient" and j["source"]["positions"] == windows * (context - 1)
    m = load64()
    # transformers' MoE router computes in float32 even in a float64 model, so the loss is noisy
    # at ~1e-7 relative: a wide step with Richardson extrapolation (error O(eps^4)).
    eps = 1e-2
    for layer in (0, 1):
        for i in (0, 200, 511):
            sq = 0.0
            for w in range(windows):
                ids = tokens[w * context:(w + 1) * context]
                for t in range(context - 1):  # the last position is not scored
                    def central(h):
                        return (loss_with(m, ids, layer, t, i, h) - loss_with(m, ids, layer, t, i, -h)) / (2 * h)
                    d = (4 * central(eps) - central(2 * eps)) / 3
                    sq += d * d
            want = sq / (windows * (context - 1))
            got = j["layers"][layer]["w2"][i]
            assert abs(got - want) <= 1e-2 * want + 1e-7, (layer, i, got, want)
    print("gradient: finite differences agree")


def test_fisher(tmp):
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 96, (2,), generator=g).tolist()
    samples = 300
    j = run_tool(tmp, tokens, 2, 1, "fisher", samples=samples, seed=9)
    check_file(j, 2)
    assert j["estimate"] == "fisher" and j["source"]["samples"] == samples
    m = load64()
    for layer in (0, 1):
        cap = {}

        def hook(_mod, _inp, out):
            cap["c"] = out
        h = m.model.layers[layer].self_attn.kv_a_layernorm.register_forward_hook(hook)
        with torch.no_grad():
            m(torch.tensor([tokens]), use_cache=False)
        h.remove()
        c0 = cap["c"].detach().clone()

        def logits_of(c):
            def rep(_mod, _inp, _out):
                return c
            hh = m.model.layers[layer].self_attn.kv_a_layernorm.register_forward_hook(rep)
            try:
                return m(torch.tensor([tokens]), use_cache=False).logits[0, 0]
            finally:
                hh.remove()
        J = torch.autograd.functional.jacobian(logits_of, c0)[:, 0, 0, :]  # [V, 512]: position 0's latent
        with torch.no_grad():
            p = torch.softmax(logits_of(c0), -1)
        F = torch.einsum("vi,vw,wi->i", J, torch.diag(p) - torch.outer(p, p), J)
        got = torch.tensor(j["layers"][layer]["w2"], dtype=torch.float64)
        rel = abs(got.sum() / F.sum() - 1).item()
        corr = torch.corrcoef(torch.stack([got, F]))[0, 1].item()
        assert rel < 0.2 and corr > 0.9, (layer, rel, corr)
        print(f"fisher layer {layer}: total within {rel:.3f} of the exact diagonal, per-dim correlation {corr:.3f}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_gradient(tmp)
        test_fisher(tmp)
        # Bad input: a token outside the vocabulary is an error naming it, and writes nothing.
        tk = os.path.join(tmp, "bad.bin")
        with open(tk, "wb") as f:
            f.write(struct.pack("<4i", 1, 2, 500, 3))
        out = os.path.join(tmp, "bad.json")
        r = subprocess.run([sys.executable, TOOL, "--model", MODEL, "--tokens", tk, "--context", "2", "--out", out,
                            "--windows", "2"], capture_output=True, text=True)
        assert r.returncode != 0 and "500" in r.stderr and not os.path.exists(out), r.stderr
    print("ok")


if __name__ == "__main__":
    main()
