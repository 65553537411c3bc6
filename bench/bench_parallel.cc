// DCP decode over NCCL: one decode step (attention on every rank's share of the cache,
// then the combine) at 128K and 1M tokens per request, dcp = 1 (one GPU, no combine),
// 2 and 4, and the all-gather's share of the step.
//
//   bench_parallel [--ranks N] [--format fp8_ds_mla] [--heads 16,128] [--contexts 131072,1048576]
//                  [--reps 20] [--json FILE]
//
// Needs N GPUs (default: min(4, visible)). NCCL_NVLS_ENABLE must stay unset or 0 (the
// library sets it to 0 when unset and refuses anything else).
//
// Timing per rank with CUDA events on the rank's stream: L2 flushed (512 MiB memset)
// and the ranks aligned by a barrier before each repetition, warm-up first, median of
// --reps. attention = run_mla_attention (split-KV + combine kernels); combine =
// cuda::dcp_combine (lse and out all-gathers + merge, or the reduce-scatter variant);
// allgather = the same two all-gathers timed alone; step = attention + combine. A
// step ends when its slowest rank ends, so the reported figures are the maximum over
// ranks of each rank's median.
#include <cuda_runtime.h>
#include <curand.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_bench_util.h"
#include "mlakv/cuda.h"
#include "mlakv/dcp.h"

namespace {

using namespace mlakv;
using bench::check;
using bench::kFlushBytes;



std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoll(item));
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Timing {
  double attention_ms = 0, combine_ms = 0, allgather_ms = 0;
};

constexpr int kBlock = 64;

