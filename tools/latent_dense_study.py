#!/usr/bin/env python3
"""Study (not a recipe): how much a dense latent transform could gain over the diagonal one.

docs/quality.md "The gradient importance, and what is left". The mlakv recipe stores
c' = H D (c - mu) (D diagonal, H a signed Hadamard). Under its error model (after H the
quantization error is white in c' with a variance proportional to E||c'||^2) the expected KLD
of a transform c' = A (c - mu) is proportional to tr(A S A^T) tr((A^T A)^-1 F), S the latent's
covariance and F the Fisher information of the output w.r.t. the latent. Over diagonal A the
least is d_i^2 ~ sqrt(F_ii) / sd_i (the recipe with the Fisher importance); over every A it is
A^T A = S^-1/2 (S^1/2 F S^1/2)^1/2 S^-1/2, a dense 512 x 512 map. This script measures both
in one teacher-forced run of the transformers model with the nvfp4_ds_mla record simulated on
the latent (y = c' / s_l, sf = e4m3_rn_satfinite(amax_16(y) / 6), e2m1_rn_satfinite(y / sf),
as src/format/record_codec.h; k_pe rounded to bf16), against the unquantized model:

  fork      s_l = max |c| / 2688, no transform
  uniform   the shipped default: centred, d = sd^-1/2, signed Hadamard, s_l on c'
  fisher    d_i = (F_ii)^(1/4) / sd_i^(1/2)
  dense     A = H Lambda^(1/2) Q^T with Q Lambda Q^T = the optimum above (S and F with a ridge,
            `--ridge`: without one the held-out latents overflow the calibrated s_l)
  densediag the same with F replaced by its diagonal
  densecov  the same with F = I: A^T A = S^-1/2, from the covariance alone (gradient-free)
  denseq    F = sum_h E[q_lat,h q_lat,h^T], the absorbed queries (gradient-free)
  denseo    F = sum_h (W_o,h W_UV,h)^T (W_o,h W_UV,h), the output energy (gradient-free)
  denseqo   F = the two, each over its trace, summed
  lowrank   dense's M approximated by its diagonal and a rank-k correction (`--ranks`; with the last
            `--ridge`)

S, F (sampled-label Fisher, `--samples` draws per window), mu and s_l come from the
calibration text only; the KLD is measured on the eval windows. Prints KLD means and ratios to
fork. The simulated fork KLD is checked against `mlakv eval`'s figure by hand (docs).
Needs torch, transformers, tokenizers (tools/train_model/README.md).
"""
import argparse
import math
import re
import sys

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

L = 512
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_rn(a):
    """|x| -> the nearest e2m1 magnitude, ties to the even code, saturating at 6."""
    a = a.clamp(max=6.0)
    idx = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() + (a > 2.5).int()
           + (a >= 3.5).int() + (a > 5.0).int())
    return E2M1[idx]


def nvfp4(y):
    """Quantize-dequantize y [..., 512] (already divided by s_l) as the nvfp4_ds_mla latent."""
    g = y.reshape(*y.shape[:-1], L // 16, 16)
    amax = g.abs().amax(-1, keepdim=True)
    sf = (amax / 6.0).clamp(max=448.0).to(torch.float8_e4m3fn).float()
    q = torch.where(sf > 0, e2m1_rn((g / torch.where(sf > 0, sf, 1.0)).abs()) * g.sign(), torch.zeros_like(g))
    return (q * sf).reshape(y.shape)


def hadamard(n, seed):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    s = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(seed)).double() * 2 - 1
    return h * s[None, :] / math.sqrt(n)  # H S


