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
    return Trial(i, L, depth, keys[0], values[0], prompt, target_pos)


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