// One rank: builds its share of a `context`-token request and times `reps` steps.
Timing run_rank(Communicator& comm, KvFormat format, int heads, int64_t context, DcpCombine mode, int reps) {
  const int r = comm.rank(), P = comm.size(), dev = comm.device().index;
  CHECK_CUDA(cudaSetDevice(dev));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  check(comm.set_stream(stream), "set_stream");
  const int64_t local = dcp_local_count(context, r, P);
  const int64_t blocks = (local + kBlock - 1) / kBlock + 1;
  const int rb = record_bytes(format);
  uint8_t* cache = nullptr;
  CHECK_CUDA(cudaMalloc(&cache, static_cast<std::size_t>(blocks * kBlock) * static_cast<std::size_t>(rb)));
  CacheLayerView view;
  view.data = cache;
  view.num_blocks = blocks;
  view.block_size = kBlock;
  view.record_bytes = rb;
  view.format = format;
  view.device = Device::cuda(dev);
  // Random records through the device writer, 64K tokens at a time.
  curandGenerator_t gen;
  curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_DEFAULT);
  curandSetPseudoRandomGeneratorSeed(gen, 1234 + static_cast<unsigned long long>(r));
  bench::fill_random_records(view, local, gen, stream);
  // Decode metadata: one request, identity block table, local seqlen.
  std::vector<int32_t> table(static_cast<std::size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[static_cast<std::size_t>(b)] = static_cast<int32_t>(b);
  const int32_t seqlen = static_cast<int32_t>(local);
  int32_t *dtable = nullptr, *dlen = nullptr;
  float *q = nullptr, *op = nullptr, *lp = nullptr, *out = nullptr, *lse = nullptr;
  const int64_t Hl = mode == DcpCombine::kAllGather ? heads : heads / P;
  CHECK_CUDA(cudaMalloc(&dtable, table.size() * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&dlen, sizeof(int32_t)));
  CHECK_CUDA(cudaMemcpy(dtable, table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dlen, &seqlen, sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&q, static_cast<std::size_t>(heads * kQkDim) * sizeof(float)));
  curandGenerateNormal(gen, q, static_cast<std::size_t>(heads * kQkDim), 0.0f, 1.0f);
  CHECK_CUDA(cudaMalloc(&op, static_cast<std::size_t>(heads * kLatentDim) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&lp, static_cast<std::size_t>(heads) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&out, static_cast<std::size_t>(Hl * kLatentDim) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&lse, static_cast<std::size_t>(Hl) * sizeof(float)));
  const Device d = view.device;
  MlaAttentionParams p;
  p.q = TensorView::contiguous(q, DType::kF32, {1, 1, heads, kQkDim}, d);
  p.cache = view;
  p.block_table = TensorView::contiguous(dtable, DType::kI32, {1, blocks}, d);
  p.seqlens = TensorView::contiguous(dlen, DType::kI32, {1}, d);
  p.softmax_scale = 0.1352f;
  p.out = TensorView::contiguous(op, DType::kF32, {1, 1, heads, kLatentDim}, d);
  p.lse = TensorView::contiguous(lp, DType::kF32, {1, 1, heads}, d);
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  p.num_splits = cuda::suggest_num_splits(p, prop.multiProcessorCount);
  auto plan = cuda::plan_mla_attention(p);
  check(plan.status(), "plan_mla_attention");
  void *ws = nullptr, *cws = nullptr, *flush = nullptr, *ag = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, std::max<std::size_t>(plan->workspace_bytes, 16)));
  const std::size_t cwb = cuda::dcp_combine_workspace_bytes(P, heads, mode);
  CHECK_CUDA(cudaMalloc(&cws, std::max<std::size_t>(cwb, 16)));
  CHECK_CUDA(cudaMalloc(&ag, static_cast<std::size_t>(P * heads * (kLatentDim + 1)) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&flush, kFlushBytes));
  cudaEvent_t e0, e1, e2, e3;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventCreate(&e2);
  cudaEventCreate(&e3);
  std::vector<double> ta, tc, tg;
  const int warmup = 3;
  auto* agf = static_cast<float*>(ag);
  for (int it = 0; it < warmup + reps; ++it) {
    CHECK_CUDA(cudaMemsetAsync(flush, it & 0xFF, kFlushBytes, stream));
    check(comm.barrier(), "barrier");  // drains the stream and aligns the ranks
    cudaEventRecord(e0, stream);
    check(cuda::run_mla_attention(p, *plan, ws, stream), "run_mla_attention");
    cudaEventRecord(e1, stream);
    if (P > 1) {  // the all-gathers of the combine, alone, ranks aligned first
      check(comm.barrier(), "barrier");
      cudaEventRecord(e2, stream);
      check(comm.all_gather(TensorView::contiguous(lp, DType::kF32, {heads}, d),
                            TensorView::contiguous(agf, DType::kF32, {P, heads}, d)),
            "all_gather lse");
      if (mode == DcpCombine::kAllGather) {
        check(comm.all_gather(TensorView::contiguous(op, DType::kF32, {heads, kLatentDim}, d),
                              TensorView::contiguous(agf + P * heads, DType::kF32, {P, heads, kLatentDim}, d)),
              "all_gather out");
      }
      cudaEventRecord(e3, stream);
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (it < warmup) continue;
    float a = 0, g = 0;
    cudaEventElapsedTime(&a, e0, e1);
    if (P > 1) cudaEventElapsedTime(&g, e2, e3);
    ta.push_back(a);
    tg.push_back(g);
  }
  // The combine alone, after attention (own loop so its events are not overwritten).
  for (int it = 0; P > 1 && it < warmup + reps; ++it) {
    CHECK_CUDA(cudaMemsetAsync(flush, it & 0xFF, kFlushBytes, stream));
    check(cuda::run_mla_attention(p, *plan, ws, stream), "run_mla_attention");
    check(comm.barrier(), "barrier");
    cudaEventRecord(e1, stream);
    check(cuda::dcp_combine(comm, p.out, p.lse, mode, TensorView::contiguous(out, DType::kF32, {1, 1, Hl, kLatentDim}, d),
                            TensorView::contiguous(lse, DType::kF32, {1, 1, Hl}, d), cws, cwb),
          "dcp_combine");
    cudaEventRecord(e2, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    float c = 0;
    cudaEventElapsedTime(&c, e1, e2);
    if (it >= warmup) tc.push_back(c);
  }
  check(comm.set_stream(nullptr), "set_stream");
  for (void* ptr : {static_cast<void*>(cache),
                    static_cast<void*>(dtable), static_cast<void*>(dlen), static_cast<void*>(q), static_cast<void*>(op),
                    static_cast<void*>(lp), static_cast<void*>(out), static_cast<void*>(lse), ws, cws, ag, flush}) {
    cudaFree(ptr);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
  cudaEventDestroy(e3);
  curandDestroyGenerator(gen);
  cudaStreamDestroy(stream);
  return {median(ta), median(tc), median(tg)};
}

}  // namespace

int main(int argc, char** argv) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible < 1) {
    std::fprintf(stderr, "bench_parallel: no CUDA device visible\n");
    return 2;
  }
  int ranks = std::min(4, visible), reps = 20;
  std::string format_s = "fp8_ds_mla", json_path;
  std::vector<int64_t> heads = {16, 128}, contexts = {131072, 1048576};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--ranks") ranks = std::atoi(v.c_str());
    else if (a == "--format") format_s = v;
    else if (a == "--heads") heads = parse_list(v);
    else if (a == "--contexts") contexts = parse_list(v);
    else if (a == "--reps") reps = std::atoi(v.c_str());
    else if (a == "--json") json_path = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (ranks < 1 || ranks > visible) {
    std::fprintf(stderr, "bench_parallel: --ranks %d but %d GPU(s) visible\n", ranks, visible);
    return 2;
  }
  const auto format = parse_format(format_s);
  if (!format) {
    std::fprintf(stderr, "bench_parallel: unknown --format %s\n", format_s.c_str());
    return 2;
  }
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> one_gpu_step;  // per (heads, context), dcp = 1
  for (int dcp : {1, 2, 4}) {
    if (dcp > ranks) continue;
    auto id = nccl_unique_id();
    check(id.status(), "nccl_unique_id");
    std::vector<std::unique_ptr<Communicator>> comms(static_cast<std::size_t>(dcp));
    {
      std::vector<std::thread> ts;
      for (int r = 0; r < dcp; ++r) {
        ts.emplace_back([&, r] {
          auto c = make_nccl_communicator(*id, r, dcp, r);
          check(c.status(), fmt::format("make_nccl_communicator rank {}", r));
          comms[static_cast<std::size_t>(r)] = std::move(c).value();
        });
      }
      for (auto& t : ts) t.join();
    }
    for (std::size_t hi = 0; hi < heads.size(); ++hi) {
      for (std::size_t ci = 0; ci < contexts.size(); ++ci) {
        const int64_t h = heads[hi], ctx = contexts[ci];
        const std::size_t k = hi * contexts.size() + ci;  // this shape's dcp = 1 row
        for (DcpCombine mode : {DcpCombine::kAllGather, DcpCombine::kReduceScatterHeads}) {
          if (mode == DcpCombine::kReduceScatterHeads && (dcp == 1 || h % dcp != 0)) continue;
          std::vector<Timing> t(static_cast<std::size_t>(dcp));
          std::vector<std::thread> ts;
          for (int r = 0; r < dcp; ++r) {
            ts.emplace_back([&, r] {
              t[static_cast<std::size_t>(r)] = run_rank(*comms[static_cast<std::size_t>(r)], *format, static_cast<int>(h), ctx, mode, reps);
            });
          }
          for (auto& th : ts) th.join();
          Timing worst;
          for (const Timing& x : t) {
            worst.attention_ms = std::max(worst.attention_ms, x.attention_ms);
            worst.combine_ms = std::max(worst.combine_ms, x.combine_ms);
            worst.allgather_ms = std::max(worst.allgather_ms, x.allgather_ms);
          }
          const double step = worst.attention_ms + worst.combine_ms;
          if (dcp == 1) one_gpu_step.push_back(step);
          const double base = k < one_gpu_step.size() ? one_gpu_step[k] : 0.0;
          nlohmann::json row = {{"dcp", dcp},
                                {"format", format_s},
                                {"heads", h},
                                {"context", ctx},
                                {"combine", mode == DcpCombine::kAllGather ? "all_gather" : "reduce_scatter"},
                                {"attention_ms", worst.attention_ms},
                                {"combine_ms", worst.combine_ms},
                                {"allgather_ms", worst.allgather_ms},
                                {"step_ms", step},
                                {"allgather_share", step > 0 ? worst.allgather_ms / step : 0.0},
                                {"speedup_vs_1gpu", step > 0 && base > 0 ? base / step : 0.0}};
          std::printf("%s\n", row.dump().c_str());
          std::fflush(stdout);
          rows.push_back(row);
        }
      }
    }
    std::vector<std::thread> ts;
    for (auto& c : comms) ts.emplace_back([&c] { c.reset(); });
    for (auto& th : ts) th.join();
  }
  if (!json_path.empty()) std::ofstream(json_path) << rows.dump(2) << "\n";
  return 0;
}
