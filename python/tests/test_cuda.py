"""The same operations on CUDA tensors (torch), checked against the CPU path, and a CUDA
graph replay. Skipped where there is no GPU or the build has no CUDA backend."""
import numpy as np
import pytest

import mlakv

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (mlakv.cuda_available() and torch.cuda.is_available()),
                                reason="needs a CUDA build of mlakv and a GPU")

FORMATS = ["bf16", "fp8_ds_mla", "nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"]


def stream():
    return torch.cuda.current_stream().cuda_stream


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_cache_on_cuda_matches_cpu_bytes(fmt):
    g = torch.Generator().manual_seed(1)
    lat = torch.randn(40, 512, generator=g)
    rope = torch.randn(40, 64, generator=g)
    slots = torch.randperm(64, generator=g)[:40]
    rb = mlakv.record_bytes(fmt)
    kv = torch.zeros(4, 16, rb, dtype=torch.uint8, device="cuda")
    mlakv.write_cache(kv, slots.cuda(), lat.cuda(), rope.cuda(), format=fmt, stream=stream())
    torch.cuda.synchronize()
    ref = np.zeros((4, 16, rb), np.uint8)
    mlakv.write_cache(ref, slots.numpy(), lat.numpy(), rope.numpy(), format=fmt)
    np.testing.assert_array_equal(kv.cpu().numpy(), ref)


@pytest.mark.parametrize("fmt", FORMATS)
def test_mla_decode_on_cuda_matches_cpu(fmt):
    g = torch.Generator().manual_seed(2)
    T, B, H = 300, 2, 16
    lat, rope = torch.randn(T * B, 512, generator=g), torch.randn(T * B, 64, generator=g)
    rb = mlakv.record_bytes(fmt)
    nb = (T + 63) // 64
    kv_cpu = np.zeros((B * nb, 64, rb), np.uint8)
    slots = np.arange(B * nb * 64).reshape(B, nb * 64)[:, :T].reshape(-1)
    mlakv.write_cache(kv_cpu, slots, lat.numpy(), rope.numpy(), format=fmt)
    table = np.arange(B * nb, dtype=np.int32).reshape(B, nb)
    seqlens = np.full(B, T, np.int32)
    q = torch.randn(B, 1, H, 576, generator=g)
    o_ref, l_ref = mlakv.mla_decode(q.numpy(), mlakv.cache_layer(kv_cpu, fmt), table, seqlens, softmax_scale=0.1)
    kv = torch.from_numpy(kv_cpu).cuda()
    out = torch.empty(B, 1, H, 512, device="cuda")
    lse = torch.empty(B, 1, H, device="cuda")
    mlakv.mla_decode(q.cuda(), mlakv.cache_layer(kv, fmt), torch.from_numpy(table).cuda(),
                     torch.from_numpy(seqlens).cuda(), softmax_scale=0.1, out=out, lse=lse, stream=stream())
    torch.cuda.synchronize()
    # The CUDA kernel rounds q, K/V and P to bf16 (include/mlakv/cuda.h): bf16-level agreement.
    err = np.linalg.norm(out.cpu().numpy() - o_ref) / np.linalg.norm(o_ref)
    assert err < 2 ** -6, err
    np.testing.assert_allclose(lse.cpu().numpy(), l_ref, atol=2e-2)


def test_cuda_requires_out_and_workspace():
    kv = torch.zeros(1, 16, 656, dtype=torch.uint8, device="cuda")
    q = torch.zeros(1, 1, 1, 576, device="cuda")
    t = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    s = torch.ones(1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="out"):
        mlakv.mla_decode(q, mlakv.cache_layer(kv, "fp8_ds_mla"), t, s, softmax_scale=0.1)
    out = torch.empty(1, 1, 1, 512, device="cuda")
    lse = torch.empty(1, 1, 1, device="cuda")
    with pytest.raises(ValueError, match="workspace"):
        mlakv.mla_decode(q, mlakv.cache_layer(kv, "fp8_ds_mla"), t, s, softmax_scale=0.1, out=out, lse=lse,
                         num_splits=4)


def test_cuda_graph_replay_with_new_contents():
    fmt = "fp8_ds_mla"
    g = torch.Generator().manual_seed(3)
    T, H = 200, 16
    kv = torch.zeros(4, 64, 656, dtype=torch.uint8, device="cuda")
    slots = torch.arange(T, device="cuda")
    lat = torch.empty(T, 512, device="cuda")
    rope = torch.empty(T, 64, device="cuda")
    q = torch.empty(1, 1, H, 576, device="cuda")
    table = torch.arange(4, dtype=torch.int32, device="cuda").reshape(1, 4)
    seqlens = torch.tensor([T], dtype=torch.int32, device="cuda")
    out = torch.empty(1, 1, H, 512, device="cuda")
    lse = torch.empty(1, 1, H, device="cuda")
    layer = mlakv.cache_layer(kv, fmt)

    def step():
        mlakv.write_cache(kv, slots, lat, rope, format=fmt, stream=stream())
        mlakv.mla_decode(q, layer, table, seqlens, softmax_scale=0.1, out=out, lse=lse, stream=stream())

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for rep in range(3):
        lat.copy_(torch.randn(T, 512, generator=g))
        rope.copy_(torch.randn(T, 64, generator=g))
        q.copy_(torch.randn(1, 1, H, 576, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        kv_cpu = np.zeros((4, 64, 656), np.uint8)
        mlakv.write_cache(kv_cpu, np.arange(T), lat.cpu().numpy(), rope.cpu().numpy(), format=fmt)
        np.testing.assert_array_equal(kv.cpu().numpy(), kv_cpu)
        o_ref, _ = mlakv.mla_decode(q.cpu().numpy(), mlakv.cache_layer(kv_cpu, fmt), table.cpu().numpy(),
                                    seqlens.cpu().numpy(), softmax_scale=0.1)
        err = np.linalg.norm(out.cpu().numpy() - o_ref) / np.linalg.norm(o_ref)
        assert err < 2 ** -6, (rep, err)
