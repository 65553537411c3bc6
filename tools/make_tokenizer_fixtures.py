#!/usr/bin/env python3
# Makes the tokenizer parity fixtures of tests/tokenizer_test.cc (docs/tokenizer.md).
#
#   pip install tokenizers==0.23.3        # the version the fixtures were made with
#   python3 tools/make_tokenizer_fixtures.py [--out tests/data/tokenizer]
#
# It TRAINS small byte-level BPE tokenizers with the Hugging Face `tokenizers` library on
# a multilingual corpus written below (deterministic: no files, no network), configured
# like the tokenizers mlakv must read:
#   ds3/   DeepSeek-V3's pre-tokenizer (Sequence of three Split regexes, then
#          ByteLevel(add_prefix_space=false, use_regex=false)), a TemplateProcessing
#          post-processor that prepends BOS, special and non-special added tokens with
#          lstrip / rstrip / single_word, merges saved as [a, b] pairs, and a
#          tokenizer_config.json naming bos/eos;
#   gpt2/  a lone ByteLevel(add_prefix_space=true, use_regex=true), a ByteLevel
#          post-processor, <|endoftext|>, merges rewritten in the legacy "a b" form;
#   glm/   ds3's trained model under GLM-4's single Split regex ((?i:'s|...) form) with
#          ignore_merges=true.
# and cases.json: for every tokenizer and every text, the library's ids with and
# without special tokens and its decode (skip_special_tokens=False). The texts cover
# letters of many scripts, CJK, ASCII and non-ASCII digits, punctuation, symbols,
# emoji with modifiers and ZWJ sequences, combining marks, whitespace runs (\r\n, tabs,
# NBSP, U+3000) and added tokens inside text, plus seeded random strings over the same
# classes.
import argparse
import json
import os
import random
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PINNED = "0.23.3"

# DeepSeek-V3's tokenizer.json pre_tokenizer (the three Split patterns, all Isolated).
DS3_PATTERNS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
# GLM-4's tokenizer.json Split pattern.
GLM_PATTERN = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\r\n]*|"
               "\\s*[\r\n]+|\\s+(?!\\S)|\\s+")

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a test; we'll see what they've done.",
    "In 2024 the model read 1048576 tokens at 3.14159 tokens per second, or 12,345.67 per hour.",
    "def encode(self, text):\n    return [self.vocab[t] for t in text.split()]  # comment\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\r\nreturn sum;\r\n",
    "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Καλημέρα κόσμε, η γλώσσα μου έδωσαν ελληνική.",
    "مرحبا بالعالم، هذه جملة عربية مع أرقام ١٢٣٤٥٦٧٨٩٠.",
    "नमस्ते दुनिया, यह हिन्दी का वाक्य है १२३४५।",
    "你好，世界！今天天气很好，我们去公园散步吧。人工智能和机器学习。",
    "こんにちは世界。カタカナとひらがなと漢字を混ぜた日本語の文です。",
    "안녕하세요 세계, 한국어 문장입니다.",
    "สวัสดีชาวโลก ภาษาไทย ๑๒๓",
    "Emoji: 😀 😃 👍🏽 ❤️ 👨‍👩‍👧‍👦 🇫🇷 🎉✨",
    "Math: ∑ x² ≤ ∞ → ± ½ ¾ © ® ™ € £ ¥ § ¶ ° µ",
    "Tabs\tand\t\tspaces   and\u00a0nbsp and\u3000ideographic space.\n\n",
    "Combining: e\u0301 n\u0303 a\u0308 o\u0302 café naïve Zürich Ångström",
    "ＡＢＣ１２３ fullwidth, Ⅻ roman, 𝟘𝟙𝟚 math digits, ٣ ٤ ٥",
    "\"Quotes\" 'single' «guillemets» „German“ — dashes – and… ellipsis!!! ???",
]

TEXTS = [
    "",
    " ",
    "   ",
    "\n",
    "\r\n",
    "Hello, world!",
    "Hello world, it's 2024; we'll see. I'm you're they've he'd DON'T IT'S",
    "The quick brown fox jumps over the lazy dog 1234567890 12 123 1234",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Καλημέρα κόσμε",
    "مرحبا بالعالم ١٢٣٤٥",
    "नमस्ते दुनिया १२३",
    "你好，世界！今天天气很好。",
    "こんにちは世界、カタカナとひらがな。",
    "안녕하세요 세계",
    "สวัสดีชาวโลก ๑๒๓",
    "ABC日本語def123456漢字ｶﾀｶﾅ",
    "I \u2764\ufe0f emoji \U0001F600\U0001F44D\U0001F3FD family \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 "
    "flag \U0001F1EB\U0001F1F7 keycap 1\ufe0f\u20e3",
    "e\u0301 n\u0303 a\u0308\u0304 Z\u0324\u0354\u0367\u0311 \u0915\u094d\u0937",
    "line1\r\nline2\n\n\tTabbed\t\tx   spaces  \u00a0nbsp\u3000ideographic\u2003em\u2028sep end  ",
    "  leading and trailing  \n  ",
    "\u2211 x\u00b2 \u2264 \u221e \u2192 \u00b1 \u00a9 \u00ae \u2122 \u20ac \u00a3 \u00a5 \u00a7 \u00b6 \u00b0 \u00b5 \u00bd",
    "\U0001D518\U0001D52B\U0001D526\U0001D520\U0001D52C\U0001D521\U0001D522 \U0001D7D8\U0001D7D9\U0001D7DA \u216b \u00be",
    "\uff21\uff22\uff23\uff11\uff12\uff13",
    "def f(x):\n    return x**2  # comment\n\nclass A(B):\n\tpass\n",
    "!!! ??? ... --- ''' \"\" ((( ))) [[x]] {y} <z> @#$%^&*_+=|\\/~`",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "\u0000\u0001\u001f\u007f control \u0085 nel",
    BOS + "Hello" + USER + "hi there" + ASSISTANT + "<think>ok</think>  done" + EOS,
    "text " + EOS + " more " + BOS + BOS + "x",
    "word   <mask>   next <mask>end",
    "a[WORD]b [WORD] c [WORD]",
    "<mask>",
    "  <mask>  ",
    "<\uff5cbegin\u2581of",
    "thinking<think>inside</think>after <ñ> and<ñ>",
    "<|endoftext|>The end.<|endoftext|>",
    "Le café naïve de Zürich coûte 3,50 € — d'accord?",
    "In 2024 the model read 1048576 tokens at 3.14159 tokens per second.",
]

