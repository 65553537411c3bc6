// One genuine long request on the GPU(s), checked against a float64 reference: the cache
// of a `--tokens`-token request (default 1,048,576) in `--format` for every cache layer of
// the `--model` preset (default glm-5.2: its decoder + MTP layers) is allocated across
// `--ranks` GPUs with DCP interleaving (rank r holds positions p with p % ranks == r),
// filled by mlakv's CUDA writers, and one decode step is attended by DCP (split-KV on each
// rank, then cuda::dcp_combine over NCCL) for `--check-layers` layers. Each checked layer's
// output and LSE for every head are compared with a float64 attention over the records as
// stored (copied back and decoded by the scalar codec on the host). Beside it: the
// planner's capacity for the model on `--ranks` GPUs of this memory at tp = dcp = ranks.
//
//   long_request_check [--ranks N] [--tokens 1048576] [--format nvfp4_ds_mla_fp8rope]
//                      [--heads 16] [--model glm-5.2] [--check-layers 2] [--json FILE]
//
// With --ranks 1 it runs the same request on one GPU (dcp = 1: no combine).
//
// Content: random latents and rope (normal, sd 1) plus five planted tokens - at
// positions 0, 1, n/3, n/2 + 1 and n - 1, so on different ranks - whose latent and rope
// are 2 q (head 0's query), which makes them carry a large share of head 0's attention:
// a lost, duplicated or mis-weighted rank shows up there first.
//
// Tolerance per output element (against float64 over the decoded records; the kernels
// round q to bf16/f16 and P to bf16/f16, and bf16 keys/values to bf16, accumulating in
// fp32): with d = (2^-8 + 576 u) scale sum|q k| the score error bound (q and k rounding
// plus fp32 dot products), e_s = e^(2d) - 1, MAD / MAV the weighted absolute deviation /
// magnitude of the values: e_s MAD / (1 - e_s) + 2^-7 (1 + e_s) MAV (P and V rounding)
// + 64 sqrt(n) u MAV + 64 u max|v| (fp32 sums over n tokens whose running value stays
// within MAV-sized magnitudes: rounding errors of random sign grow as sqrt(n), here with a
// 64x margin; the worst-case bound n u max|v| would be 6% of max|v| at 1M tokens and check
// nothing). LSE: d + 64 sqrt(n) u + 4 u |lse|.
#include <cuda_runtime.h>
#include <curand.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_bench_util.h"  // CHECK_CUDA, bench::check, bench::fill_random_records
#include "mlakv/codec.h"
#include "mlakv/cuda.h"
#include "mlakv/dcp.h"
#include "mlakv/model_config.h"
#include "mlakv/parallel.h"
#include "mlakv/plan.h"

namespace {

using namespace mlakv;

constexpr int kBlock = 64;
constexpr double kU = 0x1p-24;

using bench::check;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "long_request_check: error: %s\n", what.c_str());
  std::exit(1);
}

struct Options {
  int ranks = 1;
  int64_t tokens = 1 << 20;
  KvFormat format = KvFormat::kNvfp4DsMlaFp8Rope;
  int heads = 16;
  std::string model = "glm-5.2";
  int check_layers = 2;
  std::string json;
};

// What one rank reports back for a checked layer.
struct RankLayer {
  std::vector<float> out, lse;  // rank 0 only: the combined result [H, 512], [H]
  // float64 partial over this rank's tokens: per head max score, sum of exp, sum of exp * v,
  // plus the tolerance's ingredients.
  std::vector<double> m, s, o, mav_num, vmax, dmax;
  double attention_ms = 0, combine_ms = 0;
};

std::vector<int64_t> planted_positions(int64_t n) {
  std::vector<int64_t> p = {0, 1, n / 3, n / 2 + 1, n - 1};
  std::sort(p.begin(), p.end());
  p.erase(std::unique(p.begin(), p.end()), p.end());
  return p;
}