def sqrtm(a, p=0.5):
    e, v = torch.linalg.eigh(a)
    return v @ torch.diag(e.clamp(min=1e-20) ** p) @ v.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--calib-windows", type=int, default=4)
    ap.add_argument("--eval-windows", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ridge", type=float, nargs="+", default=[1e-2],
                    help="dense: S and F each + ridge * tr / 512 * I before the optimum (held-out robustness)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64], help="lowrank: the ranks k")
    ap.add_argument("--variants", nargs="+", default=["uniform", "fisher", "dense"],
                    help="of uniform, fisher, dense, densediag, densecov, denseq, denseo, denseqo, lowrank")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = Tokenizer.from_file(a.model + "/tokenizer.json")
    m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    layers = [ly.self_attn for ly in m.model.layers]
    n = len(layers)
    T = a.context

    def windows(path, k):
        ids = tok.encode(open(path, encoding="utf-8").read(), add_special_tokens=False).ids
        if len(ids) < k * T:
            sys.exit(f"error: {path}: {len(ids)} tokens, need {k * T}")
        return [torch.tensor(ids[w * T:(w + 1) * T])[None] for w in range(k)]

    # ---- calibration statistics (calibration text only) ----
    cap = [None] * n
    hooks = []
    qcap = [None] * n
    for i, at in enumerate(layers):
        def h(_m, _i, out, i=i):
            if out.requires_grad:
                out.retain_grad()
            cap[i] = out
        hooks.append(at.kv_a_layernorm.register_forward_hook(h))

        def hq(_m, _i, out, i=i):
            qcap[i] = out.detach()
        hooks.append(at.q_b_proj.register_forward_hook(hq))
    cfg = m.config
    H, dn, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    dq = dn + cfg.qk_rope_head_dim
    fq = [torch.zeros(L, L, dtype=torch.float64) for _ in range(n)]
    s1 = [torch.zeros(L, dtype=torch.float64) for _ in range(n)]
    s2 = [torch.zeros(L, L, dtype=torch.float64) for _ in range(n)]
    fis = [torch.zeros(L, L, dtype=torch.float64) for _ in range(n)]
    cmax = [0.0] * n
    cnt = 0
    fcnt = 0
    gen = torch.Generator().manual_seed(0)
    cal = windows(a.calib, a.calib_windows)
    cal_latents = [[] for _ in range(n)]
    for win in cal:
        for s in range(a.samples):
            emb = m.model.embed_tokens(win).detach().requires_grad_(True)
            logp = torch.log_softmax(m(inputs_embeds=emb, use_cache=False).logits[0, :-1], -1)
            y = torch.multinomial(logp.detach().exp(), 1, generator=gen)[:, 0]
            (-logp.gather(1, y[:, None]).sum()).backward()
            for i in range(n):
                g = cap[i].grad[0, :-1].double()
                fis[i] += g.T @ g
                if s == 0:
                    c = cap[i].detach()[0].double()
                    s1[i] += c.sum(0)
                    s2[i] += c.T @ c
                    cmax[i] = max(cmax[i], c.abs().max().item())
                    cal_latents[i].append(c)
                    # absorbed queries q_lat,h = q_nope,h W_UK,h: sum_h E[q_lat q_lat^T]
                    W = layers[i].kv_b_proj.weight.double().view(H, dn + dv, L)
                    q = qcap[i][0].double().view(T, H, dq)[:, :, :dn]
                    for hh in range(H):
                        ql = q[:, hh] @ W[hh, :dn]
                        fq[i] += ql.T @ ql
            fcnt += T - 1
        cnt += T
    for h in hooks:
        h.remove()
    variants = {"fork": [None] * n}
    for i in range(n):
        mu = s1[i] / cnt
        S = s2[i] / cnt - torch.outer(mu, mu)
        F = fis[i] / fcnt
        sd = S.diag().clamp(min=1e-30).sqrt()
        f = F.diag().clamp(min=1e-30)
        cores = {"uniform": torch.diag(sd ** -0.5), "fisher": torch.diag(f ** 0.25 / sd ** 0.5)}
        I = torch.eye(L, dtype=torch.float64)
        # dense: the optimum with F; densediag: with F's diagonal only; densecov: with F = I (the
        # covariance alone, gradient-free: A^T A = S^-1/2).
        # gradient-free stand-ins for F: the absorbed queries' second moments (the score path) and
        # the output energy sum_h (W_o,h W_UV,h)^T (W_o,h W_UV,h) (the value path)
        W = layers[i].kv_b_proj.weight.double().view(H, dn + dv, L)
        Wo = layers[i].o_proj.weight.double().view(-1, H, dv)
        Fo = sum((Wo[:, hh] @ W[hh, dn:]).T @ (Wo[:, hh] @ W[hh, dn:]) for hh in range(H))
        Fq = fq[i] / cnt
        Fqo = Fq / Fq.trace() + Fo / Fo.trace()
        for fname, FF in (("dense", F), ("densediag", torch.diag(F.diag())), ("densecov", I * F.trace() / L),
                          ("denseq", Fq), ("denseo", Fo), ("denseqo", Fqo)):
            for rg in a.ridge:
                Sr = S + rg * S.trace() / L * I
                Fr = FF + rg * FF.trace() / L * I
                Sh, Shi = sqrtm(Sr), sqrtm(Sr, -0.5)
                Mopt = Shi @ sqrtm(Sh @ Fr @ Sh) @ Shi
                e, Q = torch.linalg.eigh(Mopt)
                cores[f"{fname}{rg:g}"] = torch.diag(e.clamp(min=1e-30).sqrt()) @ Q.T
                print(f"layer {i} {fname} ridge {rg:g}: gain condition number "
                      f"{(e.max() / e.min()).sqrt().item():.3g}", file=sys.stderr)
            if fname == "dense":
                # diagonal + rank k: M_k = D^1/2 (I + U_k (L_k - 1) U_k^T) D^1/2 from the eigen-
                # decomposition of D^-1/2 M D^-1/2 (D = M's diagonal), the k largest |log eig|: a
                # writer cost of 2 * 512 * k multiply-adds per token instead of 512^2
                Dm = Mopt.diag()
                e2, U = torch.linalg.eigh(Mopt / torch.outer(Dm.sqrt(), Dm.sqrt()))
                order = torch.argsort(e2.clamp(min=1e-30).log().abs(), descending=True)
                for k in a.ranks:
                    Uk, ek = U[:, order[:k]], e2[order[:k]]
                    Mk = torch.outer(Dm.sqrt(), Dm.sqrt()) * (I + Uk @ torch.diag(ek - 1) @ Uk.T)
                    ee, QQ = torch.linalg.eigh(Mk)
                    cores[f"lowrank{k}"] = torch.diag(ee.clamp(min=1e-30).sqrt()) @ QQ.T
        cores = {k: v for k, v in cores.items() if re.sub(r"\d[0-9.e+-]*$", "", k) in a.variants}
        allc = torch.cat(cal_latents[i])
        for name, core in cores.items():
            core = core / torch.exp(torch.linalg.slogdet(core)[1] / L)  # |det| 1 (the size goes to s_l)
            for seed in a.seeds:
                A = hadamard(L, 1000 * seed + i) @ core
                mx = ((allc - mu) @ A.T).abs().max().item()
                variants.setdefault(f"{name}/{seed}", [None] * n)[i] = (mu, A, torch.linalg.inv(A), mx / 2688.0)
        variants["fork"][i] = (torch.zeros(L, dtype=torch.float64), None, None, cmax[i] / 2688.0)

    # ---- eval: teacher-forced KLD against the unquantized model ----
    state = {"v": None}

    def latent_hook(i):
        def h(_m, _i, out):
            v = state["v"]
            if v is None:
                return out
            mu, A, Ainv, s = v[i]
            c = out.double()
            if A is None:
                return (nvfp4((c / s).float()).double() * s).to(out.dtype)
            cp = (c - mu) @ A.T
            return ((nvfp4((cp / s).float()).double() * s) @ Ainv.T + mu).to(out.dtype)
        return h

    def rope_hook(_m, _i, out):
        if state["v"] is None:
            return out
        out = out.clone()
        out[..., L:] = out[..., L:].bfloat16().float()
        return out

    hooks = [at.kv_a_layernorm.register_forward_hook(latent_hook(i)) for i, at in enumerate(layers)]
    hooks += [at.kv_a_proj_with_mqa.register_forward_hook(rope_hook) for at in layers]
    kld = {k: 0.0 for k in variants}
    pos = 0
    with torch.no_grad():
        for w, win in enumerate(windows(a.eval, a.eval_windows)):
            state["v"] = None
            ref = torch.log_softmax(m(win, use_cache=False).logits[0, :-1].double(), -1)
            for k, v in variants.items():
                state["v"] = v
                q = torch.log_softmax(m(win, use_cache=False).logits[0, :-1].double(), -1)
                kld[k] += (ref.exp() * (ref - q)).sum().item()
            pos += T - 1
            print(f"eval window {w + 1}/{a.eval_windows}", file=sys.stderr)
    for h in hooks:
        h.remove()
    fork = kld["fork"] / pos
    print(f"positions {pos}; fork KLD mean {fork:.4e}")
    names = sorted({k.split("/")[0] for k in kld if "/" in k})
    for name in names:
        r = [kld[f"{name}/{s}"] / pos / fork for s in a.seeds]
        print(f"{name:8s} ratio to fork per seed: " + " ".join(f"{x:.3f}" for x in r)
              + f"  mean {sum(r) / len(r):.3f} worst {max(r):.3f}")


if __name__ == "__main__":
    main()