RANDOM_POOL = (
    "abcxyzABCXYZ" "0123456789" "абвгдЖЗИ" "αβγΩ" "你好世界中文" "ひらがなカタカナ" "한국어" "مرحبا" "नमस्ते"
    "١٢٣٤" "०१२" "๑๒" "\uff11\uff12" "\u216b\u00b2\u00bd" ".,;:!?'\"()[]{}-_/\\@#%&*" "€$£¥©®™∑∞→±°"
    "\u0301\u0308\u0303\u094d" "\U0001F600\U0001F44D\U0001F3FD\u2764\ufe0f\u200d\U0001F468\U0001F1EB\U0001F1F7"
    "       \t\t\n\n\r\u00a0\u3000\u2003"
)


def random_texts(n, seed=1234):
    rng = random.Random(seed)
    out = []
    pieces = [BOS, EOS, USER, "<think>", "</think>", "<mask>", "[WORD]", "<|endoftext|>"]
    for _ in range(n):
        length = rng.randint(1, 60)
        s = "".join(rng.choice(RANDOM_POOL) for _ in range(length))
        if rng.random() < 0.3:
            p = rng.randint(0, len(s))
            s = s[:p] + rng.choice(pieces) + s[p:]
        out.append(s)
    return out


def corpus_lines():
    # Repetition lets frequent pairs win; a rotation per repeat varies the contexts.
    lines = []
    for r in range(20):
        for i, line in enumerate(CORPUS):
            words = line.split(" ")
            k = (r * 7 + i) % max(1, len(words))
            lines.append(" ".join(words[k:] + words[:k]))
    return lines


def train(pre_tokenizer, specials, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return tok


def make_ds3():
    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DS3_PATTERNS] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    specials = [AddedToken(t, special=True, normalized=False) for t in (BOS, EOS, USER, ASSISTANT)]
    tok = train(pre, specials, 1100)
    tok.add_tokens([AddedToken("<think>", normalized=True), AddedToken("</think>", normalized=False),
                    AddedToken("<ñ>", normalized=False)])
    tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, rstrip=True, normalized=False),
                            AddedToken("[WORD]", special=True, single_word=True, normalized=False)])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    return tok


def make_gpt2():
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
                [AddedToken("<|endoftext|>", special=True, normalized=False)], 800)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tok


def legacy_merges(tok):
    j = json.loads(tok.to_str())
    merges = j["model"]["merges"]
    assert all(" " not in a and " " not in b for a, b in merges)
    j["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def make_glm(ds3):
    j = json.loads(ds3.to_str())
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GLM_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    j["model"]["ignore_merges"] = True
    # GLM ships a ByteLevel post-processor (no BOS added by the template).
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "tokenizer"))
    args = ap.parse_args()
    if tokenizers.__version__ != PINNED:
        print(f"error: tokenizers {tokenizers.__version__} installed, the fixtures pin {PINNED}", file=sys.stderr)
        return 1
    ds3 = make_ds3()
    toks = {"ds3": ds3, "gpt2": legacy_merges(make_gpt2()), "glm": make_glm(ds3)}
    texts = TEXTS + random_texts(60)
    cases = {"tokenizers_version": tokenizers.__version__, "tokenizers": {}}
    for name, tok in toks.items():
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tok.to_str())  # the library's own serialization (compact)
        if name == "gpt2":  # to_str() writes pairs again: keep the legacy "a b" form on disk
            j = json.loads(tok.to_str())
            j["model"]["merges"] = [f"{a} {b}" for a, b in j["model"]["merges"]]
            write_json(os.path.join(d, "tokenizer.json"), j)
            assert Tokenizer.from_file(os.path.join(d, "tokenizer.json")).encode("Hello there").ids == \
                tok.encode("Hello there").ids
        rows = []
        for t in texts:
            with_special = tok.encode(t).ids
            bare = tok.encode(t, add_special_tokens=False).ids
            rows.append({"text": t, "ids": with_special, "ids_bare": bare,
                         "decoded": tok.decode(with_special, skip_special_tokens=False),
                         "decoded_skip": tok.decode(with_special, skip_special_tokens=True)})
        cases["tokenizers"][name] = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": rows}
    write_json(os.path.join(args.out, "ds3", "tokenizer_config.json"),
               {"add_bos_token": True, "add_eos_token": False,
                "bos_token": {"__type": "AddedToken", "content": BOS, "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False},
                "eos_token": EOS, "tokenizer_class": "LlamaTokenizerFast"})
    write_json(os.path.join(args.out, "cases.json"), cases)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(args.out) for f in fs)
    print(f"wrote {args.out}: {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
