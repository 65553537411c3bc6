// The CUDA benchmark: the GPU's ceilings (device-to-device copy; bf16 tensor-core GEMM
// through cuBLAS) and, for every KV format, attention at memory-bound, compute-bound
// and sparse shapes, plus the cache writers - each as a fraction of the ceiling
// measured in the same run.
//
// Timing: CUDA events around one decode step (split + combine kernels together), the
// L2 flushed (a 512 MiB memset) before every repetition, warm-up first, median of
// --reps. Bytes = q + cache records read + out; FLOPs = 2 H s_q tokens (576 + 512).
// On an sm_90 device every attention shape runs on every kernel (MLAKV_CUDA_ATTENTION
// = sm80, the portable mma.sync kernel, sm90, the 16-row warp-specialized Hopper kernel,
// then sm90_rows, the many-row one, where the shape has >= 64 rows per request, and
// sm90_nat, the natural-arrangement many-row one, for bf16 dense shapes of >= 64 rows) over the
// same cache contents, each with its own suggested split count (and, with --splits
// N[,M...], at those split counts too). The last column, xfloor, is the step time over
// the DRAM floor (bytes / the measured copy bandwidth).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <curand.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "mlakv/cuda.h"
#include "mlakv/numerics.h"

namespace {

using namespace mlakv;
using bench::check;
using bench::kFlushBytes;



struct Timer {
  cudaEvent_t a, b;
  Timer() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

void* flush_buf = nullptr;

// Median milliseconds of `reps` runs of fn, L2 flushed before each.
template <class F>
double time_ms(int reps, F fn, bool flush = true) {
  Timer t;
  for (int w = 0; w < 3; ++w) fn();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    if (flush) CHECK_CUDA(cudaMemsetAsync(flush_buf, r & 0xFF, kFlushBytes));
    CHECK_CUDA(cudaEventRecord(t.a));
    fn();
    CHECK_CUDA(cudaEventRecord(t.b));
    CHECK_CUDA(cudaEventSynchronize(t.b));
    float x = 0;
    CHECK_CUDA(cudaEventElapsedTime(&x, t.a, t.b));
    ms.push_back(x);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double copy_ceiling_tbps(int reps) {
  const std::size_t bytes = std::size_t{4} << 30;
  void *a, *b;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  const double ms = time_ms(reps, [&] { CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, false);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) * 1e-12;
}

double gemm_ceiling_tflops(int reps) {
  const int n = 8192;
  std::vector<uint16_t> h(static_cast<std::size_t>(n) * n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : h) x = f32_to_bf16(u(rng));  // random data: zeros would run faster
  void *A, *B, *C;
  const std::size_t bytes = h.size() * 2;
  CHECK_CUDA(cudaMalloc(&A, bytes));
  CHECK_CUDA(cudaMalloc(&B, bytes));
  CHECK_CUDA(cudaMalloc(&C, bytes));
  CHECK_CUDA(cudaMemcpy(A, h.data(), bytes, cudaMemcpyHostToDevice));
  std::shuffle(h.begin(), h.end(), rng);
  CHECK_CUDA(cudaMemcpy(B, h.data(), bytes, cudaMemcpyHostToDevice));
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  const float alpha = 1.0f, beta = 0.0f;
  const double ms = time_ms(reps, [&] {
    cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, &beta, C,
                 CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }, false);
  cublasDestroy(handle);
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  return 2.0 * n * static_cast<double>(n) * n / (ms * 1e-3) * 1e-12;
}

constexpr int kNumShapes = 14;  // the entries of main's shape table (--shape takes 0 .. kNumShapes - 1)

struct Shape {
  std::string kind;  // "decode" or "sparse"
  int B, H, s_q;
  int ctx;   // tokens per request (pool size for sparse)
  int topk;  // sparse only
};

struct Result {
  std::string kernel;
  std::string format, kind;
  int B, H, s_q, ctx, topk, splits;
  double ms, tokens_per_s, tbps, tflops, frac_bw, frac_mm;
  bool suggested;  // the split count suggest_num_splits gave (else a --splits one)
  double floor_ms;  // bytes / copy bandwidth
};

// Times the shape once per attention kernel that can run it (MLAKV_CUDA_ATTENTION=sm80,
// then sm90 where the device has it), on the same cache contents.
std::vector<Result> run_shape(KvFormat f, const Shape& sh, int reps, double copy_tbps, double mm_tflops,
                              curandGenerator_t gen, int sms, const std::vector<std::string>& kernels,
                              const std::vector<int>& extra_splits) {
  const int64_t B = sh.B, T = static_cast<int64_t>(sh.B) * sh.ctx;
  const int bs = 64;
  const int64_t blocks_per_req = (sh.ctx + bs - 1) / bs;
  const int64_t num_blocks = B * blocks_per_req;
  const int rb = record_bytes(f);
  uint8_t* cache;
  CHECK_CUDA(cudaMalloc(&cache, static_cast<std::size_t>(num_blocks) * bs * rb));
  CacheLayerView v;
  v.data = cache;
  v.num_blocks = num_blocks;
  v.block_size = bs;
  v.record_bytes = rb;
  v.format = f;
  v.device = Device::cuda(0);
  bench::fill_random_records(v, num_blocks * bs, gen, nullptr);
  float *q, *out, *lse;
  const int64_t rows = B * sh.s_q * sh.H;
  CHECK_CUDA(cudaMalloc(&q, rows * kQkDim * 4));
  CHECK_CUDA(cudaMalloc(&out, rows * kLatentDim * 4));
  CHECK_CUDA(cudaMalloc(&lse, rows * 4));
  curandGenerateNormal(gen, q, static_cast<std::size_t>(rows * kQkDim), 0.0f, 1.0f);
  std::vector<int32_t> table(static_cast<std::size_t>(num_blocks)), lens(static_cast<std::size_t>(B), sh.ctx);
  std::iota(table.begin(), table.end(), 0);
  int32_t *d_table, *d_lens, *d_idx = nullptr;
  CHECK_CUDA(cudaMalloc(&d_table, table.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_lens, lens.size() * 4));
  CHECK_CUDA(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  MlaAttentionParams p;
  p.q = TensorView::contiguous(q, DType::kF32, {B, sh.s_q, sh.H, kQkDim}, v.device);
  p.cache = v;
  p.block_table = TensorView::contiguous(d_table, DType::kI32, {B, blocks_per_req}, v.device);
  p.seqlens = TensorView::contiguous(d_lens, DType::kI32, {B}, v.device);
  if (sh.kind == "sparse") {
    std::vector<int32_t> idx(static_cast<std::size_t>(B * sh.s_q * sh.topk));
    std::mt19937 rng(5);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t k = 0; k < sh.s_q * sh.topk; ++k) {
        idx[static_cast<std::size_t>(b * sh.s_q * sh.topk + k)] =
            static_cast<int32_t>(b * blocks_per_req * bs + std::uniform_int_distribution<int>(0, sh.ctx - 1)(rng));
      }
    }
    CHECK_CUDA(cudaMalloc(&d_idx, idx.size() * 4));
    CHECK_CUDA(cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    p.indices = TensorView::contiguous(d_idx, DType::kI32, {B, sh.s_q, sh.topk}, v.device);
  }
  p.softmax_scale = 0.1352f;
  p.out = TensorView::contiguous(out, DType::kF32, {B, sh.s_q, sh.H, kLatentDim}, v.device);
  p.lse = TensorView::contiguous(lse, DType::kF32, {B, sh.s_q, sh.H}, v.device);
  std::vector<Result> results;
  for (const std::string& kernel : kernels) {
    setenv("MLAKV_CUDA_ATTENTION", kernel.c_str(), 1);
    const int suggested = cuda::suggest_num_splits(p, sms);
    std::vector<int> split_list = {suggested};
    for (int s : extra_splits) {
      if (std::find(split_list.begin(), split_list.end(), s) == split_list.end()) split_list.push_back(s);
    }
    for (int splits : split_list) {
      p.num_splits = splits;
      auto plan = cuda::plan_mla_attention(p);
      if (!plan.ok() && kernel != "sm80") {  // a format or mode this kernel does not serve (the path says why)
        std::printf("%-9s %-22s skipped: %s\n", kernel.c_str(), std::string(format_name(f)).c_str(),
                    plan.status().message().substr(0, 80).c_str());
        break;
      }
      check(plan.status(), "plan");
      void* ws = nullptr;
      if (plan->workspace_bytes > 0) CHECK_CUDA(cudaMalloc(&ws, plan->workspace_bytes));
      const double ms = time_ms(reps, [&] { check(cuda::run_mla_attention(p, *plan, ws, nullptr), "run"); });
      CHECK_CUDA(cudaGetLastError());
      const double tokens = sh.kind == "sparse" ? static_cast<double>(B) * sh.s_q * sh.topk : static_cast<double>(T);
      const double bytes =
          static_cast<double>(rows) * kQkDim * 4 + tokens * rb + static_cast<double>(rows) * (kLatentDim + 1) * 4;
      const double per_req_tokens = sh.kind == "sparse" ? static_cast<double>(sh.topk) : static_cast<double>(sh.ctx);
      const double flops = 2.0 * sh.H * sh.s_q * per_req_tokens * (kQkDim + kLatentDim) * B;
      Result r{cuda::attention_path_name(plan->path), std::string(format_name(f)), sh.kind, sh.B, sh.H, sh.s_q, sh.ctx,
               sh.topk, p.num_splits, ms, tokens / (ms * 1e-3), bytes / (ms * 1e-3) * 1e-12,
               flops / (ms * 1e-3) * 1e-12, 0, 0, splits == suggested, bytes / (copy_tbps * 1e12) * 1e3};
      r.frac_bw = r.tbps / copy_tbps;
      r.frac_mm = r.tflops / mm_tflops;
      results.push_back(r);
      cudaFree(ws);
    }
  }
  unsetenv("MLAKV_CUDA_ATTENTION");
  cudaFree(d_idx);
  cudaFree(d_table);
  cudaFree(d_lens);
  cudaFree(q);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(cache);
  return results;
}

// transform: the mlakv recipe's latent transform (random mu and d, both signed Hadamards).
double writer_gbps(KvFormat f, int reps, curandGenerator_t gen, bool token_scale = false, bool transform = false,
                   bool search = false) {
  const int64_t n = 262144;
  const int rb = record_bytes(f);
  uint8_t* cache;
  float *lat, *rope;
  int64_t* slots;
  CHECK_CUDA(cudaMalloc(&cache, static_cast<std::size_t>(n) * rb));
  CHECK_CUDA(cudaMalloc(&lat, n * kLatentDim * 4));
  CHECK_CUDA(cudaMalloc(&rope, n * kRopeDim * 4));
  CHECK_CUDA(cudaMalloc(&slots, n * 8));
  curandGenerateNormal(gen, lat, static_cast<std::size_t>(n * kLatentDim), 0.0f, 1.0f);
  curandGenerateNormal(gen, rope, static_cast<std::size_t>(n * kRopeDim), 0.0f, 1.0f);
  std::vector<int64_t> hs(static_cast<std::size_t>(n));
  std::iota(hs.begin(), hs.end(), 0);
  std::shuffle(hs.begin(), hs.end(), std::mt19937(2));
  CHECK_CUDA(cudaMemcpy(slots, hs.data(), hs.size() * 8, cudaMemcpyHostToDevice));
  CacheLayerView v;
  v.data = cache;
  v.num_blocks = n / 64;
  v.block_size = 64;
  v.record_bytes = rb;
  v.format = f;
  v.token_scale = token_scale;
  v.nvfp4_scales = search ? Nvfp4ScaleMode::kSearch : Nvfp4ScaleMode::kRn;
  v.device = Device::cuda(0);
  std::optional<cuda::DeviceLatentTransform> dt;
  if (transform) {
    LatentTransformLayer tl = LatentTransformLayer::identity();
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    for (int d = 0; d < kLatentDim; ++d) {
      tl.mu[static_cast<std::size_t>(d)] = 0.01f * nd(rng);
      tl.d[static_cast<std::size_t>(d)] = std::exp(0.3f * nd(rng));
    }
    tl.rotate = tl.rope_rotate = true;
    tl.sign_seed = 1;
    tl.rope_sign_seed = 2;
    auto k = LatentTransformKernel::create(tl);
    check(k.status(), "transform");
    auto up = cuda::DeviceLatentTransform::upload(*k, 0);
    check(up.status(), "upload");
    dt.emplace(std::move(up).value());
    v.outer_scale = dt->outer_scale();
  }
  const TensorView ts = TensorView::contiguous(slots, DType::kI64, {n}, v.device);
  const TensorView tl = TensorView::contiguous(lat, DType::kF32, {n, kLatentDim}, v.device);
  const TensorView tr = TensorView::contiguous(rope, DType::kF32, {n, kRopeDim}, v.device);
  const double ms = time_ms(reps, [&] {
    check(dt ? cuda::write_cache(v, ts, tl, tr, Fp8ScaleMode::kPow2, *dt, nullptr)
             : cuda::write_cache(v, ts, tl, tr, Fp8ScaleMode::kPow2, nullptr),
          "write");
  });
  cudaFree(cache);
  cudaFree(lat);
  cudaFree(rope);
  cudaFree(slots);
  return static_cast<double>(n) * (kQkDim * 4 + 8 + rb) / (ms * 1e-3) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30;
  std::vector<int> only_shapes;  // --shape I[,J...]: those shape indices only
  std::vector<int> extra_splits;  // --splits N[,M...]: those split counts too
  bool skip_ceilings = false;
  bool writers_only = false;  // --writers: the copy ceiling and the cache writers only
  std::string json_path, only, only_kernel;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--format" && i + 1 < argc) only = argv[++i];
    else if (a == "--shape" && i + 1 < argc) {
      const std::string list = argv[++i];
      for (std::size_t pos = 0; pos <= list.size();) {
        const std::size_t comma = std::min(list.find(',', pos), list.size());
        const std::string item = list.substr(pos, comma - pos);
        char* stop = nullptr;
        const long v = std::strtol(item.c_str(), &stop, 10);
        if (item.empty() || *stop != '\0' || v < 0 || v >= kNumShapes) {
          std::fprintf(stderr, "error: --shape takes shape indices in [0, %d], got '%s'\n", kNumShapes - 1, list.c_str());
          return 2;
        }
        only_shapes.push_back(static_cast<int>(v));
        pos = comma + 1;
      }
    }
    else if (a == "--splits" && i + 1 < argc) {
      const std::string list = argv[++i];
      for (std::size_t pos = 0; pos <= list.size();) {
        const std::size_t comma = std::min(list.find(',', pos), list.size());
        const int s = std::atoi(list.substr(pos, comma - pos).c_str());
        if (s < 1 || s > 256) {
          std::fprintf(stderr, "error: --splits takes split counts in [1, 256], got '%s'\n", list.c_str());
          return 2;
        }
        extra_splits.push_back(s);
        pos = comma + 1;
      }
    }
    else if (a == "--no-ceilings") skip_ceilings = true;
    else if (a == "--writers") writers_only = true;
    else if (a == "--kernel" && i + 1 < argc) only_kernel = argv[++i];
    else {
      std::fprintf(stderr, "error: unknown argument '%s' (usage: bench_cuda [--reps N] [--json PATH] [--format F] [--shape I[,J...]] [--splits N[,M...]] [--kernel sm80|sm90|sm90_rows|sm90_nat] [--no-ceilings] [--writers])\n", a.c_str());
      return 2;
    }
  }
  auto props = cuda::device_properties(0);
  check(props.status(), "device");
  CHECK_CUDA(cudaMalloc(&flush_buf, kFlushBytes));
  curandGenerator_t gen;
  curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_DEFAULT);
  curandSetPseudoRandomGeneratorSeed(gen, 1234);

