"""torch.ops.mlakv against the nanobind API (the same C++ calls), a torch.compile trace through
the fake implementations, and (on a GPU) a CUDA graph replay through the custom ops."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import mlakv  # noqa: E402
import reference as ref  # noqa: E402

import mlakv.torch_ops as ops  # noqa: E402


def test_the_built_library_loads():
    # Built but not loadable is a failure, not a skip.
    if not ops.built:
        pytest.skip("built without torch >= 2.10")
    assert ops.load_error is None, ops.load_error


needs_ops = pytest.mark.skipif(not ops.available, reason="torch.ops.mlakv not built or not loadable")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and mlakv.cuda_available() else [])


def _case(device, fmt, T=150, H=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    rb = mlakv.record_bytes(fmt)
    nb = (T + 63) // 64
    kv = torch.zeros(nb, 64, rb, dtype=torch.uint8, device=device)
    lat, rope = torch.randn(T, 512, generator=g).to(device), torch.randn(T, 64, generator=g).to(device)
    slots = torch.arange(T, device=device)
    q = torch.randn(1, 1, H, 576, generator=g).to(device)
    table = torch.arange(nb, dtype=torch.int32, device=device).reshape(1, nb)
    seqlens = torch.tensor([T], dtype=torch.int32, device=device)
    return kv, slots, lat, rope, q, table, seqlens


@needs_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla", "nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"])
def test_ops_match_the_binding(device, fmt):
    kv, slots, lat, rope, q, table, seqlens = _case(device, fmt)
    ops.write_cache(kv, slots, lat, rope, format=fmt)
    out = torch.empty(1, 1, 16, 512, device=device)
    lse = torch.empty(1, 1, 16, device=device)
    ops.mla_decode(q, kv, table, seqlens, out, lse, format=fmt, softmax_scale=0.1)
    if device == "cuda":
        torch.cuda.synchronize()
    ref_kv = np.zeros(tuple(kv.shape), np.uint8)
    mlakv.write_cache(ref_kv, slots.cpu().numpy(), lat.cpu().numpy(), rope.cpu().numpy(), format=fmt)
    np.testing.assert_array_equal(kv.cpu().numpy(), ref_kv)
    ref_o, ref_l = mlakv.mla_decode(q.cpu().numpy(), mlakv.cache_layer(ref_kv, fmt), table.cpu().numpy(),
                                    seqlens.cpu().numpy(), softmax_scale=0.1)
    err = np.linalg.norm(out.cpu().numpy() - ref_o) / np.linalg.norm(ref_o)
    assert err < (1e-6 if device == "cpu" else 2 ** -6), err


NVFP4 = ["nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"]


@needs_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", NVFP4)
def test_token_scale_mode_through_the_ops(device, fmt):
    # The per-token scale mode (s_t at bytes [292, 296) replacing s_l): the ops' records are the
    # library's CPU codec's bytes (mlakv.encode(token_scale=True)), and both decode ops attend
    # to them as the independent numpy reader decodes them (reference.decode, float64 attention).
    T, H = 150, 16
    kv, slots, lat, rope, q, table, seqlens = _case(device, fmt, T=T, H=H, seed=3)
    # Token magnitudes over 3.5 decades (and one all-zero token, s_t = 0): what the mode is for;
    # small enough that the softmax is not one-hot.
    mag = torch.logspace(-3, 0.5, T)
    mag[7] = 0.0
    lat.mul_(mag.to(device)[:, None])
    ops.write_cache(kv, slots, lat, rope, format=fmt, token_scale=True)
    out = torch.empty(1, 1, H, 512, device=device)
    lse = torch.empty(1, 1, H, device=device)
    ops.mla_decode(q, kv, table, seqlens, out, lse, format=fmt, softmax_scale=0.1, token_scale=True)
    idx = slots.to(torch.int32).view(1, 1, T)
    out_s = torch.empty(1, 1, H, 512, device=device)
    lse_s = torch.empty(1, 1, H, device=device)
    ops.mla_decode_sparse(q, kv, idx, out_s, lse_s, format=fmt, softmax_scale=0.1, token_scale=True)
    # Read without the mode, the same records mean something else (s_l = 1 instead of s_t).
    out_n = torch.empty(1, 1, H, 512, device=device)
    ops.mla_decode(q, kv, table, seqlens, out_n, torch.empty(1, 1, H, device=device), format=fmt, softmax_scale=0.1)
    if device == "cuda":
        torch.cuda.synchronize()
    flat = kv.cpu().numpy().reshape(-1, mlakv.record_bytes(fmt))
    np.testing.assert_array_equal(flat[:T], mlakv.encode(lat.cpu().numpy(), rope.cpu().numpy(), fmt, token_scale=True))
    st = flat[:T, 292:296].copy().view(np.float32)[:, 0]
    assert st[7] == 0 and np.all(st[np.arange(T) != 7] > 0)
    kl, kr = ref.decode(flat[:T], fmt, token_scale=True)
    ro, rl = ref.attention(q.cpu().numpy()[0, 0], np.concatenate([kl, kr], axis=1), 0.1, T)
    # CPU: float32 accumulation of a 150-token softmax against float64; CUDA: bf16 q/K tiles (2^-8
    # relative per operand, as test_ops_match_the_binding bounds them).
    tol = 2e-4 if device == "cpu" else 2 ** -6
    for o, l_ in ((out, lse), (out_s, lse_s)):
        err = np.abs(o.cpu().numpy()[0, 0] - ro).max() / np.abs(ro).max()
        assert err < tol, err
        np.testing.assert_allclose(l_.cpu().numpy()[0, 0], rl, rtol=tol, atol=tol)
    wrong = np.abs(out_n.cpu().numpy()[0, 0] - ro).max() / np.abs(ro).max()
    assert wrong > 100 * tol, wrong
    assert np.abs(ro).max() < 0.9 * np.abs(kl).max()  # a spread softmax, not one token's latent
    # The checking wrappers refuse what the mode is not (fp8 records; an outer scale beside s_t).
    with pytest.raises(ValueError, match="token_scale"):
        ops.write_cache(kv, slots, lat, rope, format=fmt, token_scale=True, outer_scale=0.5)
    with pytest.raises(ValueError, match="token_scale"):
        ops.mla_decode(q, kv, table, seqlens, out, lse, format=fmt, softmax_scale=0.1, token_scale=1)


def _mlakv_recipe_transform(seed):
    """An mlakv-recipe calibration file (mlakv_latent_transform_v2) with the nvfp4 scale search,
    one layer, as `mlakv calibrate --recipe mlakv` writes it."""
    import json
    rng = np.random.default_rng(seed)
    layer = {"mu": (0.3 * rng.standard_normal(512)).astype(np.float32).tolist(),
             "d": np.exp(0.4 * rng.standard_normal(512)).astype(np.float32).tolist(),
             "rotate": True, "sign_seed": 11, "rope_rotate": True, "rope_sign_seed": 12, "outer_scale": 0.002}
    return mlakv.parse_latent_transform(json.dumps({
        "format": "mlakv_latent_transform_v2", "num_layers": 1, "latent_dim": 512, "rope_dim": 64,
        "denominator": 2688.0, "importance": "uniform", "nvfp4_scales": "search", "layers": [layer]}))


@needs_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", NVFP4)
def test_nvfp4_scale_search_through_the_ops(device, fmt):
    # A cache written from PyTorch with an mlakv-recipe calibration (transformed latents, the
    # file's s_l and its nvfp4_scales "search") holds the C++ scalar codec's bytes
    # (mlakv.encode, src/format/record_codec.h) and the binding's writer's; the same call with
    # "rn" holds the RN bytes, which differ: the option reaches the writer.
    T = 150
    kv, slots, lat, rope, q, table, seqlens = _case(device, fmt, T=T, seed=4)
    t = _mlakv_recipe_transform(4)
    assert t.nvfp4_scales == "search"
    c2, k2 = t.apply(0, lat.cpu().numpy(), rope.cpu().numpy())
    s_l = t.outer_scales[0]
    ops.write_cache(kv, slots, torch.from_numpy(c2).to(device), torch.from_numpy(k2).to(device), format=fmt,
                    outer_scale=s_l, nvfp4_scales=t.nvfp4_scales)
    kv_rn = torch.zeros_like(kv)
    ops.write_cache(kv_rn, slots, torch.from_numpy(c2).to(device), torch.from_numpy(k2).to(device), format=fmt,
                    outer_scale=s_l)
    if device == "cuda":
        torch.cuda.synchronize()
    rb = mlakv.record_bytes(fmt)
    got = kv.cpu().numpy().reshape(-1, rb)[:T]
    want = mlakv.encode(c2, k2, fmt, outer_scale=s_l, nvfp4_scales="search")
    np.testing.assert_array_equal(got, want)
    ref_kv = np.zeros(tuple(kv.shape), np.uint8)
    mlakv.write_cache(ref_kv, slots.cpu().numpy(), c2, k2, format=fmt, outer_scale=s_l, nvfp4_scales="search")
    np.testing.assert_array_equal(kv.cpu().numpy(), ref_kv)
    rn = kv_rn.cpu().numpy().reshape(-1, rb)[:T]
    np.testing.assert_array_equal(rn, mlakv.encode(c2, k2, fmt, outer_scale=s_l))
    moved = (got[:, 256:288] != rn[:, 256:288]).mean()  # the group scale bytes the search changed
    assert 0.1 < moved < 0.9, moved
    # The readers need nothing: the op's decode of the search records is the binding's.
    out = torch.empty(1, 1, 16, 512, device=device)
    lse = torch.empty(1, 1, 16, device=device)
    ops.mla_decode(q, kv, table, seqlens, out, lse, format=fmt, softmax_scale=0.1, outer_scale=s_l)
    if device == "cuda":
        torch.cuda.synchronize()
    ref_o, _ = mlakv.mla_decode(q.cpu().numpy(), mlakv.cache_layer(ref_kv, fmt, outer_scale=s_l),
                                table.cpu().numpy(), seqlens.cpu().numpy(), softmax_scale=0.1)
    err = np.linalg.norm(out.cpu().numpy() - ref_o) / np.linalg.norm(ref_o)
    assert err < (1e-6 if device == "cpu" else 2 ** -6), err
    # The checking wrapper refuses what the option is not, naming it.
    with pytest.raises(ValueError, match="nvfp4_scales"):
        ops.write_cache(kv, slots, lat, rope, format=fmt, nvfp4_scales="nearest")
    with pytest.raises(ValueError, match="nvfp4_scales: search does not apply to the per-token scale mode"):
        ops.write_cache(kv, slots, lat, rope, format=fmt, token_scale=True, nvfp4_scales="search")


@needs_ops
def test_nvfp4_scale_search_refused_on_formats_without_it():
    kv, slots, lat, rope, q, table, seqlens = _case("cpu", "fp8_ds_mla")
    with pytest.raises(ValueError, match="nvfp4_scales: search is an encoder option of the nvfp4 formats"):
        ops.write_cache(kv, slots, lat, rope, format="fp8_ds_mla", nvfp4_scales="search")


@needs_ops
def test_token_scale_refused_on_formats_without_it():
    kv, slots, lat, rope, q, table, seqlens = _case("cpu", "fp8_ds_mla")
    with pytest.raises(ValueError, match="token_scale"):
        ops.write_cache(kv, slots, lat, rope, format="fp8_ds_mla", token_scale=True)
    with pytest.raises(ValueError, match="token_scale"):
        ops.mla_decode_sparse(q, kv, table.view(1, 1, -1), torch.empty(1, 1, 16, 512), torch.empty(1, 1, 16),
                              format="fp8_ds_mla", softmax_scale=0.1, token_scale=True)


@needs_ops
def test_bad_arguments_raise():
    kv, slots, lat, rope, q, table, seqlens = _case("cpu", "fp8_ds_mla")
    with pytest.raises(ValueError):
        ops.write_cache(kv, slots, lat, rope, format="fp9")
    with pytest.raises(ValueError, match="latent"):
        ops.write_cache(kv, slots, lat[:, :500], rope, format="fp8_ds_mla")
    with pytest.raises(ValueError, match="kv_cache"):
        ops.write_cache(kv[:, :, :655], slots, lat, rope, format="fp8_ds_mla")
    with pytest.raises(ValueError, match="slot_mapping"):
        ops.write_cache(kv, slots.float(), lat, rope, format="fp8_ds_mla")
    out = torch.empty(1, 1, 16, 511)
    lse = torch.empty(1, 1, 16)
    with pytest.raises(ValueError, match="out"):
        ops.mla_decode(q, kv, table, seqlens, out, lse, format="fp8_ds_mla", softmax_scale=0.1)
    with pytest.raises(ValueError, match="seqlens"):
        ops.mla_decode(q, kv, table, seqlens.long(), torch.empty(1, 1, 16, 512), lse, format="fp8_ds_mla",
                       softmax_scale=0.1)
    with pytest.raises(ValueError, match="softmax_scale"):
        ops.mla_decode(q, kv, table, seqlens, torch.empty(1, 1, 16, 512), lse, format="fp8_ds_mla",
                       softmax_scale=-1.0)


@needs_ops
def test_traces_under_torch_compile():
    kv, slots, lat, rope, q, table, seqlens = _case("cpu", "bf16")
    ops.write_cache(kv, slots, lat, rope, format="bf16")

    def step(q, kv, table, seqlens, out, lse):
        torch.ops.mlakv.mla_decode(q, kv, table, seqlens, out, lse, ops.FORMATS["bf16"], 1.0, 0.1, True, 1, None)
        return out * 2

    out = torch.empty(1, 1, 16, 512)
    lse = torch.empty(1, 1, 16)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(q, kv, table, seqlens, out, lse)
    ref_o, _ = mlakv.mla_decode(q.numpy(), mlakv.cache_layer(kv.numpy(), "bf16"), table.numpy(), seqlens.numpy(),
                                softmax_scale=0.1)
    np.testing.assert_allclose(got.numpy(), 2 * ref_o, rtol=1e-5, atol=1e-6)


@needs_ops
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU")
def test_cuda_graph_replay_through_the_custom_ops():
    fmt = "nvfp4_ds_mla"
    kv, slots, lat, rope, q, table, seqlens = _case("cuda", fmt, T=200)
    out = torch.empty(1, 1, 16, 512, device="cuda")
    lse = torch.empty(1, 1, 16, device="cuda")

    def step():
        ops.write_cache(kv, slots, lat, rope, format=fmt, outer_scale=0.5)
        ops.mla_decode(q, kv, table, seqlens, out, lse, format=fmt, softmax_scale=0.1, outer_scale=0.5)

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        lat.copy_(torch.randn(200, 512, generator=g))
        q.copy_(torch.randn(1, 1, 16, 576, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        ref_kv = np.zeros(tuple(kv.shape), np.uint8)
        mlakv.write_cache(ref_kv, slots.cpu().numpy(), lat.cpu().numpy(), rope.cpu().numpy(), format=fmt,
                          outer_scale=0.5)
        np.testing.assert_array_equal(kv.cpu().numpy(), ref_kv)
        ref_o, _ = mlakv.mla_decode(q.cpu().numpy(), mlakv.cache_layer(ref_kv, fmt, outer_scale=0.5),
                                    table.cpu().numpy(), seqlens.cpu().numpy(), softmax_scale=0.1)
        assert np.linalg.norm(out.cpu().numpy() - ref_o) / np.linalg.norm(ref_o) < 2 ** -6


RAW_CASES = {
    # name: (op call on valid CPU tensors with one argument wrong, what the message names)
    "format": ("torch.ops.mlakv.write_cache(kv, slots, lat, rope, 99, 1.0, False)", "format"),
    "latent": ("torch.ops.mlakv.write_cache(kv, slots, lat[:, :500], rope, F, 1.0, False)", "latent"),
    "kv_cache": ("torch.ops.mlakv.write_cache(kv[:, :, :655], slots, lat, rope, F, 1.0, False)", "kv_cache"),
    "slots": ("torch.ops.mlakv.write_cache(kv, slots.float(), lat, rope, F, 1.0, False)", "slots"),
    "nan": ("torch.ops.mlakv.write_cache(kv, slots, lat * float('nan'), rope, F, 1.0, False)", "nan"),
    "out": ("torch.ops.mlakv.mla_decode(q, kv, table, sl, torch.empty(1, 1, 16, 511), lse, F, 1.0, 0.1, True, 1, "
            "None)", "out"),
    "seqlens": ("torch.ops.mlakv.mla_decode(q, kv, table, sl.long(), out, lse, F, 1.0, 0.1, True, 1, None)",
                "seqlens"),
    "scale": ("torch.ops.mlakv.mla_decode(q, kv, table, sl, out, lse, F, 1.0, -1.0, True, 1, None)",
              "softmax_scale"),
    "splits": ("torch.ops.mlakv.mla_decode(q, kv, table, sl, out, lse, F, 1.0, 0.1, True, 0, None)", "num_splits"),
    "indices": ("torch.ops.mlakv.mla_decode_sparse(q, kv, table.view(1, 1, 3).long(), None, out, lse, F, 1.0, 0.1, "
                "1, None)", "indices"),
    # The per-token scale mode on fp8 records (the C++ check_token_scale refuses it).
    "token_scale": ("torch.ops.mlakv.write_cache(kv, slots, lat, rope, F, 1.0, False, True)", "token_scale"),
    "token_scale_decode": ("torch.ops.mlakv.mla_decode(q, kv, table, sl, out, lse, F, 1.0, 0.1, True, 1, None, True)",
                           "token_scale"),
    # The nvfp4 scale search on fp8 records (the C++ check_nvfp4_scales refuses it).
    "nvfp4_search": ("torch.ops.mlakv.write_cache(kv, slots, lat, rope, F, 1.0, False, False, True)",
                     "nvfp4_scales search"),
}


@needs_ops
@pytest.mark.parametrize("device", DEVICES)
def test_raw_ops_raise_on_bad_arguments(device):
    # torch.ops.mlakv.* called directly (not through the checking wrappers): the kernel's
    # STD_TORCH_CHECK throws, and torch turns it into a RuntimeError naming the argument.
    # In a child process, so that a crash fails this test (naming the case it died in)
    # instead of killing pytest.
    import os
    import subprocess
    import sys
    cases = dict(RAW_CASES)
    if device == "cuda":
        del cases["nan"]  # the CUDA writer does not check for non-finite inputs (include/mlakv/cuda.h)
        cases["device_mismatch"] = ("torch.ops.mlakv.write_cache(kv, slots.cpu(), lat, rope, F, 1.0, False)", "slots")
    elif "cuda" in DEVICES:
        cases["device_mismatch"] = ("torch.ops.mlakv.write_cache(kv, slots.cuda(), lat, rope, F, 1.0, False)", "slots")
    body = "".join(f"""
print("case {name}:", end=" ", flush=True)
try:
    {call}
    print("NO ERROR", flush=True)
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0], flush=True)
""" for name, (call, _) in cases.items())
    code = f"""
import faulthandler, torch, mlakv.torch_ops as ops
faulthandler.enable()
F = ops.FORMATS["fp8_ds_mla"]
d = "{device}"
kv = torch.zeros(3, 64, 656, dtype=torch.uint8, device=d)
slots, lat, rope = torch.arange(150, device=d), torch.randn(150, 512, device=d), torch.randn(150, 64, device=d)
q = torch.randn(1, 1, 16, 576, device=d)
table = torch.arange(3, dtype=torch.int32, device=d).view(1, 3)
sl = torch.tensor([150], dtype=torch.int32, device=d)
out, lse = torch.empty(1, 1, 16, 512, device=d), torch.empty(1, 1, 16, device=d)
""" + body + "print('all cases ran', flush=True)\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines() if line.startswith("case "))
    for name, (_, names) in cases.items():
        got = lines.get(f"case {name}", "")
        assert got.startswith("RuntimeError:") and names in got, (name, got)
