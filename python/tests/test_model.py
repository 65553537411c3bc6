"""mlakv.Model on the shipped model (models/mlakv-ds3-tiny) against the CLI on the same input:
`mlakv eval --json`, `mlakv generate --json` and `mlakv calibrate --model`; and its errors."""
import json
import os
import pathlib
import subprocess
import threading
import time

import numpy as np
import pytest

import mlakv

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "mlakv-ds3-tiny"
CLI = os.environ.get("MLAKV_CLI")
needs_cli = pytest.mark.skipif(not CLI, reason="MLAKV_CLI (the mlakv CLI's path) is not set (ctest sets it)")

# Rows differ only in timing; every other number is computed by the same deterministic code.
TIMING = {"tokens_per_s"}


@pytest.fixture(scope="module")
def model():
    return mlakv.Model.load(str(TINY), threads=1)


@pytest.fixture(scope="module")
def text():
    # Enough for 2 windows of 64 tokens, a calibration window after them, and a needle trial.
    return (TINY / "eval.txt").read_text(encoding="utf-8")[:60000]


@pytest.fixture
def text_file(tmp_path, text):
    p = tmp_path / "input.txt"
    p.write_text(text, encoding="utf-8")
    return p


def cli(*args):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def same_report(a, b):
    """Two eval reports equal in keys and in every number but the timings."""
    assert a.keys() == b.keys()
    for k in a:
        if k == "formats":
            assert len(a[k]) == len(b[k])
            for ra, rb in zip(a[k], b[k]):
                assert ra.keys() == rb.keys()
                for key in ra:
                    if key not in TIMING:
                        assert ra[key] == rb[key], (ra["format"], key, ra[key], rb[key])
        elif k == "reference":
            for key in a[k]:
                if key not in TIMING:
                    assert a[k][key] == b[k][key], (key, a[k][key], b[k][key])
        else:
            assert a[k] == b[k], k


def test_properties(model):
    cfg = json.loads((TINY / "config.json").read_text())
    assert model.num_layers == cfg["num_hidden_layers"]
    assert model.vocab_size == cfg["vocab_size"]
    c = model.config
    for key in ("hidden_size", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank",
                "max_position_embeddings", "vocab_size", "n_routed_experts", "num_experts_per_tok",
                "moe_intermediate_size", "intermediate_size", "n_shared_experts"):
        assert c[key] == cfg[key], key
    assert c["num_heads"] == cfg["num_attention_heads"]
    assert c["model_type"] == "deepseek_v3"
    assert c["num_moe_layers"] == cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
    assert model.memory["checkpoint_bytes"] > 0
    assert model.path == str(TINY)


def test_tokenizer(model, text):
    tok = model.tokenizer
    assert tok.vocab_size == model.vocab_size
    ids = tok.encode(text[:2000], add_special_tokens=False)
    assert all(0 <= i < model.vocab_size for i in ids)
    assert tok.decode(ids) == text[:2000]
    assert model.encode("hello world", add_special_tokens=False) == tok.encode("hello world", add_special_tokens=False)
    cfg = json.loads((TINY / "config.json").read_text())
    assert tok.eos_id == cfg["eos_token_id"] and tok.bos_id == cfg["bos_token_id"]
    assert model.encode("hello") == tok.encode("hello", add_special_tokens=True)
    assert tok.token_to_id(tok.id_to_token(123)) == 123
    standalone = mlakv.Tokenizer.load(str(TINY))
    assert standalone.encode(text[:500]) == tok.encode(text[:500])