  // --no-ceilings (profiling runs) uses the ceilings measured on this H200 before.
  const double copy = skip_ceilings ? 4.29 : copy_ceiling_tbps(reps);
  const double mm = skip_ceilings || writers_only ? 798.0 : gemm_ceiling_tflops(reps);
  std::printf("device %s, %d SMs, L2 %.0f MiB\n", props->name.c_str(), props->multiprocessors,
              static_cast<double>(props->l2_bytes) / (1 << 20));
  if (writers_only) {
    std::printf("ceilings: device-to-device copy %.2f TB/s (read + write)\n\n", copy);
  } else {
    std::printf("ceilings: device-to-device copy %.2f TB/s (read + write); bf16 GEMM 8192^3 (cuBLAS) %.1f TFLOP/s\n\n",
                copy, mm);
  }
  // Issue 12's shapes: memory-bound decode (H=16), compute-bound dense (H=128 s_q=2),
  // sparse top-k 2048 at H=128/64, and the tensor-parallel sparse shapes (H=8/16 per GPU,
  // s_q=1, B=1/8/64), which FlashMLA's Hopper kernel runs only with heads padded to 64;
  // last, dense B=64 H=64 s_q=1 8K: the memory-bound side of the 64-row kernels' route.
  // (--shape takes these indices.)
  const std::vector<Shape> shapes = {{"decode", 64, 16, 1, 8192, 0},      {"decode", 64, 16, 1, 32768, 0},
                                     {"decode", 128, 16, 1, 8192, 0},     {"decode", 64, 128, 2, 8192, 0},
                                     {"sparse", 64, 128, 2, 32768, 2048}, {"decode", 128, 16, 1, 32768, 0},
                                     {"sparse", 64, 64, 2, 32768, 2048},  {"sparse", 1, 8, 1, 32768, 2048},
                                     {"sparse", 8, 8, 1, 32768, 2048},    {"sparse", 64, 8, 1, 32768, 2048},
                                     {"sparse", 1, 16, 1, 32768, 2048},   {"sparse", 8, 16, 1, 32768, 2048},
                                     {"sparse", 64, 16, 1, 32768, 2048},  {"decode", 64, 64, 1, 8192, 0}};
  if (shapes.size() != static_cast<std::size_t>(kNumShapes)) {
    std::fprintf(stderr, "error: bench_cuda's shape table has %zu entries, kNumShapes says %d\n", shapes.size(), kNumShapes);
    return 2;
  }
  nlohmann::json j;
  j["device"] = props->name;
  j["copy_tbps"] = copy;
  j["gemm_bf16_tflops"] = mm;
  // Both attention kernels where the device runs the sm90 one (--kernel picks one).
  std::vector<std::string> kernels = {"sm80"};
  if (props->major == 9) {
    kernels.push_back("sm90");       // the 16-row Hopper kernel (forced)
    kernels.push_back("sm90_rows");  // the many-row one (64 rows per CTA; shapes of >= 64 rows per request)
    kernels.push_back("sm90_nat");   // the natural-arrangement one (bf16, dense, >= 64 rows per request)
  }
  if (!only_kernel.empty()) kernels = {only_kernel};
  std::printf("%-9s %-22s %-7s %3s %4s %4s %6s %5s %6s %9s %11s %7s %8s %7s %7s %7s\n", "kernel", "format", "kind", "B", "H",
              "s_q", "ctx", "topk", "splits", "ms", "tokens/s", "TB/s", "TFLOP/s", "%copy", "%gemm", "xfloor");
  std::vector<Result> all;
  for (const FormatInfo& fi : all_formats()) {
    if (writers_only) break;
    if (!only.empty() && fi.name != only) continue;
    if (fi.format == KvFormat::kF32) continue;  // a CPU parity-check format: no CUDA kernels
    for (std::size_t si = 0; si < shapes.size(); ++si) {
      if (!only_shapes.empty() && std::find(only_shapes.begin(), only_shapes.end(), static_cast<int>(si)) == only_shapes.end()) {
        continue;
      }
      const Shape& sh = shapes[si];
      for (const Result& r : run_shape(fi.format, sh, reps, copy, mm, gen, props->multiprocessors, kernels, extra_splits)) {
        std::printf("%-9s %-22s %-7s %3d %4d %4d %6d %5d %5d%s %9.4f %11.4g %7.3f %8.1f %6.1f%% %6.1f%% %6.1fx\n",
                    r.kernel.c_str(), r.format.c_str(), r.kind.c_str(), r.B, r.H, r.s_q, r.ctx, r.topk, r.splits,
                    r.suggested ? "*" : " ", r.ms, r.tokens_per_s, r.tbps, r.tflops, 100 * r.frac_bw, 100 * r.frac_mm,
                    r.ms / r.floor_ms);
        std::fflush(stdout);
        j["attention"].push_back({{"kernel", r.kernel}, {"format", r.format}, {"kind", r.kind}, {"B", r.B},
                                  {"H", r.H}, {"s_q", r.s_q}, {"ctx", r.ctx}, {"topk", r.topk}, {"splits", r.splits},
                                  {"ms", r.ms}, {"tokens_per_s", r.tokens_per_s}, {"tbps", r.tbps},
                                  {"tflops", r.tflops}, {"frac_copy", r.frac_bw}, {"frac_gemm", r.frac_mm},
                                  {"suggested_splits", r.suggested}, {"floor_ms", r.floor_ms}});
        if (r.suggested) all.push_back(r);  // the byte-ratio table below: suggested split counts only
      }
    }
  }
  // The byte-ratio targets (issue 12): a format's tokens/s against bf16's on the same
  // kernel and shape (B, H, s_q, context, top-k; the suggested split counts), and against
  // bf16 tokens/s x 1152 / record bytes.
  std::printf("\ntokens/s vs bf16 (same kernel, shape): measured ratio / byte ratio 1152/record_bytes\n");
  for (const Result& r : all) {
    if (r.format == "bf16" || !r.suggested) continue;
    for (const Result& base : all) {
      if (base.format != "bf16" || !base.suggested || base.kernel != r.kernel || base.kind != r.kind || base.H != r.H || base.s_q != r.s_q ||
          base.ctx != r.ctx || base.B != r.B) {
        continue;
      }
      const double ratio = r.tokens_per_s / base.tokens_per_s;
      const double bytes_ratio = 1152.0 / record_bytes(*parse_format(r.format));
      std::printf("  %-9s %-22s %-7s B=%-3d H=%-3d s_q=%d ctx=%-6d topk=%-5d %5.2fx of bf16 (byte ratio %.2fx: %5.1f%%)\n",
                  r.kernel.c_str(), r.format.c_str(), r.kind.c_str(), r.B, r.H, r.s_q, r.ctx, r.topk, ratio,
                  bytes_ratio, 100 * ratio / bytes_ratio);
    }
  }
  std::printf("\ncache writers (262144 tokens, f32 input, shuffled slots; bytes = input read + slot + record written):\n");
  for (const FormatInfo& fi : all_formats()) {
    if ((!only.empty() && fi.name != only) || !only_shapes.empty() || fi.format == KvFormat::kF32) continue;
    // plain, per-token scale (nvfp4), the mlakv latent transform; then (nvfp4) the scale
    // search (Nvfp4ScaleMode::kSearch) without and with the transform.
    for (int mode = 0; mode < 5; ++mode) {
      const bool ts = mode == 1, tf = mode == 2 || mode == 4, se = mode >= 3;
      if ((ts || se) && !is_nvfp4_format(fi.format)) continue;
      const double g = writer_gbps(fi.format, reps, gen, ts, tf, se);
      const std::string name =
          std::string(fi.name) + (ts ? "+token-scale" : "") + (tf ? "+transform" : "") + (se ? "+scale-search" : "");
      std::printf("  %-34s %8.1f GB/s (%.1f%% of copy)\n", name.c_str(), g, 100 * g / (copy * 1e3));
      j["writers"].push_back({{"format", std::string(fi.name)}, {"token_scale", ts}, {"transform", tf},
                              {"nvfp4_scales", se ? "search" : "rn"}, {"gbps", g}});
    }
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  curandDestroyGenerator(gen);
  cudaFree(flush_buf);
  return 0;
}