// Float64 partial attention of `heads` query rows over `n` decoded keys [n, 576].
void partial_attention(const std::vector<float>& q, int heads, float scale, const std::vector<float>& keys, int64_t n,
                       RankLayer& r, int threads) {
  r.m.assign(static_cast<std::size_t>(heads), -INFINITY);
  r.s.assign(static_cast<std::size_t>(heads), 0.0);
  r.o.assign(static_cast<std::size_t>(heads) * kLatentDim, 0.0);
  r.mav_num.assign(static_cast<std::size_t>(heads) * kLatentDim, 0.0);
  r.vmax.assign(kLatentDim, 0.0);
  r.dmax.assign(static_cast<std::size_t>(heads), 0.0);
  std::vector<std::thread> ts;
  std::atomic<int> next{0};
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      for (int h; (h = next.fetch_add(1)) < heads;) {
        const float* qh = q.data() + static_cast<std::size_t>(h) * kQkDim;
        std::vector<double> sc(static_cast<std::size_t>(n));
        double mx = -INFINITY, dm = 0;
        for (int64_t k = 0; k < n; ++k) {
          const float* kv = keys.data() + static_cast<std::size_t>(k) * kQkDim;
          double dot = 0, sabs = 0;
          for (int d = 0; d < kQkDim; ++d) {
            const double pr = static_cast<double>(qh[d]) * kv[d];
            dot += pr;
            sabs += std::fabs(pr);
          }
          sc[static_cast<std::size_t>(k)] = dot * scale;
          dm = std::max(dm, (0x1p-8 + 576 * kU) * scale * sabs);
          mx = std::max(mx, sc[static_cast<std::size_t>(k)]);
        }
        double sum = 0;
        double* oh = r.o.data() + static_cast<std::size_t>(h) * kLatentDim;
        double* mh = r.mav_num.data() + static_cast<std::size_t>(h) * kLatentDim;
        for (int64_t k = 0; k < n; ++k) {
          const double w = std::exp(sc[static_cast<std::size_t>(k)] - mx);
          sum += w;
          const float* kv = keys.data() + static_cast<std::size_t>(k) * kQkDim;
          for (int d = 0; d < kLatentDim; ++d) {
            oh[d] += w * kv[d];
            mh[d] += w * std::fabs(kv[d]);
          }
        }
        r.m[static_cast<std::size_t>(h)] = n > 0 ? mx : -INFINITY;
        r.s[static_cast<std::size_t>(h)] = sum;
        r.dmax[static_cast<std::size_t>(h)] = dm;
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int64_t k = 0; k < n; ++k) {
    const float* kv = keys.data() + static_cast<std::size_t>(k) * kQkDim;
    for (int d = 0; d < kLatentDim; ++d) r.vmax[static_cast<std::size_t>(d)] = std::max(r.vmax[static_cast<std::size_t>(d)], std::fabs(static_cast<double>(kv[d])));
  }
}

struct RankResult {
  std::vector<RankLayer> layers;
  double fill_ms = 0;
  double cache_gib = 0;
  int64_t local_tokens = 0;
};