@needs_cli
def test_eval_matches_the_cli(model, text, text_file):
    args = dict(context=64, windows=2, formats=["bf16", "f32", "fp8_ds_mla", "nvfp4_ds_mla"], scales="auto",
                calib_windows=1, needle=1)
    stages = []
    py = model.eval(text, progress=lambda what, done, total: stages.append((what, done, total)), **args)
    out = cli("eval", "--model", TINY, "--text", text_file, "--context", 64, "--windows", 2, "--formats",
              "bf16,f32,fp8_ds_mla,nvfp4_ds_mla", "--scales", "auto", "--calib-windows", 1, "--needle", 1,
              "--threads", 1, "--json")
    py["model"] = out["model"]  # the path as each was given
    same_report(py, out)
    rows = [(r["format"], r["scales"]) for r in py["formats"]]
    assert rows == [("bf16", "none"), ("f32", "none"), ("fp8_ds_mla", "none"), ("nvfp4_ds_mla", "none"),
                    ("nvfp4_ds_mla", "auto")]
    f32 = py["formats"][1]
    assert f32["kld_mean"] == 0 and f32["top1_agree"] == 1 and f32["ppl"] == pytest.approx(py["reference"]["ppl"])
    assert py["reference"]["needle_total"] == 1
    # Progress: every stage, counting up to its total.
    for stage in ("calibration (fork recipe)", "eval", "needle"):
        seen = [(d, t) for w, d, t in stages if w == stage]
        assert seen and [d for d, _ in seen] == list(range(1, seen[-1][1] + 1)), stage
    assert [w for w, _, _ in stages] == sorted((w for w, _, _ in stages),
                                               key=["calibration (fork recipe)", "eval", "needle"].index)


@needs_cli
def test_eval_recipes_and_token_scale_match_the_cli(model, text, text_file):
    # --recipe both (outer scales and the latent transform, calibrated after the eval windows)
    # and a per-token scale row, through Model.eval and the CLI: the same rows.
    py = model.eval(text, context=64, windows=2, formats=["fp8_ds_mla", "nvfp4_ds_mla", "nvfp4_ds_mla+token-scale"],
                    scales="auto", recipe="both", calib_windows=1)
    out = cli("eval", "--model", TINY, "--text", text_file, "--context", 64, "--windows", 2, "--formats",
              "fp8_ds_mla,nvfp4_ds_mla,nvfp4_ds_mla+token-scale", "--scales", "auto", "--recipe", "both",
              "--calib-windows", 1, "--threads", 1, "--json")
    py["model"] = out["model"]
    same_report(py, out)
    assert {r["recipe"] for r in py["formats"]} == {"none", "fork", "mlakv"}
    assert any(r["token_scale"] for r in py["formats"])
    # The sign-seed selection's setting goes through both frontends alike (1: no selection).
    py1 = model.eval(text, context=64, windows=2, formats=["nvfp4_ds_mla"], scales="auto", recipe="mlakv",
                     calib_windows=1, seed_candidates=1)
    out1 = cli("eval", "--model", TINY, "--text", text_file, "--context", 64, "--windows", 2, "--formats",
               "nvfp4_ds_mla", "--scales", "auto", "--recipe", "mlakv", "--calib-windows", 1, "--seed-candidates", 1,
               "--threads", 1, "--json")
    py1["model"] = out1["model"]
    same_report(py1, out1)
    with pytest.raises(ValueError, match="seed_candidates"):
        model.eval(text, context=64, windows=2, formats=["nvfp4_ds_mla"], scales="auto", recipe="mlakv",
                   calib_windows=1, seed_candidates=0)
    # importance="file:PATH" (an mlakv_latent_importance_v1 file) as `--importance file:PATH`.
    imp = text_file.parent / "importance.json"
    imp.write_text(json.dumps({"format": "mlakv_latent_importance_v1", "num_layers": 4, "latent_dim": 512,
                               "estimate": "fisher", "layers": [{"w2": [1.0 + i % 5 for i in range(512)]}] * 4}))
    py2 = model.eval(text, context=64, windows=2, formats=["nvfp4_ds_mla"], scales="auto", recipe="mlakv",
                     calib_windows=1, seed_candidates=1, importance=f"file:{imp}")
    out2 = cli("eval", "--model", TINY, "--text", text_file, "--context", 64, "--windows", 2, "--formats",
               "nvfp4_ds_mla", "--scales", "auto", "--recipe", "mlakv", "--calib-windows", 1, "--seed-candidates", 1,
               "--importance", f"file:{imp}", "--threads", 1, "--json")
    py2["model"] = out2["model"]
    same_report(py2, out2)
    with pytest.raises(ValueError, match="importance: unknown estimate 'gradient'"):
        model.eval(text, context=64, windows=2, formats=["nvfp4_ds_mla"], scales="auto", recipe="mlakv",
                   calib_windows=1, importance="gradient")
    imp.write_text(json.dumps({"format": "mlakv_latent_importance_v1", "num_layers": 4, "latent_dim": 512,
                               "estimate": "fisher", "layers": [{"w2": [1.0]}] * 4}))
    with pytest.raises(ValueError, match=r"layers\[0\]\.w2 must be a list of 512"):
        model.eval(text, context=64, windows=2, formats=["nvfp4_ds_mla"], scales="auto", recipe="mlakv",
                   calib_windows=1, importance=f"file:{imp}")


