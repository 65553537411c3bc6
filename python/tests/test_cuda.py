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


def test_write_cache_on_cuda_warns_on_subnormal_scales_when_asked():
    # check_scales=True reads the writer's device tally back: the same warning as the CPU
    # path over the same tokens; by default CUDA writes do not check (no synchronization).
    import warnings
    g = torch.Generator().manual_seed(3)
    lat = torch.randn(40, 512, generator=g)
    lat = lat * (0.02 / lat.abs().max())
    rope = torch.randn(40, 64, generator=g)
    slots = torch.arange(40)
    kv = torch.zeros(4, 16, 432, dtype=torch.uint8, device="cuda")
    with pytest.warns(UserWarning, match="subnormals") as w_gpu:
        mlakv.write_cache(kv, slots.cuda(), lat.cuda(), rope.cuda(), format="nvfp4_ds_mla", stream=stream(),
                          check_scales=True)
    with pytest.warns(UserWarning, match="subnormals") as w_cpu:
        mlakv.write_cache(np.zeros((4, 16, 432), np.uint8), slots.numpy(), lat.numpy(), rope.numpy(),
                          format="nvfp4_ds_mla")
    assert str(w_gpu[0].message) == str(w_cpu[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mlakv.write_cache(kv, slots.cuda(), lat.cuda(), rope.cuda(), format="nvfp4_ds_mla", stream=stream())
    torch.cuda.synchronize()


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


def test_decode_plan_under_graph_capture_matches_mla_decode():
    # Plan once for the batch shape (split count for this GPU, workspace size), then run under
    # CUDA-graph capture: replays with new contents of every input give mla_decode's results.
    g = torch.Generator().manual_seed(4)
    fmt, B, H, nb, bs = "nvfp4_ds_mla", 3, 16, 24, 64
    rb = mlakv.record_bytes(fmt)
    kv = torch.zeros(nb, bs, rb, dtype=torch.uint8, device="cuda")
    layer = mlakv.cache_layer(kv, fmt, outer_scale=0.05)
    q = torch.zeros(B, 1, H, 576, device="cuda")
    table = torch.zeros(B, 8, dtype=torch.int32, device="cuda")  # valid contents for the warm-up run
    seqlens = torch.ones(B, dtype=torch.int32, device="cuda")
    out = torch.empty(B, 1, H, 512, device="cuda")
    lse = torch.empty(B, 1, H, device="cuda")
    plan = mlakv.DecodePlan(q, layer, table, seqlens, softmax_scale=0.1, out=out, lse=lse)
    assert plan.num_splits >= 2  # 3 requests x 1 row block cannot fill an H200: the plan splits
    assert plan.path in ("sm80", "sm90")
    ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        plan.run(q, layer, table, seqlens, out=out, lse=lse, workspace=ws, stream=s.cuda_stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, layer, table, seqlens, out=out, lse=lse, workspace=ws,
                 stream=torch.cuda.current_stream().cuda_stream)
    for rep in range(3):
        lat = torch.randn(nb * bs, 512, generator=g) * 0.05
        rope = torch.randn(nb * bs, 64, generator=g)
        mlakv.write_cache(kv, torch.arange(nb * bs, device="cuda"), lat.cuda(), rope.cuda(), format=fmt,
                          outer_scale=0.05, stream=torch.cuda.current_stream().cuda_stream)
        q.copy_(torch.randn(B, 1, H, 576, generator=g))
        table.copy_(torch.randperm(nb, generator=g)[:B * 8].view(B, 8).to(torch.int32))
        seqlens.copy_(torch.randint(1, 8 * bs + 1, (B,), generator=g, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        o_ref = torch.empty_like(out)
        l_ref = torch.empty_like(lse)
        mlakv.mla_decode(q, layer, table, seqlens, softmax_scale=0.1, num_splits=plan.num_splits, out=o_ref,
                         lse=l_ref, workspace=ws.clone(), stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        # The same kernels, splits and inputs: the same results.
        torch.testing.assert_close(out, o_ref, rtol=0, atol=0)
        torch.testing.assert_close(lse, l_ref, rtol=0, atol=0)
        # And the CPU reference over the same records (bf16-level agreement).
        o_cpu, _ = mlakv.mla_decode(q.cpu().numpy(), mlakv.cache_layer(kv.cpu().numpy(), fmt, outer_scale=0.05),
                                    table.cpu().numpy(), seqlens.cpu().numpy(), softmax_scale=0.1)
        err = np.linalg.norm(out.cpu().numpy() - o_cpu) / np.linalg.norm(o_cpu)
        assert err < 2 ** -6, (rep, err)


def test_decode_plan_rejects_other_shapes_and_missing_workspace():
    kv = torch.zeros(2, 64, 656, dtype=torch.uint8, device="cuda")
    layer = mlakv.cache_layer(kv, "fp8_ds_mla")
    q = torch.zeros(1, 1, 8, 576, device="cuda")
    t = torch.zeros(1, 2, dtype=torch.int32, device="cuda")
    sl = torch.ones(1, dtype=torch.int32, device="cuda")
    out = torch.empty(1, 1, 8, 512, device="cuda")
    lse = torch.empty(1, 1, 8, device="cuda")
    plan = mlakv.DecodePlan(q, layer, t, sl, softmax_scale=0.1, num_splits=4, out=out, lse=lse)
    assert plan.num_splits == 4 and plan.workspace_bytes > 0
    with pytest.raises(ValueError, match="workspace"):
        plan.run(q, layer, t, sl, out=out, lse=lse)
    ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="q: differs from the planned tensor"):
        plan.run(torch.zeros(2, 1, 8, 576, device="cuda"), layer, t, sl, out=out, lse=lse, workspace=ws)
    with pytest.raises(ValueError, match="cache_layer: differs"):
        plan.run(q, mlakv.cache_layer(torch.zeros(2, 64, 1152, dtype=torch.uint8, device="cuda"), "bf16"), t, sl,
                 out=out, lse=lse, workspace=ws)
    with pytest.raises(ValueError, match="workspace: needs"):
        plan.run(q, layer, t, sl, out=out, lse=lse, workspace=ws[:16])
    with pytest.raises(ValueError, match="CUDA cache layers"):
        mlakv.DecodePlan(q.cpu(), mlakv.cache_layer(kv.cpu(), "fp8_ds_mla"), t.cpu(), sl.cpu(), softmax_scale=0.1,
                         out=out.cpu(), lse=lse.cpu())
    with pytest.raises(ValueError, match="num_splits"):
        mlakv.DecodePlan(q, layer, t, sl, softmax_scale=0.1, num_splits=0, out=out, lse=lse)
    plan.run(q, layer, t, sl, out=out, lse=lse, workspace=ws, stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