RankResult run_rank(Communicator& comm, const Options& o, int cache_layers, const std::vector<float>& q, float scale,
                    int host_threads) {
  const int r = comm.rank(), P = comm.size(), dev = comm.device().index;
  CHECK_CUDA(cudaSetDevice(dev));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  check(comm.set_stream(stream), "set_stream");
  RankResult res;
  const int64_t local = dcp_local_count(o.tokens, r, P);
  res.local_tokens = local;
  const int64_t blocks = (local + kBlock - 1) / kBlock;
  const int rb = record_bytes(o.format);
  const std::size_t layer_bytes = static_cast<std::size_t>(blocks * kBlock) * static_cast<std::size_t>(rb);
  // Every cache layer of the model, one allocation each (as an engine's per-layer tensors).
  std::vector<uint8_t*> caches(static_cast<std::size_t>(cache_layers), nullptr);
  for (auto& c : caches) CHECK_CUDA(cudaMalloc(&c, layer_bytes));
  res.cache_gib = static_cast<double>(layer_bytes) * cache_layers / (1ull << 30);
  auto view_of = [&](int l) {
    CacheLayerView v;
    v.data = caches[static_cast<std::size_t>(l)];
    v.num_blocks = blocks;
    v.block_size = kBlock;
    v.record_bytes = rb;
    v.format = o.format;
    v.device = Device::cuda(dev);
    return v;
  };
  // Fill: random records through the device writer, every layer; then the planted
  // tokens this rank owns (local slot = position / P).
  curandGenerator_t gen;
  curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_DEFAULT);
  curandSetPseudoRandomGeneratorSeed(gen, 9001 + static_cast<unsigned long long>(r));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> mine;
  for (int64_t p : planted_positions(o.tokens)) {
    if (dcp_owner(p, P) == r) mine.push_back(dcp_local_position(p, P));
  }
  const int64_t np = static_cast<int64_t>(mine.size());
  std::vector<float> plant_lat(mine.size() * kLatentDim), plant_rope(mine.size() * kRopeDim);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    for (int d = 0; d < kLatentDim; ++d) plant_lat[i * kLatentDim + static_cast<std::size_t>(d)] = 2.0f * q[static_cast<std::size_t>(d)];
    for (int d = 0; d < kRopeDim; ++d) plant_rope[i * kRopeDim + static_cast<std::size_t>(d)] = 2.0f * q[static_cast<std::size_t>(kLatentDim + d)];
  }
  float *lat = nullptr, *rope = nullptr;
  int64_t* slots = nullptr;
  CHECK_CUDA(cudaMalloc(&lat, std::max<std::size_t>(plant_lat.size(), 1) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&rope, std::max<std::size_t>(plant_rope.size(), 1) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&slots, std::max<std::size_t>(mine.size(), 1) * sizeof(int64_t)));
  CHECK_CUDA(cudaMemcpy(slots, mine.data(), mine.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(lat, plant_lat.data(), plant_lat.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(rope, plant_rope.data(), plant_rope.size() * sizeof(float), cudaMemcpyHostToDevice));
  for (int l = 0; l < cache_layers; ++l) {
    const CacheLayerView v = view_of(l);
    bench::fill_random_records(v, local, gen, stream);
    if (np > 0) {
      check(cuda::write_cache(v, TensorView::contiguous(slots, DType::kI64, {np}, v.device),
                              TensorView::contiguous(lat, DType::kF32, {np, kLatentDim}, v.device),
                              TensorView::contiguous(rope, DType::kF32, {np, kRopeDim}, v.device), Fp8ScaleMode::kPow2,
                              stream),
            "write_cache (planted)");
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  res.fill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  cudaFree(lat);
  cudaFree(rope);
  cudaFree(slots);
  curandDestroyGenerator(gen);

  // Decode metadata: one request, identity block table, local seqlen.
  std::vector<int32_t> table(static_cast<std::size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[static_cast<std::size_t>(b)] = static_cast<int32_t>(b);
  const int32_t seqlen = static_cast<int32_t>(local);
  int32_t *dtable = nullptr, *dlen = nullptr;
  float *dq = nullptr, *op = nullptr, *lp = nullptr, *out = nullptr, *lse = nullptr;
  const int H = o.heads;
  CHECK_CUDA(cudaMalloc(&dtable, table.size() * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&dlen, sizeof(int32_t)));
  CHECK_CUDA(cudaMemcpy(dtable, table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dlen, &seqlen, sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&dq, q.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(dq, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&op, static_cast<std::size_t>(H * kLatentDim) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&lp, static_cast<std::size_t>(H) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&out, static_cast<std::size_t>(H * kLatentDim) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&lse, static_cast<std::size_t>(H) * sizeof(float)));
  const Device d = Device::cuda(dev);
  const std::size_t cwb = cuda::dcp_combine_workspace_bytes(P, H, DcpCombine::kAllGather);
  void* cws = nullptr;
  CHECK_CUDA(cudaMalloc(&cws, std::max<std::size_t>(cwb, 16)));
  cudaEvent_t e0, e1, e2;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventCreate(&e2);
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  const int checked = std::min(o.check_layers, cache_layers);
  for (int ci = 0; ci < checked; ++ci) {
    // Spread the checked layers over the model (first, last, ...).
    const int l = checked == 1 ? 0 : static_cast<int>(static_cast<int64_t>(ci) * (cache_layers - 1) / (checked - 1));
    MlaAttentionParams p;
    p.q = TensorView::contiguous(dq, DType::kF32, {1, 1, H, kQkDim}, d);
    p.cache = view_of(l);
    p.block_table = TensorView::contiguous(dtable, DType::kI32, {1, blocks}, d);
    p.seqlens = TensorView::contiguous(dlen, DType::kI32, {1}, d);
    p.softmax_scale = scale;
    p.out = TensorView::contiguous(op, DType::kF32, {1, 1, H, kLatentDim}, d);
    p.lse = TensorView::contiguous(lp, DType::kF32, {1, 1, H}, d);
    p.num_splits = cuda::suggest_num_splits(p, prop.multiProcessorCount);
    auto plan = cuda::plan_mla_attention(p);
    check(plan.status(), "plan_mla_attention");
    void* ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, std::max<std::size_t>(plan->workspace_bytes, 16)));
    check(comm.barrier(), "barrier");
    cudaEventRecord(e0, stream);
    check(cuda::run_mla_attention(p, *plan, ws, stream), "run_mla_attention");
    cudaEventRecord(e1, stream);
    float* res_out = op;
    float* res_lse = lp;
    if (P > 1) {
      check(cuda::dcp_combine(comm, p.out, p.lse, DcpCombine::kAllGather,
                              TensorView::contiguous(out, DType::kF32, {1, 1, H, kLatentDim}, d),
                              TensorView::contiguous(lse, DType::kF32, {1, 1, H}, d), cws, cwb),
            "dcp_combine");
      res_out = out;
      res_lse = lse;
    }
    cudaEventRecord(e2, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    RankLayer rl;
    float a = 0, c = 0;
    cudaEventElapsedTime(&a, e0, e1);
    cudaEventElapsedTime(&c, e1, e2);
    rl.attention_ms = a;
    rl.combine_ms = c;
    if (r == 0) {
      rl.out.resize(static_cast<std::size_t>(H * kLatentDim));
      rl.lse.resize(static_cast<std::size_t>(H));
      CHECK_CUDA(cudaMemcpy(rl.out.data(), res_out, rl.out.size() * sizeof(float), cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(rl.lse.data(), res_lse, rl.lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
    }
    cudaFree(ws);
    // The records as stored -> host -> scalar codec -> float64 partial over this rank's tokens.
    std::vector<uint8_t> recs(static_cast<std::size_t>(local) * static_cast<std::size_t>(rb));
    CHECK_CUDA(cudaMemcpy(recs.data(), caches[static_cast<std::size_t>(l)], recs.size(), cudaMemcpyDeviceToHost));
    std::vector<float> keys(static_cast<std::size_t>(local) * kQkDim), lat_h(static_cast<std::size_t>(local) * kLatentDim),
        rope_h(static_cast<std::size_t>(local) * kRopeDim);
    CodecParams cp;
    cp.format = o.format;
    check(decode_records(cp, TensorView::contiguous(recs.data(), DType::kU8, {local, rb}),
                         TensorView::contiguous(lat_h.data(), DType::kF32, {local, kLatentDim}),
                         TensorView::contiguous(rope_h.data(), DType::kF32, {local, kRopeDim})),
          "decode_records");
    for (int64_t k = 0; k < local; ++k) {
      std::copy_n(lat_h.data() + k * kLatentDim, kLatentDim, keys.data() + k * kQkDim);
      std::copy_n(rope_h.data() + k * kRopeDim, kRopeDim, keys.data() + k * kQkDim + kLatentDim);
    }
    partial_attention(q, H, scale, keys, local, rl, host_threads);
    res.layers.push_back(std::move(rl));
  }
  check(comm.set_stream(nullptr), "set_stream");
  for (void* ptr : {static_cast<void*>(dtable), static_cast<void*>(dlen), static_cast<void*>(dq), static_cast<void*>(op),
                    static_cast<void*>(lp), static_cast<void*>(out), static_cast<void*>(lse), cws}) {
    cudaFree(ptr);
  }
  for (auto* c : caches) cudaFree(c);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
  cudaStreamDestroy(stream);
  return res;
}

int parse_int(const std::string& opt, const std::string& v, int64_t lo, int64_t hi, int64_t& out) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || x < lo || x > hi) die(fmt::format("{}: expected an integer in [{}, {}], got '{}'", opt, lo, hi, v));
  out = x;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible < 1) die("no CUDA device visible");
  o.ranks = std::min(4, visible);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) die(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    int64_t x = 0;
    if (a == "--ranks") {
      parse_int(a, v, 1, visible, x);
      o.ranks = static_cast<int>(x);
    } else if (a == "--tokens") {
      parse_int(a, v, 1, int64_t{1} << 31, x);
      o.tokens = x;
    } else if (a == "--format") {
      const auto f = parse_format(v);
      if (!f || *f == KvFormat::kF32) die(fmt::format("--format: '{}' is not a CUDA record format", v));
      o.format = *f;
    } else if (a == "--heads") {
      parse_int(a, v, 1, 128, x);
      o.heads = static_cast<int>(x);
    } else if (a == "--model") {
      o.model = v;
    } else if (a == "--check-layers") {
      parse_int(a, v, 1, 1000, x);
      o.check_layers = static_cast<int>(x);
    } else if (a == "--json") {
      o.json = v;
    } else {
      die(fmt::format("unknown option {}", a));
    }
  }
  const auto preset = find_model_preset(o.model);
  if (!preset) die(fmt::format("--model: unknown preset '{}'", o.model));
  // The planner's figure for this deployment: tp = dcp = ranks on GPUs of this memory.
  std::size_t free_b = 0, total_b = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  PlanParams pp;
  pp.format = o.format;
  pp.gpus = o.ranks;
  pp.tp = o.ranks;
  pp.dcp = o.ranks;
  pp.gpu_mem_gib = static_cast<double>(total_b) / (1ull << 30);
  pp.weight_gib = preset->deploy.weight_gib;
  pp.reserved_gib = preset->deploy.activation_gib;
  auto plan = plan_capacity(preset->config, pp);
  PlanParams pp4 = pp;
  pp4.gpus = pp4.tp = pp4.dcp = 4;
  auto plan4 = plan_capacity(preset->config, pp4);
  auto pr = [](const StatusOr<PlanResult>& p) {
    return p.ok() ? fmt::format("{} tokens per GPU, longest request {} (uncapped pool {}), {} B/token",
                                p->tokens_per_gpu, p->max_request_tokens, p->pool_request_tokens, p->bytes_per_token)
                  : p.status().to_string();
  };
  // Cache layers: the planner's count for the model (decoder + MTP); the indexer key cache
  // (132 B/token on its layers) is counted by the planner but not allocated here.
  auto layers_plan = plan4.ok() ? plan4 : plan;
  const int cache_layers = layers_plan.ok() ? layers_plan->cache_layers : preset->config.num_layers;
  std::printf("planner (%s, %s, %.1f GiB GPUs, tp = dcp = %d): %s\n", o.model.c_str(),
              std::string(format_name(o.format)).c_str(), pp.gpu_mem_gib, o.ranks, pr(plan).c_str());
  std::printf("planner (same, 4 GPUs, tp = dcp = 4): %s\n", pr(plan4).c_str());
  std::printf("request: %lld tokens x %d cache layers x %d B over %d GPU(s), %d heads, checking %d layer(s)\n",
              static_cast<long long>(o.tokens), cache_layers, record_bytes(o.format), o.ranks, o.heads,
              std::min(o.check_layers, cache_layers));
  std::fflush(stdout);

  // q: the same on every rank; latent part sd 0.3, rope part sd 0.3 (see the header).
  std::vector<float> q(static_cast<std::size_t>(o.heads) * kQkDim);
  std::mt19937_64 rng(4242);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (auto& x : q) x = nd(rng);
  const float scale = 1.0f / std::sqrt(192.0f);  // 1/sqrt(qk_nope + qk_rope) of the DeepSeek geometry
  const int host_threads = std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(o.ranks));

  auto id = nccl_unique_id();
  check(id.status(), "nccl_unique_id");
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<std::size_t>(o.ranks));
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < o.ranks; ++r) {
      ts.emplace_back([&, r] {
        auto c = make_nccl_communicator(*id, r, o.ranks, r);
        check(c.status(), fmt::format("make_nccl_communicator rank {}", r));
        comms[static_cast<std::size_t>(r)] = std::move(c).value();
      });
    }
    for (auto& t : ts) t.join();
  }
  std::vector<RankResult> res(static_cast<std::size_t>(o.ranks));
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < o.ranks; ++r) {
      ts.emplace_back([&, r] {
        res[static_cast<std::size_t>(r)] = run_rank(*comms[static_cast<std::size_t>(r)], o, cache_layers, q, scale, host_threads);
      });
    }
    for (auto& t : ts) t.join();
  }
  for (auto& c : comms) c.reset();

  // Merge the float64 partials over ranks and compare.
  bool ok = true;
  nlohmann::json layers = nlohmann::json::array();
  const double n = static_cast<double>(o.tokens);
  for (std::size_t li = 0; li < res[0].layers.size(); ++li) {
    double worst_ratio = 0, worst_err = 0, worst_lse_ratio = 0, planted_share = 0, step_ms = 0;
    int bad = 0;
    for (int h = 0; h < o.heads; ++h) {
      const std::size_t hh = static_cast<std::size_t>(h);
      double m = -INFINITY, dmax = 0;
      for (const auto& rr : res) {
        m = std::max(m, rr.layers[li].m[hh]);
        dmax = std::max(dmax, rr.layers[li].dmax[hh]);
      }
      double s = 0;
      for (const auto& rr : res) s += rr.layers[li].s[hh] * std::exp(rr.layers[li].m[hh] - m);
      const double lse = m + std::log(s);
      const double es = std::expm1(2 * dmax);
      const double acc_term = 64 * std::sqrt(n) * kU;
      const double lse_tol = dmax + acc_term + 4 * kU * std::fabs(lse);
      const double le = std::fabs(res[0].layers[li].lse[hh] - lse);
      worst_lse_ratio = std::max(worst_lse_ratio, le / lse_tol);
      if (le > lse_tol) ++bad;
      for (int d = 0; d < kLatentDim; ++d) {
        const std::size_t k = hh * kLatentDim + static_cast<std::size_t>(d);
        double num = 0, mav = 0, vmax = 0;
        for (const auto& rr : res) {
          const double f = std::exp(rr.layers[li].m[hh] - m);
          num += rr.layers[li].o[k] * f;
          mav += rr.layers[li].mav_num[k] * f;
          vmax = std::max(vmax, rr.layers[li].vmax[static_cast<std::size_t>(d)]);
        }
        const double ref = num / s;
        mav /= s;
        // MAD <= MAV + |ref| (a bound that needs no second pass over the tokens).
        const double mad = mav + std::fabs(ref);
        const double tol = es * mad / (1 - es) + 0x1p-7 * (1 + es) * mav + acc_term * mav + 64 * kU * vmax + 1e-30;
        const double err = std::fabs(res[0].layers[li].out[k] - ref);
        worst_err = std::max(worst_err, err);
        worst_ratio = std::max(worst_ratio, err / tol);
        if (!(err <= tol)) ++bad;
      }
      if (h == 0) {
        // Head 0's weight on the planted tokens, from the float64 scores of q . (2 q).
        double qq = 0;
        for (int d = 0; d < kQkDim; ++d) qq += static_cast<double>(q[static_cast<std::size_t>(d)]) * q[static_cast<std::size_t>(d)];
        planted_share = static_cast<double>(planted_positions(o.tokens).size()) * std::exp(2 * qq * scale - lse);
      }
    }
    for (const auto& rr : res) step_ms = std::max(step_ms, rr.layers[li].attention_ms + rr.layers[li].combine_ms);
    ok = ok && bad == 0;
    std::printf("layer check %zu: %s - worst |out - ref| %.3e (%.3f of its tolerance), worst lse %.3f of tolerance, "
                "head 0 weight on the planted tokens ~%.3f (nominal), step %.3f ms (slowest rank)\n",
                li, bad == 0 ? "PASS" : fmt::format("FAIL ({} elements over tolerance)", bad).c_str(), worst_err,
                worst_ratio, worst_lse_ratio, planted_share, step_ms);
    layers.push_back({{"pass", bad == 0}, {"worst_abs_err", worst_err}, {"worst_err_over_tol", worst_ratio},
                      {"worst_lse_over_tol", worst_lse_ratio}, {"planted_share_head0", planted_share},
                      {"step_ms", step_ms}});
  }
  double gib = 0, fill = 0;
  for (const auto& rr : res) {
    gib = std::max(gib, rr.cache_gib);
    fill = std::max(fill, rr.fill_ms);
  }
  std::printf("%s: %lld tokens, %.2f GiB of cache per GPU (%d layers), filled in %.0f ms (slowest rank)\n",
              ok ? "PASS" : "FAIL", static_cast<long long>(o.tokens), gib, cache_layers, fill);
  if (!o.json.empty()) {
    nlohmann::json j = {{"ranks", o.ranks}, {"tokens", o.tokens}, {"format", std::string(format_name(o.format))},
                        {"heads", o.heads}, {"model", o.model}, {"cache_layers", cache_layers},
                        {"cache_gib_per_gpu", gib}, {"fill_ms", fill}, {"layers", layers}, {"pass", ok},
                        {"planner", pr(plan)}, {"planner_4gpu", pr(plan4)}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  return ok ? 0 : 1;
}