@needs_cli
def test_eval_with_a_scale_file_and_token_ids(model, text, tmp_path):
    ids = model.encode(text, add_special_tokens=False)
    scales = model.calibrate(ids, context=64, windows=2)
    path = tmp_path / "scales.json"
    scales.save(str(path))
    tokens = tmp_path / "tokens.bin"
    np.asarray(ids, dtype="<i4").tofile(tokens)
    out = cli("eval", "--model", TINY, "--tokens", tokens, "--context", 32, "--windows", 2, "--formats",
              "nvfp4_ds_mla_fp8rope", "--scales", path, "--threads", 1, "--json")
    for given in (ids, np.asarray(ids, np.int32), np.asarray(ids, np.int64)):
        py = model.eval(given, context=32, windows=2, formats=["nvfp4_ds_mla_fp8rope"], scales=str(path))
        py["model"] = out["model"]
        same_report(py, out)
    assert [r["scales"] for r in out["formats"]] == ["none", "scales.json"]
    # Text and its token ids are the same input.
    by_text = model.eval(text, context=32, windows=2, formats=["bf16"])
    by_ids = model.eval(ids, context=32, windows=2, formats=["bf16"])
    same_report(by_text, by_ids)


@needs_cli
def test_calibrate_matches_the_cli(model, text, text_file, tmp_path):
    s = model.calibrate(text, context=64, windows=2)
    out = tmp_path / "cli_scales.json"
    r = subprocess.run([CLI, "calibrate", "--model", str(TINY), "--text", str(text_file), "--context", "64",
                        "--windows", "2", "--threads", "1", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    c = mlakv.load_outer_scales(str(out))
    assert s.num_layers == c.num_layers == model.num_layers
    assert s.scales == c.scales and s.max_abs == c.max_abs
    # The saved file is the same scale file (the format the CLI reads back).
    mine = tmp_path / "py_scales.json"
    s.save(str(mine))
    assert mlakv.load_outer_scales(str(mine)).scales == c.scales


@needs_cli
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4_ds_mla", "reference"])
def test_generate_matches_the_cli(model, fmt):
    prompt = "The quick brown fox"
    py = model.generate(prompt, format=fmt, max_tokens=12)
    out = cli("generate", "--model", TINY, "--prompt", prompt, "--format", fmt, "--max-tokens", 12, "--threads", 1,
              "--json")
    assert py.keys() == out.keys()
    for k in py:
        if not k.endswith("tokens_per_s"):
            assert py[k] == out[k], k
    assert py["generated_tokens"] == len(py["tokens"]) >= 1
    # Token ids give the same continuation, and the text is theirs.
    again = model.generate(model.encode(prompt), format=fmt, max_tokens=12)
    assert again["tokens"] == py["tokens"]
    assert model.decode(py["tokens"], skip_special_tokens=True) == py["text"]


def test_the_gil_is_released_during_eval(text):
    m = mlakv.Model.load(str(TINY), threads=1)
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.002)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        t0 = time.perf_counter()
        m.eval(text, context=256, windows=2, formats=["bf16", "fp8_ds_mla", "nvfp4_ds_mla"])
        t1 = time.perf_counter()
    finally:
        done.set()
        t.join()
    inside = [x for x in ticks if t0 < x < t1]
    # A call holding the GIL for its whole run would let the ticker in at most at its edges.
    assert t1 - t0 > 0.05
    assert len(inside) >= 5, (len(inside), t1 - t0)


def test_bad_arguments_raise(model, text, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        mlakv.Model.load(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="threads"):
        mlakv.Model.load(str(TINY), threads=-1)
    with pytest.raises(ValueError, match="unknown format 'fp9'"):
        model.eval(text, context=32, windows=1, formats=["bf16", "fp9"])
    with pytest.raises(ValueError, match="no format given"):
        model.eval(text, context=32, windows=1, formats=[])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.eval(text, context=8192, windows=1)
    with pytest.raises(ValueError, match="the input has 3 tokens"):
        model.eval([1, 2, 3], context=32, windows=1)
    with pytest.raises(ValueError, match="token id 5000 at position 1"):
        model.eval([1, 5000, 3], context=2, windows=1)
    with pytest.raises(ValueError, match="token id -1"):
        model.eval(np.array([1, -1, 3], np.int32), context=2, windows=1)
    with pytest.raises(ValueError, match="1-D int32/int64"):
        model.eval(np.zeros((2, 2), np.int32), context=2, windows=1)
    with pytest.raises(TypeError, match="expected text"):
        model.eval({"a": 1}, context=2, windows=1)
    with pytest.raises(TypeError, match="str"):
        model.eval(b"bytes", context=2, windows=1)
    with pytest.raises(ValueError, match="the text is empty"):
        model.eval("", context=2, windows=1)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        model.eval(text, context=32, windows=1, formats=["nvfp4_ds_mla"], scales=str(tmp_path / "missing.json"))
    short = tmp_path / "two_layers.json"
    mlakv.outer_scales_from_max_abs([1.0, 2.0]).save(str(short))
    with pytest.raises(ValueError, match="2 layers, the model has 4"):
        model.eval(text, context=32, windows=1, formats=["nvfp4_ds_mla"], scales=str(short))
    with pytest.raises(ValueError, match="scales auto"):
        model.eval(text[:3000], context=256, windows=2, formats=["nvfp4_ds_mla"], scales="auto", calib_windows=50)
    with pytest.raises(ValueError, match="needle"):
        model.eval(text, context=32, windows=1, needle=-1)

    def boom(what, done, total):
        raise KeyError("from the progress callback")

    with pytest.raises(KeyError, match="from the progress callback"):
        model.eval(text, context=32, windows=1, formats=["bf16"], progress=boom)
    with pytest.raises(ValueError, match="max_tokens"):
        model.generate("hi", max_tokens=0)
    with pytest.raises(ValueError, match="exceed max_position_embeddings"):
        model.generate("hi", max_tokens=5000)
    with pytest.raises(ValueError, match="unknown format 'fp9'"):
        model.generate("hi", format="fp9")
    with pytest.raises(ValueError, match="has no outer scale"):
        model.generate("hi", format="bf16", scales=str(short))
    with pytest.raises(ValueError, match="context 8192 exceeds"):
        model.calibrate(text, context=8192, windows=1)
    with pytest.raises(ValueError, match="the input has"):
        model.calibrate([1, 2], context=64, windows=1)
    # The model still works after every error.
    assert model.generate("hi", max_tokens=2)["generated_tokens"] >= 1


def test_a_model_without_a_tokenizer(tmp_path):
    # The checkpoint without tokenizer.json: token ids work, text names the problem.
    d = tmp_path / "m"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        (d / f).symlink_to(TINY / f)
    m = mlakv.Model.load(str(d), threads=1)
    assert not m.has_tokenizer
    with pytest.raises(ValueError, match="no tokenizer.json"):
        m.tokenizer
    with pytest.raises(ValueError, match="no tokenizer.json"):
        m.eval("some text", context=2, windows=1)
    g = m.generate([0, 5, 6, 7], max_tokens=3)
    assert g["text"] is None and g["generated_tokens"] == 3
    with pytest.raises(ValueError, match="needle"):
        m.eval(list(range(100)), context=32, windows=1, needle=1)
