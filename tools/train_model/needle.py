"""Needle-in-a-haystack trials exactly as docs/needle.md defines them.

This module is the Python twin of the C++ `mlakv eval --needle N`: the same
pseudo-random stream (splitmix64), the same draw order, the same token-level
construction and the same answer check, so both sides build identical contexts
for the same eval tokens and score the same trials. docs/needle.md is the spec;
change both together.
"""

from __future__ import annotations

import dataclasses

MASK64 = (1 << 64) - 1
NEEDLE_SEED = 0x6D6C616B765F6E64  # "mlakv_nd"
GOLDEN = 0x9E3779B97F4A7C15
DEPTHS = (0.05, 0.25, 0.5, 0.75, 0.95)
NUM_LENGTHS = 4          # context lengths max_pos * (j + 1) / 4, j = 0..3
NUM_DISTRACTORS = 2      # needles per context = 1 target + 2 distractors
KEY_LETTERS = 6
VALUE_DIGITS = 6
MAX_NEW_TOKENS = 8


class SplitMix64:
    """splitmix64 (Steele, Lea, Flood 2014), one 64-bit state."""

    def __init__(self, seed: int):
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + GOLDEN) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """A draw in [0, n): next() mod n (the bias is irrelevant here and keeps C++ simple)."""
        return self.next() % n


def draw_key(rng: SplitMix64) -> str:
    return "".join(chr(ord("a") + rng.below(26)) for _ in range(KEY_LETTERS))


def draw_value(rng: SplitMix64) -> str:
    return "".join(chr(ord("0") + rng.below(10)) for _ in range(VALUE_DIGITS))


def definition_text(key: str, value: str) -> str:
    return f"\n# key {key} = {value}\n"


def recall_text(key: str) -> str:
    return f"\n# key {key} ="


@dataclasses.dataclass
class Trial:
    index: int
    context_len: int        # L: prompt tokens + MAX_NEW_TOKENS <= L
    depth: float            # target needle's depth in the haystack
    key: str
    value: str
    prompt: list[int]       # haystack with the needles planted, then the recall prompt
    target_pos: int         # token index in `prompt` where the target definition starts
    keys: list[str] = dataclasses.field(default_factory=list)      # target first
    values: list[str] = dataclasses.field(default_factory=list)
    positions: list[int] = dataclasses.field(default_factory=list)  # haystack insert positions
    offset: int = 0         # haystack start in the eval tokens
    haystack_len: int = 0


def context_lengths(max_pos: int) -> list[int]:
    return [max_pos * (j + 1) // NUM_LENGTHS for j in range(NUM_LENGTHS)]


def build_trial(i: int, eval_tokens, encode, max_pos: int) -> Trial:
    """Trial i over the tokenized eval text. `encode(str) -> list[int]` tokenizes
    without special tokens."""
    lengths = context_lengths(max_pos)
    L = lengths[i % NUM_LENGTHS]
    depth = DEPTHS[(i // NUM_LENGTHS) % len(DEPTHS)]
    rng = SplitMix64(NEEDLE_SEED ^ ((i * GOLDEN) & MASK64))
    keys, values = [], []
    for _ in range(1 + NUM_DISTRACTORS):
        k = draw_key(rng)
        while k in keys:
            k = draw_key(rng)
        keys.append(k)
        values.append(draw_value(rng))
    defs = [encode(definition_text(k, v)) for k, v in zip(keys, values)]
    recall = encode(recall_text(keys[0]))
    H = L - sum(len(d) for d in defs) - len(recall) - MAX_NEW_TOKENS
    T = len(eval_tokens)
    if H <= 0 or T < H:
        raise ValueError(f"needle trial {i}: needs {H} haystack tokens, eval text has {T}")
    offset = rng.below(T - H + 1)
    depths = [depth] + [rng.below(1000) / 1000.0 for _ in range(NUM_DISTRACTORS)]
    positions = [int(d * H) for d in depths]
    hay = list(eval_tokens[offset:offset + H])
    # plant in increasing position; ties keep needle order (target first)
    order = sorted(range(len(defs)), key=lambda n: (positions[n], n))
    prompt, cursor, target_pos = [], 0, -1
    for n in order:
        prompt.extend(hay[cursor:positions[n]])
        cursor = positions[n]
        if n == 0:
            target_pos = len(prompt)
        prompt.extend(defs[n])
    prompt.extend(hay[cursor:])
    prompt.extend(recall)
    assert len(prompt) + MAX_NEW_TOKENS == L
    return Trial(i, L, depth, keys[0], values[0], prompt, target_pos, keys, values, positions, offset, H)


def is_found(generated_text: str, value: str) -> bool:
    """The answer check: generated text, leading spaces removed, starts with the
    value and the value is not followed by a further digit."""
    s = generated_text.lstrip(" ")
    if not s.startswith(value):
        return False
    rest = s[len(value):]
    return not (rest[:1].isdigit() and rest[:1].isascii())


def stops(token_text: str) -> bool:
    """Greedy decoding stops after the first generated token whose text holds a newline."""
    return "\n" in token_text


def main():
    """Writes the trials as a JSON fixture (what the C++ implementation is tested against)."""
    import argparse
    import hashlib
    import json
    import struct
    from tokenizers import Tokenizer
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--model", required=True, help="model directory (tokenizer.json, config.json)")
    ap.add_argument("--eval-text", required=True)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reference-log", default=None, help="train_log.txt whose 'needle miss' lines mark failed trials")
    a = ap.parse_args()
    tok = Tokenizer.from_file(f"{a.model}/tokenizer.json")
    max_pos = json.load(open(f"{a.model}/config.json"))["max_position_embeddings"]
    text = open(a.eval_text, encoding="utf-8").read()
    ids = tok.encode(text, add_special_tokens=False).ids

    def enc(s):
        return tok.encode(s, add_special_tokens=False).ids

    trials = []
    for i in range(a.trials):
        t = build_trial(i, ids, enc, max_pos)
        trials.append({
            "index": i, "context_len": t.context_len, "depth": t.depth,
            "keys": t.keys, "values": t.values, "positions": t.positions,
            "offset": t.offset, "haystack_len": t.haystack_len, "target_pos": t.target_pos,
            "prompt_len": len(t.prompt),
            "prompt_sha256_int32le": hashlib.sha256(struct.pack(f"<{len(t.prompt)}i", *t.prompt)).hexdigest(),
            "prompt_head": t.prompt[:8], "prompt_tail": t.prompt[-16:],
        })
    doc = {
        "spec": "docs/needle.md", "model": a.model, "eval_text": a.eval_text,
        "eval_text_sha256": hashlib.sha256(text.encode()).hexdigest(), "eval_tokens": len(ids),
        "max_position_embeddings": max_pos, "splitmix64_seed0_first3": [
            f"0x{v:016x}" for v in (lambda r: [r.next(), r.next(), r.next()])(SplitMix64(0))],
        "trials": trials,
    }
    if a.reference_log:
        # found / not found per trial as the training run's float32 transformers eval scored it
        missed = set()
        for line in open(a.reference_log, encoding="utf-8"):
            if line.startswith("needle miss: trial "):
                missed.add(int(line.split()[3]))
        doc["reference"] = f"{a.reference_log}: transformers, float32, DynamicCache"
        for t in trials:
            t["found_reference"] = t["index"] not in missed
    body = ",\n".join("  " + json.dumps(t) for t in doc.pop("trials"))
    with open(a.out, "w") as f:
        f.write(json.dumps(doc, indent=1)[:-2] + ',\n "trials": [\n' + body + "\n ]\n}\n")
    json.load(open(a.out))


if __name__ == "__main__":
    main()
