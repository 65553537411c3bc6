#!/usr/bin/env python3
"""Trains mlakv's embedded default model: a small DeepSeek-V3-architecture LM on
CPython's standard library sources, with needle retrieval mixed into training.

Three steps (README.md beside this file gives the exact commands):

  prepare  CPython Lib/ sources -> deterministic train / calib / eval split,
           a byte-level BPE tokenizer (DeepSeek-V3 pre-tokenizer) trained on the
           training split, the training split tokenized (uint16)
  train    DeepseekV3ForCausalLM (transformers) from scratch, fixed seeds; saves a
           Hugging Face checkpoint (bf16 safetensors, per-expert tensor names as real
           DeepSeek checkpoints use), checks it reloads with identical logits, then
           runs `eval`; everything goes to the log
  eval     held-out perplexity (per token, bits per byte) and the needle trials of
           docs/needle.md, the model in float32 with a plain (unquantized) cache

Only torch, transformers, tokenizers, safetensors and numpy are needed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import needle  # noqa: E402

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
# DeepSeek-V3's pre-tokenizer: digits in runs of at most three, CJK runs, then the
# letter / punctuation / whitespace pattern, then byte-level mapping without its regex.
PRETOK_DIGITS = r"\p{N}{1,3}"
PRETOK_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
PRETOK_MAIN = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
               r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
               r"| ?[\p{P}\p{S}]+[\r\n]*"
               r"|\s*[\r\n]+"
               r"|\s+(?!\S)"
               r"|\s+")

EVAL_BUCKETS = range(0, 30)      # of 1000 sha256 buckets of the file path
CALIB_BUCKETS = range(30, 50)
EVAL_CAP = 1_000_000             # bytes
CALIB_CAP = 500_000


def log_to(path):
    f = open(path, "a", encoding="utf-8")

    def log(*parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        f.write(line + "\n")
        f.flush()
    return log


# ----------------------------------------------------------------------------- prepare

def collect_docs(src: pathlib.Path):
    """(relpath, text) for every *.py under src except site-packages, caches and the
    machine-specific _sysconfigdata; sorted by path; files that are not UTF-8 skipped."""
    docs, skipped = [], []
    for p in sorted(src.rglob("*.py"), key=lambda q: q.relative_to(src).as_posix()):
        rel = p.relative_to(src).as_posix()
        parts = set(p.relative_to(src).parts)
        if "site-packages" in parts or "__pycache__" in parts or rel.startswith("_sysconfigdata"):
            continue
        if not p.is_file():
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(rel)
            continue
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        if not text.endswith("\n"):
            text += "\n"
        docs.append((rel, f"# ---- Lib/{rel} ----\n" + text))
    return docs, skipped


def bucket(rel: str) -> int:
    return int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % 1000


def make_tokenizer(train_texts, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOK_DIGITS), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(PRETOK_CJK), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(PRETOK_MAIN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_texts, trainer=trainer, length=len(train_texts))
    return tok


def tokenizer_config(max_len):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "legacy": False,
    }


def cmd_prepare(a):
    src, out = pathlib.Path(a.src), pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = log_to(out / "prepare_log.txt")
    docs, skipped = collect_docs(src)
    log(f"prepare: src={src} python={sys.version.split()[0]} files={len(docs)} skipped_non_utf8={len(skipped)}")
    split = {"train": [], "calib": [], "eval": [], "dropped": []}
    size = {"calib": 0, "eval": 0}
    for rel, text in docs:
        b = bucket(rel)
        n = len(text.encode())
        name = "eval" if b in EVAL_BUCKETS else "calib" if b in CALIB_BUCKETS else "train"
        if name != "train":
            cap = EVAL_CAP if name == "eval" else CALIB_CAP
            if size[name] + n > cap:
                split["dropped"].append((rel, text))
                continue
            size[name] += n
        split[name].append((rel, text))
    for name in ("eval", "calib"):
        (out / f"{name}.txt").write_text("".join(t for _, t in split[name]), encoding="utf-8")
    train_texts = [t for _, t in split["train"]]
    t0 = time.time()
    tok = make_tokenizer(train_texts, a.vocab)
    log(f"tokenizer: vocab={tok.get_vocab_size()} trained on {len(train_texts)} files in {time.time() - t0:.1f}s")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(a.max_len), indent=2) + "\n")
    t0 = time.time()
    enc = tok.encode_batch(train_texts, add_special_tokens=False)
    ids = np.concatenate([np.asarray(e.ids, dtype=np.uint16) for e in enc])
    ids.tofile(out / "train.bin")
    nbytes = sum(len(t.encode()) for t in train_texts)
    log(f"train split: {len(train_texts)} files {nbytes} bytes {ids.size} tokens "
        f"({nbytes / ids.size:.3f} bytes/token) tokenized in {time.time() - t0:.1f}s")
    manifest = {"src": str(src), "python": sys.version.split()[0], "skipped_non_utf8": skipped}
    for name in ("train", "calib", "eval", "dropped"):
        manifest[name] = [rel for rel, _ in split[name]]
        log(f"{name}: {len(split[name])} files {sum(len(t.encode()) for _, t in split[name])} bytes")
    for name in ("eval", "calib"):
        nt = len(tok.encode((out / f"{name}.txt").read_text(encoding="utf-8"), add_special_tokens=False).ids)
        manifest[f"{name}_tokens"] = nt
        if name == "eval":
            np.asarray(tok.encode((out / "eval.txt").read_text(encoding="utf-8"),
                                  add_special_tokens=False).ids, dtype=np.uint16).tofile(out / "heldout.bin")
        log(f"{name}.txt: {nt} tokens sha256={hashlib.sha256((out / f'{name}.txt').read_bytes()).hexdigest()}")
    manifest["train_tokens"] = int(ids.size)
    manifest["tokenizer_sha256"] = hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


# ----------------------------------------------------------------------------- model

def model_config(vocab, max_pos):
    from transformers import DeepseekV3Config
    return DeepseekV3Config(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        kv_lora_rank=512, q_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
        max_position_embeddings=max_pos, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rope_interleave=True, rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False,
        attention_bias=False, num_nextn_predict_layers=0,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, use_cache=True)


class Batcher:
    """Deterministic training batches: batch `step` depends only on (seed, step)."""

    def __init__(self, data_dir, tok, seq, batch, needle_frac, seed):
        self.ids = np.fromfile(pathlib.Path(data_dir) / "train.bin", dtype=np.uint16)
        self.tok, self.seq, self.batch, self.frac, self.seed = tok, seq, batch, needle_frac, seed
        self.bos = tok.token_to_id(BOS)

    def enc(self, s):
        return self.tok.encode(s, add_special_tokens=False).ids

    def one(self, rng):
        S = self.seq
        head = [self.bos] if rng.random() < 0.5 else []
        if rng.random() >= self.frac:
            n = S - len(head)
            off = int(rng.integers(0, self.ids.size - n))
            x = head + self.ids[off:off + n].tolist()
            return x, list(x)
        # needle sequence: 1-6 definitions, each recalled 1-2 times later on
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        defs = []
        for _ in range(int(rng.integers(1, 7))):
            key = "".join(rng.choice(letters, needle.KEY_LETTERS))
            val = "".join(str(d) for d in rng.integers(0, 10, needle.VALUE_DIGITS))
            d = self.enc(needle.definition_text(key, val))
            pfx = self.enc(needle.recall_text(key))
            assert d[:len(pfx)] == pfx, (key, val)
            defs.append((d, len(pfx), int(rng.integers(1, 3))))
        H = S - len(head) - sum(len(d) * (1 + r) for d, _, r in defs)
        off = int(rng.integers(0, self.ids.size - H))
        hay = self.ids[off:off + H].tolist()
        events = []
        for j, (d, p, r) in enumerate(defs):
            pos = int(rng.integers(0, H))
            events.append((pos, 0, j))
            for _ in range(r):
                events.append((int(rng.integers(pos + 1, H + 1)), 1, j))
        events.sort()
        x, y, cur = list(head), list(head), 0
        for pos, kind, j in events:
            x += hay[cur:pos]
            y += hay[cur:pos]
            cur = pos
            d, p, _ = defs[j]
            x += d
            # the first occurrence's digits are unpredictable: no loss on them
            y += d if kind == 1 else d[:p] + [-100] * (len(d) - p - 1) + d[-1:]
        x += hay[cur:]
        y += hay[cur:]
        assert len(x) == S == len(y)
        return x, y

    def get(self, step):
        rng = np.random.default_rng([self.seed, step])
        xs, ys = zip(*(self.one(rng) for _ in range(self.batch)))
        return np.array(xs, dtype=np.int64), np.array(ys, dtype=np.int64)


def save_checkpoint(model, tok_dir, out_dir, log):
    """bf16 safetensors under the per-expert names; the router bias stays float32
    (as DeepSeek's checkpoints keep it); config.json also carries the legacy
    rope_theta / rope_scaling keys the published DeepSeek-V3 config has."""
    import shutil
    import torch
    from safetensors.torch import load_file, save_file
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd32 = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    m16 = model.to(torch.bfloat16)
    m16.save_pretrained(out_dir, safe_serialization=True)
    model.float()
    st = load_file(out_dir / "model.safetensors")
    for k in list(st):
        if k.endswith("e_score_correction_bias"):
            st[k] = sd32[k].contiguous()
    fused = [k for k in st if "gate_up_proj" in k or k.endswith("experts.down_proj")]
    if fused:
        raise RuntimeError(f"save_pretrained wrote fused expert tensors: {fused[:3]}")
    save_file(st, out_dir / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    cfg["rope_scaling"] = None
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(tok_dir) / f, out_dir / f)
    log(f"saved {out_dir}: model.safetensors {os.path.getsize(out_dir / 'model.safetensors')} bytes, "
        f"{len(st)} tensors")
    return sd32


def verify_reload(sd32, out_dir, sample, device, log):
    """The shipped checkpoint, loaded by transformers in float32, must give exactly the
    logits of the trained weights rounded to bf16 (router bias float32)."""
    import torch
    from transformers import DeepseekV3ForCausalLM
    loaded = DeepseekV3ForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
    ref = DeepseekV3ForCausalLM(loaded.config).to(device).eval()
    rounded = {k: (v if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16).float())
               for k, v in sd32.items()}
    missing, unexpected = ref.load_state_dict(rounded, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing[:4]} unexpected {unexpected[:4]}")
    with torch.no_grad():
        x = torch.tensor(sample, device=device)[None]
        a, b = loaded(x).logits, ref(x).logits
    diff = (a - b).abs().max().item()
    log(f"reload check: {x.shape[1]} tokens, max |logits(loaded) - logits(trained, bf16-rounded)| = {diff}")
    if diff != 0.0:
        raise RuntimeError("reloaded checkpoint does not reproduce the trained logits")
    return loaded


def cmd_train(a):
    import torch
    from tokenizers import Tokenizer
    from transformers import DeepseekV3ForCausalLM
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = log_to(out / "train_log.txt")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    tok = Tokenizer.from_file(str(pathlib.Path(a.data) / "tokenizer.json"))
    cfg = model_config(tok.get_vocab_size(), a.seq)
    cfg._attn_implementation = "sdpa"
    model = DeepseekV3ForCausalLM(cfg).to(device)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"train: torch {torch.__version__} device {device} "
        f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
    log(f"args: {vars(a)}")
    log(f"model: {nparams} parameters; config {json.dumps(cfg.to_diff_dict(), sort_keys=True)}")
    batcher = Batcher(a.data, tok, a.seq, a.batch, a.needle_frac, a.seed)
    log(f"data: {batcher.ids.size} training tokens; {a.batch} x {a.seq} tokens per step; "
        f"needle fraction {a.needle_frac}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(device == "cuda"))
    warm = max(1, int(a.steps * 0.04))

    def lr_at(s):
        if s < warm:
            return a.lr * (s + 1) / warm
        t = (s - warm) / max(1, a.steps - warm)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    # aux-loss-free load balancing (DeepSeek-V3 section 2.1.2): after each step,
    # e_score_correction_bias += gamma * sign(mean load - load) per MoE layer
    loads = {}
    routers = {n: m for n, m in model.named_modules() if n.endswith("mlp.gate")}
    for n, m in routers.items():
        def hook(mod, inp, outp, n=n):
            idx = outp[2].reshape(-1)
            loads[n] = loads.get(n, 0) + torch.bincount(idx, minlength=mod.num_experts)
        m.register_forward_hook(hook)

    held = np.fromfile(pathlib.Path(a.data) / "heldout.bin", dtype=np.uint16) if a.eval_every else None

    def heldout_loss():
        model.eval()
        with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=(device == "cuda")):
            n = min(4, held.size // a.seq)
            x = torch.from_numpy(held[:n * a.seq].astype(np.int64).reshape(n, a.seq)).to(device)
            v = model(input_ids=x, labels=x).loss.item()
        model.train()
        return v

    model.train()
    t_start = time.time()
    seen, hist, sync_t = 0, [], time.time()
    for step in range(a.steps):
        x, y = batcher.get(step)
        x = torch.from_numpy(x).to(device, non_blocking=True)
        y = torch.from_numpy(y).to(device, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=(device == "cuda")):
            loss = model(input_ids=x, labels=y).loss
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            imb = []
            for n, m in routers.items():
                ld = loads[n].float()
                m.e_score_correction_bias += a.bias_gamma * torch.sign(ld.mean() - ld)
                imb.append((ld.max() / ld.mean()).item() if step % a.log_every == 0 else 0)
            loads.clear()
        seen += x.numel()
        hist.append(loss.detach())
        if step % a.log_every == 0 or step == a.steps - 1:
            lv = torch.stack(hist).float().mean().item()
            hist = []
            el = time.time() - t_start
            bias = torch.cat([m.e_score_correction_bias for m in routers.values()])
            log(f"step {step:5d} loss {lv:.4f} lr {lr_at(step):.2e} gnorm {gn.item():.3f} "
                f"tokens {seen} time {el:.1f}s tok/s {seen / el:.0f} "
                f"max_load/mean {max(imb):.2f} bias [{bias.min().item():+.3f},{bias.max().item():+.3f}]")
        if a.eval_every and (step % a.eval_every == 0 or step == a.steps - 1):
            log(f"step {step:5d} held-out loss {heldout_loss():.4f} (first {min(4, held.size // a.seq)} x {a.seq} "
                f"tokens of eval.txt, bf16 autocast)")
        if a.max_seconds and time.time() - t_start > a.max_seconds:
            log(f"stopping early at step {step}: --max-seconds {a.max_seconds} reached")
            break
    if device == "cuda":
        torch.cuda.synchronize()
    el = time.time() - t_start
    log(f"trained: {step + 1} steps, {seen} tokens, {el:.1f}s, {seen / el:.0f} tokens/s")
    model.eval()
    ck = out / "model"
    sd32 = save_checkpoint(model, a.data, ck, log)
    sample = batcher.get(10**9)[0][0][:1024].tolist()
    del model
    loaded = verify_reload(sd32, ck, sample, device, log)
    del loaded
    run_eval(ck, a.eval_text or (pathlib.Path(a.data) / "eval.txt"), a.needles, a.ppl_windows, device, log)


# ----------------------------------------------------------------------------- eval

def byte_lengths(tok):
    from tokenizers import pre_tokenizers  # noqa: F401
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    lens = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for s, i in tok.get_vocab().items():
        lens[i] = 0 if s in special else len(s)
        if s not in special:
            assert all(ch in dec for ch in s), s
    return lens


def run_eval(model_dir, eval_text, n_needles, ppl_windows, device, log):
    import torch
    from tokenizers import Tokenizer
    from transformers import DeepseekV3ForCausalLM
    model_dir = pathlib.Path(model_dir)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = DeepseekV3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    nparams = sum(p.numel() for p in model.parameters())
    disk = sum(f.stat().st_size for f in model_dir.iterdir() if f.is_file())
    log(f"eval: {model_dir} {nparams} parameters, {disk} bytes on disk "
        f"(model.safetensors {os.path.getsize(model_dir / 'model.safetensors')}), float32, "
        f"attn {model.config._attn_implementation}")
    text = pathlib.Path(eval_text).read_text(encoding="utf-8")
    ids = tok.encode(text, add_special_tokens=False).ids
    blen = byte_lengths(tok)
    log(f"eval text: {eval_text} {len(text.encode())} bytes {len(ids)} tokens")
    results = {}
    t0 = time.time()
    # both rows cover the same tokens: ppl_windows windows of 2048, and as many
    # max-context windows as fit in those tokens (so they differ only in context)
    for ctx in (2048, model.config.max_position_embeddings):
        nwin = min(max(1, ppl_windows * 2048 // ctx), len(ids) // ctx)
        nll, ntok, nbyte = 0.0, 0, 0
        with torch.no_grad():
            for w in range(nwin):
                x = torch.tensor(ids[w * ctx:(w + 1) * ctx], device=device)[None]
                lp = torch.log_softmax(model(x).logits[0, :-1].float(), dim=-1)
                tgt = x[0, 1:]
                nll -= lp.gather(1, tgt[:, None]).sum().item()
                ntok += tgt.numel()
                nbyte += int(blen[tgt.cpu().numpy()].sum())
        ppl = math.exp(nll / ntok)
        bpb = nll / math.log(2) / nbyte
        results[f"ppl_{ctx}"] = ppl
        log(f"perplexity: context {ctx}, first {nwin} non-overlapping windows, {ntok} predicted tokens "
            f"({nbyte} bytes): ppl {ppl:.4f}, {nll / ntok / math.log(2):.4f} bits/token, {bpb:.4f} bits/byte")
    log(f"perplexity time {time.time() - t0:.1f}s")

    def enc(s):
        return tok.encode(s, add_special_tokens=False).ids

    t0 = time.time()
    found, by_len, by_depth, fails = 0, {}, {}, []
    for i in range(n_needles):
        tr = needle.build_trial(i, ids, enc, model.config.max_position_embeddings)
        gen = []
        with torch.no_grad():
            x = torch.tensor(tr.prompt, device=device)[None]
            out = model(input_ids=x, use_cache=True)
            past = out.past_key_values
            nxt = int(out.logits[0, -1].argmax())
            for k in range(needle.MAX_NEW_TOKENS):
                gen.append(nxt)
                if needle.stops(tok.decode([nxt])) or k == needle.MAX_NEW_TOKENS - 1:
                    break
                out = model(input_ids=torch.tensor([[nxt]], device=device), past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = int(out.logits[0, -1].argmax())
        g = tok.decode(gen)
        ok = needle.is_found(g, tr.value)
        found += ok
        for dct, k in ((by_len, tr.context_len), (by_depth, tr.depth)):
            f, n = dct.get(k, (0, 0))
            dct[k] = (f + ok, n + 1)
        if not ok:
            fails.append((i, tr.context_len, tr.depth, tr.value, g))
    log(f"needle: found {found}/{n_needles} (float32 model, plain DynamicCache, greedy) in {time.time() - t0:.1f}s")
    log("needle by context length: " + ", ".join(f"{k}: {f}/{n}" for k, (f, n) in sorted(by_len.items())))
    log("needle by depth: " + ", ".join(f"{k}: {f}/{n}" for k, (f, n) in sorted(by_depth.items())))
    for fl in fails[:20]:
        log(f"needle miss: trial {fl[0]} L={fl[1]} depth={fl[2]} want {fl[3]} got {fl[4]!r}")
    results.update(needle_found=found, needle_total=n_needles, params=nparams, disk_bytes=disk)
    log("eval json: " + json.dumps(results, sort_keys=True))
    return results


def cmd_eval(a):
    import torch
    out = pathlib.Path(a.log).parent
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    run_eval(a.model, a.eval_text, a.needles, a.ppl_windows, device, log_to(a.log))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--src", required=True, help="CPython Lib/ directory (sysconfig's 'stdlib')")
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--max-len", type=int, default=4096)
    p.set_defaults(fn=cmd_prepare)
    p = sub.add_parser("train")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--needle-frac", type=float, default=0.3)
    p.add_argument("--bias-gamma", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=250, help="held-out loss every N steps (0: never)")
    p.add_argument("--max-seconds", type=float, default=0, help="safety stop (0: none)")
    p.add_argument("--eval-text", default=None)
    p.add_argument("--needles", type=int, default=100)
    p.add_argument("--ppl-windows", type=int, default=32)
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("eval")
    p.add_argument("--model", required=True)
    p.add_argument("--eval-text", required=True)
    p.add_argument("--needles", type=int, default=100)
    p.add_argument("--ppl-windows", type=int, default=32)
    p.add_argument("--log", required=True)
    p.set_defaults(fn=cmd_eval)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
