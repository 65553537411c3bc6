// The accelerated-vs-reference harness for every CUDA op (STYLE habit 3). It builds in
// CI and runs on a GPU machine (tools/gpu_check.sh). For each case: inputs are made
// on the CPU with the CPU cache code (adversarial layouts: shuffled block tables,
// ragged and empty requests, odd block sizes, unused slots poisoned with NaN), the very
// same cache bytes are copied to the device, the CUDA op runs, and its output is
// checked: NaN/Inf first, guard sentinels around every output, then the error metric.
//
// Attention tolerance (derived per output element). The kernel rounds q, the
// dequantized K/V and the softmax weights P to bf16 and accumulates in fp32. An
// emulation in float64 that applies the same q/K/V roundings leaves:
//  (1) fp32 accumulation of the 576-term scores: |ds| <= d = 576 u scale sum|q K|
//      (u = 2^-24). Scores move numerator and denominator alike, so the weights of
//      the convex combination o = sum_t w_t v_t move by a relative e_s <= e^(2d) - 1
//      and o by at most e_s MAD / (1 - e_s), MAD = sum_t w_t |v_t - o|;
//  (2) P rounded to bf16 (relative <= 2^-8 per weight) in the numerator only (the
//      denominator sums the unrounded fp32 weights), so o moves by at most
//      2^-8 (1 + e_s) MAV, MAV = sum_t w_t |v_t|;
//  (3) the fp32 sums over n tokens and S splits: (2n + 8 + 4S) u max|v|.
// lse: tol = d + (n + 8) u + 4 u |lse| (exp2/log2 approximations included).
// The sm90 kernels (src/cuda/sm90/attention/, the 16-row and the many-row one) round
// differently for the quantized formats: K/V stay exact (e4m3 * scale, e2m1 * sf, int8;
// the outer scale moves into q), q's latent part (and an 8-bit rope's q) is rounded to f16
// after a per-row power-of-two prescale, and P
// to f16 (<= 2^-11, inside the 2^-8 term). The emulation applies exactly those q
// roundings for that kernel, so the same tolerance derivation holds. The natural-arrangement
// kernel (sm90_nat) rounds q, K, V and P to bf16 like the portable kernel (fp8_ds_mla's K / V
// as bf16(e4m3 * scale), an 8-bit rope as bf16(code * rs)), except the nvfp4 latents, which
// stay exact (e2m1 * sf) with the outer scale in q: bf16(q * s_l) on the latent dims.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <limits>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cuda/api/attention_path.h"
#include "cuda/common/status.h"
#include "format/record_codec.h"
#include "mlakv/attention.h"
#include "mlakv/cuda.h"
#include "mlakv/eval_stats.h"
#include "mlakv/cuda_layer.h"
#include "mlakv/hf_config.h"
#include "mlakv/latent_transform.h"
#include "mlakv/mla_layer.h"
#include "mlakv/safetensors.h"
#include "../support/attention_case.h"
#include "../support/record_sweep.h"
#include "record_reader_kernels.h"
#include "writer_primitives_kernels.h"

namespace mlakv {

void PrintTo(KvFormat f, std::ostream* os) { *os << format_name(f); }

namespace {

// A CUDA runtime call that must succeed: the library's one CUDA status helper
// (src/cuda/common/status.h) as a gtest assertion.
#define CUDA_OK(call)                                       \
  do {                                                      \
    const ::mlakv::Status cuda_ok_ = MLAKV_CUDA_STATUS(call); \
    ASSERT_TRUE(cuda_ok_.ok()) << cuda_ok_.to_string();     \
  } while (0)

constexpr double kU = 1.0 / (1 << 24);
constexpr float kSentinel = 12345.5f;
constexpr int kGuard = 64;  // floats of guard on each side of an output

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : n(count) {
    if (count > 0 && cudaMalloc(&ptr, count * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  void upload(const std::vector<T>& h) { cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// ---- cases: shared with tests/attention_test.cc -------------------------------------------
using test::Case;
using Host = test::Built;
using test::build;
using test::token_set;

double bf16r(double x) { return bf16_to_f32(f32_to_bf16(static_cast<float>(x))); }
double f16r(float x) { return static_cast<double>(static_cast<_Float16>(x)); }  // RNE, subnormals kept

// q as the sm90 kernel rounds it for a quantized format: per row, e = 15 - ex where
// amax = max |q_lat * base|, |q_rope| < 2^ex; the latent goes to f16 at M = base * 2^e
// (base = s_l * 2^7 for e2m1, 1 for fp8), the rope to f16 (e4m3 or int8 rope) or bf16 at 2^e.
std::vector<double> sm90_q(const float* q, KvFormat f, float outer) {
  const bool nvfp4 = is_nvfp4_format(f);  // (token-scale layers never reach sm90: attention_path.cc)
  const float base = nvfp4 ? outer * 128.0f : 1.0f;
  float amax = 0.0f;
  for (int d = 0; d < kQkDim; ++d) amax = std::max(amax, std::fabs(q[d] * (d < kLatentDim ? base : 1.0f)));
  int e = 0;
  if (amax > 0.0f && std::isfinite(amax)) {
    int ex;
    (void)std::frexp(amax, &ex);
    e = std::clamp(15 - ex, -100, 100);
  }
  const float m_lat = std::ldexp(base, e), m_rope = std::ldexp(1.0f, e);
  std::vector<double> r(kQkDim);
  for (int d = 0; d < kQkDim; ++d) {
    if (d < kLatentDim) {
      r[static_cast<std::size_t>(d)] = f16r(q[d] * m_lat) / static_cast<double>(m_lat);
    } else if (f == KvFormat::kNvfp4DsMlaFp8Rope || f == KvFormat::kNvfp4DsMlaInt8Rope) {  // 8-bit rope codes
      r[static_cast<std::size_t>(d)] = f16r(q[d] * m_rope) / static_cast<double>(m_rope);
    } else {
      r[static_cast<std::size_t>(d)] = bf16r(q[d]);
    }
  }
  return r;
}

// Float64 emulation with the kernel's input roundings; also the per-element tolerance.
void emulate(const Host& t, float scale, cuda::AttentionPath path, std::vector<double>& o, std::vector<double>& lse,
             std::vector<double>& tol_o, std::vector<double>& tol_l) {
  const Case& c = t.c;
  // The sm90 kernel keeps quantized K/V exact and rounds q its own way (see the top).
  const bool exact_kv =
      (path == cuda::AttentionPath::kSm90 || path == cuda::AttentionPath::kSm90Rows) && c.format != KvFormat::kBf16;
  // sm90_nat on the nvfp4 formats keeps the latent's e2m1 * sf exact in bf16 and moves the
  // outer scale into q: bf16(q * s_l) on the latent dims (and s_l into the output); the rest
  // rounds K / V / q to bf16 like the portable kernel (fp8: bf16(e4m3 * scale), an 8-bit
  // rope bf16(code * rs)).
  const bool nat_nvfp4 = path == cuda::AttentionPath::kSm90Nat && is_nvfp4_format(c.format);
  const int B = static_cast<int>(c.seqlens.size());
  const std::size_t rows = static_cast<std::size_t>(B * c.s_q * c.heads);
  o.assign(rows * kLatentDim, 0.0);
  tol_o.assign(rows * kLatentDim, 0.0);
  lse.assign(rows, -INFINITY);
  tol_l.assign(rows, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < c.s_q; ++i) {
      const auto slots = token_set(t, b, i);
      const std::size_t n = slots.size();
      std::vector<double> keys(n * kQkDim);
      for (std::size_t k = 0; k < n; ++k) {
        float lat[kLatentDim], rope[kRopeDim];
        codec::decode_record(t.view.format, t.view.record(slots[k]), t.view.outer_scale, lat, rope, t.view.token_scale);
        for (int d = 0; d < kLatentDim; ++d) {
          keys[k * kQkDim + static_cast<std::size_t>(d)] = exact_kv || nat_nvfp4 ? lat[d] : bf16r(lat[d]);
        }
        for (int d = 0; d < kRopeDim; ++d) {
          keys[k * kQkDim + kLatentDim + static_cast<std::size_t>(d)] = exact_kv ? rope[d] : bf16r(rope[d]);
        }
      }
      for (int h = 0; h < c.heads; ++h) {
        const std::size_t row = static_cast<std::size_t>((b * c.s_q + i) * c.heads + h);
        if (n == 0) continue;
        const float* qr = t.q.data() + row * kQkDim;
        std::vector<double> qe(kQkDim);
        if (exact_kv) {
          qe = sm90_q(qr, c.format, t.view.outer_scale);
        } else {
          for (int d = 0; d < kQkDim; ++d) qe[static_cast<std::size_t>(d)] = bf16r(qr[d]);
          if (nat_nvfp4) {
            const float sl = t.view.outer_scale;
            for (int d = 0; d < kLatentDim; ++d) qe[static_cast<std::size_t>(d)] = bf16r(qr[d] * sl) / static_cast<double>(sl);
          }
        }
        std::vector<double> s(n);
        double mx = -INFINITY, dmax = 0;
        for (std::size_t k = 0; k < n; ++k) {
          double dot = 0, sabs = 0;
          for (int d = 0; d < kQkDim; ++d) {
            const double pr = qe[static_cast<std::size_t>(d)] * keys[k * kQkDim + static_cast<std::size_t>(d)];
            dot += pr;
            sabs += std::fabs(pr);
          }
          s[k] = dot * scale;
          dmax = std::max(dmax, 576.0 * kU * scale * sabs);
          mx = std::max(mx, s[k]);
        }
        double sum = 0;
        std::vector<double> w(n);
        for (std::size_t k = 0; k < n; ++k) sum += (w[k] = std::exp(s[k] - mx));
        const double es = std::expm1(2 * dmax);
        for (int d = 0; d < kLatentDim; ++d) {
          double acc = 0, vmax = 0, mav = 0;
          for (std::size_t k = 0; k < n; ++k) {
            const double v = keys[k * kQkDim + static_cast<std::size_t>(d)];
            acc += w[k] * v;
            mav += w[k] * std::fabs(v);
            vmax = std::max(vmax, std::fabs(v));
          }
          const double od = acc / sum;
          double mad = 0;
          for (std::size_t k = 0; k < n; ++k) mad += w[k] * std::fabs(keys[k * kQkDim + static_cast<std::size_t>(d)] - od);
          mad /= sum;
          mav /= sum;
          o[row * kLatentDim + static_cast<std::size_t>(d)] = od;
          tol_o[row * kLatentDim + static_cast<std::size_t>(d)] = es * mad / (1 - es) + std::ldexp(1.0, -8) * (1 + es) * mav +
                                                                  (2.0 * static_cast<double>(n) + 8 + 4.0 * c.splits) * kU * vmax + 1e-30;
        }
        lse[row] = mx + std::log(sum);
        tol_l[row] = dmax + (static_cast<double>(n) + 8) * kU + 4 * kU * std::fabs(lse[row]);
      }
    }
  }
}

// Runs the case on the device; returns out/lse (guards checked).
void run_device(const Host& t, std::vector<float>& out, std::vector<float>& lse, cuda::AttentionPath& path,
                bool use_graph = false) {
  const Case& c = t.c;
  const int64_t B = static_cast<int64_t>(c.seqlens.size());
  const std::size_t rows = static_cast<std::size_t>(B * c.s_q * c.heads);
  const std::size_t cache_bytes = static_cast<std::size_t>(t.view.num_slots()) * t.view.record_bytes;
  DeviceBuffer<uint8_t> d_cache(cache_bytes);
  cudaMemcpy(d_cache.ptr, t.view.data, cache_bytes, cudaMemcpyHostToDevice);
  DeviceBuffer<float> d_q(t.q.size());
  DeviceBuffer<uint16_t> d_q16(std::max<std::size_t>(1, t.q16.size()));
  if (c.bf16_q) d_q16.upload(t.q16); else d_q.upload(t.q);
  DeviceBuffer<int32_t> d_table(t.table.size()), d_len(t.seqlens.size()), d_idx(std::max<std::size_t>(1, t.indices.size())),
      d_tl(std::max<std::size_t>(1, t.topk_len.size()));
  d_table.upload(t.table);
  d_len.upload(t.seqlens);
  if (c.sparse) {
    d_idx.upload(t.indices);
    d_tl.upload(t.topk_len);
  }
  // Outputs framed by guard sentinels.
  std::vector<float> guard_o(rows * kLatentDim + 2 * kGuard, kSentinel), guard_l(rows + 2 * kGuard, kSentinel);
  DeviceBuffer<float> d_out(guard_o.size()), d_lse(guard_l.size());
  d_out.upload(guard_o);
  d_lse.upload(guard_l);

  MlaAttentionParams p;
  p.q = c.bf16_q ? TensorView::contiguous(d_q16.ptr, DType::kBF16, {B, c.s_q, c.heads, kQkDim}, Device::cuda(0))
                 : TensorView::contiguous(d_q.ptr, DType::kF32, {B, c.s_q, c.heads, kQkDim}, Device::cuda(0));
  p.cache = t.view;
  p.cache.data = d_cache.ptr;
  p.cache.device = Device::cuda(0);
  p.block_table = TensorView::contiguous(d_table.ptr, DType::kI32, {B, t.max_blocks}, Device::cuda(0));
  p.seqlens = TensorView::contiguous(d_len.ptr, DType::kI32, {B}, Device::cuda(0));
  if (c.sparse) {
    p.indices = TensorView::contiguous(d_idx.ptr, DType::kI32, {B, c.s_q, c.topk}, Device::cuda(0));
    if (c.topk_length) p.topk_length = TensorView::contiguous(d_tl.ptr, DType::kI32, {B}, Device::cuda(0));
  }
  p.softmax_scale = 0.1352f;
  p.causal = c.causal;
  p.num_splits = c.splits;
  p.out = TensorView::contiguous(d_out.ptr + kGuard, DType::kF32, {B, c.s_q, c.heads, kLatentDim}, Device::cuda(0));
  p.lse = TensorView::contiguous(d_lse.ptr + kGuard, DType::kF32, {B, c.s_q, c.heads}, Device::cuda(0));
  auto plan = cuda::plan_mla_attention(p);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  path = plan->path;
  DeviceBuffer<uint8_t> ws(std::max<std::size_t>(1, plan->workspace_bytes));
  // A workspace of NaNs (0xFF bytes): the combine may read only partials the attention
  // kernel wrote in this run, and must drop zero-weight (empty) ones unread.
  CUDA_OK(cudaMemset(ws.ptr, 0xFF, std::max<std::size_t>(1, plan->workspace_bytes)));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  if (use_graph) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status st = cuda::run_mla_attention(p, *plan, ws.ptr, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, stream));  // first replay on the original contents
    CUDA_OK(cudaStreamSynchronize(stream));
    // Replay with new contents written in place: scale q by -1 (new scores, same shapes).
    std::vector<float> q2 = t.q;
    for (float& x : q2) x = -x;
    if (c.bf16_q) {
      std::vector<uint16_t> q16 = t.q16;
      for (uint16_t& x : q16) x ^= 0x8000u;
      d_q16.upload(q16);
    } else {
      d_q.upload(q2);
    }
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  } else {
    const Status st = cuda::run_mla_attention(p, *plan, ws.ptr, stream);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  cudaStreamDestroy(stream);
  const auto go = d_out.download(), gl = d_lse.download();
  for (int k = 0; k < kGuard; ++k) {
    ASSERT_EQ(go[static_cast<std::size_t>(k)], kSentinel) << "out guard before, " << k;
    ASSERT_EQ(go[go.size() - 1 - static_cast<std::size_t>(k)], kSentinel) << "out guard after, " << k;
    ASSERT_EQ(gl[static_cast<std::size_t>(k)], kSentinel) << "lse guard before, " << k;
    ASSERT_EQ(gl[gl.size() - 1 - static_cast<std::size_t>(k)], kSentinel) << "lse guard after, " << k;
  }
  out.assign(go.begin() + kGuard, go.end() - kGuard);
  lse.assign(gl.begin() + kGuard, gl.end() - kGuard);
}

// Runs a built case (its table and token sets possibly edited after build) and checks it;
// with expect_path, the plan must have picked that kernel path (a forced one).
void check_built(Host& t, bool use_graph = false, const char* expect_path = nullptr) {
  const Case& c = t.c;
  SCOPED_TRACE(test::describe(c));
  std::vector<float> out, lse;
  cuda::AttentionPath path{};
  run_device(t, out, lse, path, use_graph);
  SCOPED_TRACE(std::string("kernel path ") + cuda::attention_path_name(path));
  if (::testing::Test::HasFatalFailure()) return;
  if (expect_path != nullptr) {
    ASSERT_STREQ(cuda::attention_path_name(path), expect_path) << "the plan did not take the forced path";
  }
  if (use_graph) {  // the graph's last replay ran with q negated
    for (float& x : t.q) x = -x;
  }
  std::vector<double> eo, el, to, tl;
  emulate(t, 0.1352f, path, eo, el, to, tl);
  // NaN / Inf first.
  for (std::size_t r = 0; r < lse.size(); ++r) {
    ASSERT_FALSE(std::isnan(lse[r])) << "lse NaN at row " << r;
    if (std::isinf(el[r])) {
      ASSERT_EQ(lse[r], -INFINITY) << "empty row " << r << " must give lse -inf";
    } else {
      ASSERT_TRUE(std::isfinite(lse[r])) << "lse not finite at row " << r;
    }
  }
  for (std::size_t k = 0; k < out.size(); ++k) ASSERT_TRUE(std::isfinite(out[k])) << "out not finite at " << k;
  ErrorStats stats;  // the eval room's accumulator over every non-empty row
  for (std::size_t r = 0; r < lse.size(); ++r) {
    if (std::isinf(el[r])) {
      for (int d = 0; d < kLatentDim; ++d) ASSERT_EQ(out[r * kLatentDim + static_cast<std::size_t>(d)], 0.0f) << "empty row " << r;
      continue;
    }
    ASSERT_LE(std::fabs(lse[r] - el[r]), tl[r]) << "lse row " << r << ": " << lse[r] << " vs " << el[r];
    for (int d = 0; d < kLatentDim; ++d) {
      const std::size_t k = r * kLatentDim + static_cast<std::size_t>(d);
      const double err = std::fabs(out[k] - eo[k]);
      stats.notify(eo[k], out[k]);
      ASSERT_LE(err, to[k]) << "out row " << r << " dim " << d << ": " << out[k] << " vs " << eo[k];
    }
  }
  if (stats.count() > 0) {
    EXPECT_GT(stats.cosine(), 1 - 1e-4) << "cosine";
  }
  const double max_err = stats.max_abs();
  ::testing::Test::RecordProperty("max_abs_err", std::to_string(max_err));
}

void check_case(const Case& c, bool use_graph = false, const char* expect_path = nullptr) {
  Host t = build(c);
  check_built(t, use_graph, expect_path);
}

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_FAIL() << "no CUDA device: this harness runs on a GPU machine (tools/gpu_check.sh)";
  }
};

const KvFormat kFormats[] = {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                             KvFormat::kNvfp4DsMlaInt8Rope};
// The formats the sm90 kernel serves (all five; token-scale layers run on sm80 on Hopper, for now).
const KvFormat kSm90Formats[] = {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla,
                                 KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope};
// The formats the many-row sm90 kernel serves (the same five).
const KvFormat kSm90RowsFormats[] = {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla,
                                     KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope};
// The formats the natural-arrangement kernel serves (sm90_nat).
const KvFormat kNatFormats[] = {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                                KvFormat::kNvfp4DsMlaInt8Rope};
const KvFormat kNvfp4Formats[] = {KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope};

// ---- attention: one named case per parameter set ------------------------------------------
// Each case is one GoogleTest test named by its parameters, e.g.
//   Dense/CudaAttention.MatchesTheEmulation/fp8_ds_mla_H16_sq1_bs33_splits2_dense
// so any one runs alone with --gtest_filter; it prints its full parameters first.
struct AttnCase {
  Case c;
  bool graph = false;           // capture in a CUDA graph, replay with new contents
  const char* force = nullptr;  // MLAKV_CUDA_ATTENTION for the case on a Hopper device (elsewhere: the plan's pick)
};

// Sets MLAKV_CUDA_ATTENTION for one scope.
struct KernelEnv {
  explicit KernelEnv(const char* v) { setenv("MLAKV_CUDA_ATTENTION", v, 1); }
  ~KernelEnv() { unsetenv("MLAKV_CUDA_ATTENTION"); }
};

bool is_hopper() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
}


std::string case_name(const AttnCase& a) {
  const Case& c = a.c;
  std::string s = std::string(format_name(c.format)) + "_H" + std::to_string(c.heads) + "_sq" + std::to_string(c.s_q) +
                  "_bs" + std::to_string(c.block_size) + "_splits" + std::to_string(c.splits) +
                  (c.sparse ? "_sparse_topk" + std::to_string(c.topk) : "_dense");
  if (!c.causal) s += "_full";
  if (c.bf16_q) s += "_bf16q";
  if (c.topk_length) s += "_topklen";
  if (c.token_scale) s += "_tokenscale";
  if (a.graph) s += "_graph";
  return s;
}

std::string case_params(const AttnCase& a) {
  std::string s = test::describe(a.c) + " outer_scale=" + std::to_string(a.c.outer_scale) +
                  " q=" + (a.c.bf16_q ? "bf16" : "f32") + " seed=" + std::to_string(a.c.seed);
  if (a.c.topk_length) s += " topk_length";
  if (a.graph) s += " graph-replay";
  if (a.force != nullptr) s += std::string(" MLAKV_CUDA_ATTENTION=") + a.force + " (on Hopper)";
  return s;
}

void PrintTo(const AttnCase& a, std::ostream* os) { *os << case_params(a); }

class CudaAttention : public ::testing::TestWithParam<AttnCase> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_FAIL() << "no CUDA device: this harness runs on a GPU machine (tools/gpu_check.sh)";
  }
};

TEST_P(CudaAttention, MatchesTheEmulation) {
  const AttnCase& a = GetParam();
  std::printf("  case: %s\n", case_params(a).c_str());
  RecordProperty("case", case_params(a));
  std::optional<KernelEnv> env;
  if (a.force != nullptr && is_hopper()) env.emplace(a.force);
  check_case(a.c, a.graph, env ? a.force : nullptr);
}

std::string attn_case_name(const ::testing::TestParamInfo<AttnCase>& info) { return case_name(info.param); }

std::vector<AttnCase> dense_cases() {
  std::vector<AttnCase> v;
  for (KvFormat f : kFormats) {
    for (int heads : {1, 8, 16, 64, 128}) {
      for (int bs : {1, 16, 64, 33}) {
        Case c;
        c.format = f;
        c.heads = heads;
        c.block_size = bs;
        c.seqlens = {0, 77, 1, 160};
        c.outer_scale = format_info(f).has_outer_scale ? 0.75f : 1.0f;
        c.splits = (heads + bs) % 3 + 1;
        c.seed = static_cast<uint32_t>(heads * 100 + bs);
        v.push_back({c});
      }
    }
  }
  return v;
}

std::vector<AttnCase> causal_cases() {
  std::vector<AttnCase> v;
  for (KvFormat f : kFormats) {
    for (int s_q : {1, 2, 4}) {
      for (int splits : {1, 3, 8}) {
        Case c;
        c.format = f;
        c.block_size = 64;
        c.s_q = s_q;
        c.heads = 16;
        c.splits = splits;
        c.seqlens = {300, 3, 2, 45};
        c.bf16_q = splits == 3;
        c.seed = static_cast<uint32_t>(s_q * 10 + splits);
        v.push_back({c});
      }
    }
    Case full;
    full.format = f;
    full.block_size = 64;
    full.heads = 16;
    full.s_q = 2;
    full.causal = false;
    full.seqlens = {64, 130};
    v.push_back({full});
  }
  return v;
}

std::vector<AttnCase> sparse_cases() {
  std::vector<AttnCase> v;
  for (KvFormat f : kFormats) {
    for (int heads : {16, 64, 128}) {
      Case c;
      c.format = f;
      c.block_size = 64;
      c.sparse = true;
      c.heads = heads;
      c.s_q = 2;
      c.topk = 96;
      c.seqlens = {200, 0, 150};
      c.splits = heads == 64 ? 3 : 1;
      c.topk_length = heads == 128;
      c.seed = static_cast<uint32_t>(heads);
      v.push_back({c});
    }
  }
  return v;
}

std::vector<AttnCase> graph_cases() {
  std::vector<AttnCase> v;
  for (KvFormat f : {KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMlaFp8Rope}) {
    Case c;
    c.format = f;
    c.block_size = 64;
    c.heads = 16;
    c.splits = 4;
    c.seqlens = {500, 33};
    v.push_back({c, /*graph=*/true});
  }
  return v;
}

// The tensor-parallel sparse shape (issue 12): 8 or 16 heads, one query, top-k 2048
// over a longer context (a fifth of the indices invalid, unused slots NaN), at split
// counts the TP policy picks (32 = one 64-token tile each on sm90), an uneven one (7),
// more splits than tiles (64: half the partials empty) and 1; B = 3 with an empty
// request, a top-k length per request, and a graph replay at 32 splits (the combine
// launched as a programmatic dependent inside the graph).
std::vector<AttnCase> tp_sparse_cases() {
  std::vector<AttnCase> v;
  for (KvFormat f : kSm90Formats) {
    for (int heads : {8, 16}) {
      for (int splits : {1, 7, 32, 64}) {
        Case c;
        c.format = f;
        c.block_size = 64;
        c.sparse = true;
        c.heads = heads;
        c.s_q = 1;
        c.topk = 2048;
        c.seqlens = splits == 7 ? std::vector<int>{2500, 0, 4000} : std::vector<int>{3000};
        c.topk_length = splits == 7;
        c.splits = splits;
        c.outer_scale = format_info(f).has_outer_scale ? 0.75f : 1.0f;
        c.seed = static_cast<uint32_t>(1300 + heads + splits);
        v.push_back({c, /*graph=*/splits == 32 && heads == 8});
      }
    }
  }
  return v;
}

// The nvfp4 per-token scale mode: each record's s_t replaces s_l in the reader (sm80; on
// Hopper the plan routes these layers to sm80 too).
std::vector<AttnCase> token_scale_cases() {
  std::vector<AttnCase> v;
  for (KvFormat f : kNvfp4Formats) {
    for (int variant = 0; variant < 3; ++variant) {
      Case c;
      c.format = f;
      c.token_scale = true;
      c.heads = variant == 2 ? 128 : 16;
      c.block_size = variant == 0 ? 64 : 33;
      c.s_q = variant == 1 ? 2 : 1;
      c.splits = variant + 1;
      c.seqlens = {0, 170, 1, 64};
      c.sparse = variant == 1;
      c.topk = c.sparse ? 70 : 0;
      c.seed = static_cast<uint32_t>(700 + variant);
      v.push_back({c});
    }
  }
  return v;
}

// The reduced set run under compute-sanitizer memcheck / racecheck (tools/gpu_check.sh
// filters on the name ReducedSanitizerSet).
std::vector<AttnCase> sanitizer_cases() {
  std::vector<AttnCase> v;
  for (KvFormat f : kFormats) {
    Case c;
    c.format = f;
    c.heads = 16;
    c.s_q = 2;
    c.block_size = 33;
    c.splits = 2;
    c.seqlens = {70, 0, 5};
    v.push_back({c});
    c.sparse = true;
    c.topk = 40;
    v.push_back({c});
  }
  for (KvFormat f : {KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla}) {  // many splits: 4-group combine, empty parts
    Case c;
    c.format = f;
    c.heads = 8;
    c.block_size = 64;
    c.sparse = true;
    c.topk = 256;
    c.splits = 40;
    c.seqlens = {300, 0};
    v.push_back({c});
  }
  for (KvFormat f : kSm90RowsFormats) {  // the many-row sm90 kernel (64 rows: H = 32, s_q = 2; sparse H = 64)
    Case c;
    c.format = f;
    c.heads = 32;
    c.s_q = 2;
    c.block_size = 33;
    c.splits = 2;
    c.seqlens = {70, 0, 5};
    v.push_back({c});
    c.heads = 64;
    c.sparse = true;
    c.topk = 40;
    v.push_back({c, false, "sm90_rows"});
    if (f != KvFormat::kBf16) {  // the natural-arrangement kernel's sparse gathers (64 and 128 heads)
      c.topk = 100;
      v.push_back({c, false, "sm90_nat"});
      c.heads = 128;
      c.s_q = 1;
      v.push_back({c, false, "sm90_nat"});
    }
  }
  for (int bs : {16, 64}) {  // the natural-arrangement kernel (bf16, dense, 64 rows: H = 64 or H = 32 x s_q = 2)
    for (KvFormat f : kNatFormats) {
    Case c;
    c.format = f;
    c.outer_scale = format_info(f).has_outer_scale ? 0.6f : 1.0f;
    c.heads = bs == 16 ? 64 : 32;
    c.s_q = bs == 16 ? 1 : 2;
    c.block_size = bs;
    c.splits = 2;
    c.seqlens = {170, 0, 5};
    v.push_back({c});
    }
  }
  Case ts;  // the token-scale reader path
  ts.format = KvFormat::kNvfp4DsMlaInt8Rope;
  ts.token_scale = true;
  ts.heads = 16;
  ts.s_q = 2;
  ts.block_size = 33;
  ts.splits = 2;
  ts.seqlens = {70, 0, 5};
  v.push_back({ts});
  return v;
}

// The many-row sm90 kernel (sm90_rows, 64 rows per CTA; auto-picked on Hopper for >= 64
// rows per request): every format it serves x heads {64, 128} x s_q {1, 2, 4}, dense
// (causal, ragged and empty requests) and sparse (invalid indices, topk_length), block
// sizes {1, 16, 33, 64} and split counts {1, 2, 3, 5} cycled through the cases, bf16 q on
// some. Elsewhere (no Hopper) these run the path the plan picks.
std::vector<AttnCase> many_row_cases() {
  std::vector<AttnCase> v;
  const int block_sizes[] = {1, 16, 33, 64}, split_counts[] = {1, 2, 3, 5};
  int k = 0;
  for (KvFormat f : kSm90RowsFormats) {
    for (int heads : {64, 128}) {
      for (int s_q : {1, 2, 4}) {
        for (int sparse = 0; sparse < 2; ++sparse) {
          Case c;
          c.format = f;
          c.heads = heads;
          c.s_q = s_q;
          c.block_size = block_sizes[k % 4];
          c.splits = split_counts[(k / 4 + k) % 4];
          c.sparse = sparse == 1;
          c.topk = c.sparse ? 100 : 0;
          c.topk_length = c.sparse && k % 3 == 0;
          c.seqlens = c.sparse ? std::vector<int>{130, 0, 65} : std::vector<int>{0, 130, 1, 64};
          c.bf16_q = k % 5 == 2;
          c.outer_scale = format_info(f).has_outer_scale ? 0.75f : 1.0f;
          c.seed = static_cast<uint32_t>(3000 + k);
          v.push_back({c});
          ++k;
        }
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(ManyRowKernel, CudaAttention, ::testing::ValuesIn(many_row_cases()), attn_case_name);

// The natural-arrangement sm90 kernel (sm90_nat: bf16 records, dense, >= 64 rows per
// request; auto-picked on Hopper where it serves): heads {64, 128} x s_q {1, 2, 4}, every
// block size it takes (8, 16, 32, 64, 128: boxes of one page, or several pages per
// 64-token tile), split counts {1, 2, 3, 5}, long requests (the two-stage ring wrapping)
// and short or empty ones (masked tiles over NaN-poisoned unused slots), causal and not,
// bf16 q, and one graph replay (the TMA descriptor travels in the captured launch).
// Elsewhere (no Hopper) these run the path the plan picks.
std::vector<AttnCase> natural_cases() {
  std::vector<AttnCase> v;
  const int block_sizes[] = {8, 16, 32, 64, 128}, split_counts[] = {1, 2, 3, 5};
  int k = 0;
  for (int heads : {64, 128}) {
    for (int s_q : {1, 2, 4}) {
      for (int variant = 0; variant < 2; ++variant) {
        Case c;
        c.format = KvFormat::kBf16;
        c.heads = heads;
        c.s_q = s_q;
        c.block_size = block_sizes[k % 5];
        c.splits = split_counts[(k / 4 + k) % 4];
        c.seqlens = variant == 0 ? std::vector<int>{700, 33, 200} : std::vector<int>{0, 130, 1, 64};
        c.causal = k % 4 != 3;
        c.bf16_q = k % 3 == 1;
        c.seed = static_cast<uint32_t>(4000 + k);
        v.push_back({c, /*graph=*/k == 5});
        ++k;
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(NaturalKernel, CudaAttention, ::testing::ValuesIn(natural_cases()), attn_case_name);

// The natural-arrangement kernel for the quantized records (sm90_nat, forced, so the case
// asserts the path; the codes and scales of each tile half, and an 8-bit rope, are staged
// by TMA and converted in place to bf16(e4m3 * scale), e2m1 * sf * 2^-7 (s_l in q) and
// bf16(code * rs) by the converter warps): heads {64, 128} x s_q {1, 2} x both sequence sets, every block
// size it takes (8, 16, 32, 64, 128), split counts {1, 2, 3, 5}, NaN-poisoned unused slots
// in the last pages, empty and one-token requests, causal and not, bf16 q, an inexact
// outer scale (0.6180339: the product with s_l rounds in fp32 before bf16, as the
// reference's decode does), one graph replay per format.
std::vector<AttnCase> natural_quant_cases() {
  std::vector<AttnCase> v;
  const int block_sizes[] = {8, 16, 32, 64, 128}, split_counts[] = {1, 2, 3, 5};
  int k = 0;
  for (KvFormat f : {KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope}) {
    for (int heads : {64, 128}) {
      for (int s_q : {1, 2}) {
        for (int variant = 0; variant < 2; ++variant) {
          Case c;
          c.format = f;
          c.heads = heads;
          c.s_q = s_q;
          c.block_size = block_sizes[k % 5];
          c.splits = split_counts[(k / 4 + k) % 4];
          c.seqlens = variant == 0 ? std::vector<int>{700, 33, 200} : std::vector<int>{0, 130, 1, 64};
          c.causal = k % 4 != 3;
          c.bf16_q = k % 3 == 1;
          c.outer_scale = format_info(f).has_outer_scale ? (k % 2 == 0 ? 0.75f : 0.6180339f) : 1.0f;
          c.seed = static_cast<uint32_t>(4500 + k);
          v.push_back({c, /*graph=*/k % 8 == 5, "sm90_nat"});
          ++k;
        }
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(NaturalKernelQuant, CudaAttention, ::testing::ValuesIn(natural_quant_cases()), attn_case_name);

// The natural-arrangement kernel on sparse (top-k) sets of the quantized records (sm90_nat,
// forced; the converters gather each token's bytes with cp.async, no TMA boxes): heads
// {64, 128} x s_q {1, 2} x top-k lists of 96 (two tiles, the second partial), 700 (eleven,
// an odd count: the second stage's last tile empty) and 2048, a fifth of the indices
// invalid (-1, -7, num_slots, INT32_MAX), per-request top-k lengths, an empty request,
// block sizes {1, 16, 33, 64} (any: nothing is loaded by pages), split counts {1, 2, 3, 5},
// bf16 q, inexact outer scales and one graph replay per format.
std::vector<AttnCase> natural_sparse_cases() {
  std::vector<AttnCase> v;
  const int block_sizes[] = {1, 16, 33, 64}, split_counts[] = {1, 2, 3, 5}, topks[] = {96, 700, 2048};
  int k = 0;
  for (KvFormat f : {KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope}) {
    for (int heads : {64, 128}) {
      for (int s_q : {1, 2}) {
        Case c;
        c.format = f;
        c.sparse = true;
        c.heads = heads;
        c.s_q = s_q;
        c.block_size = block_sizes[k % 4];
        c.splits = split_counts[(k / 4 + k) % 4];
        c.topk = topks[k % 3];
        c.topk_length = k % 3 == 1;
        c.seqlens = c.topk > 1000 ? std::vector<int>{2300, 900} : std::vector<int>{300, 0, 777};
        c.bf16_q = k % 3 == 2;
        c.outer_scale = format_info(f).has_outer_scale ? (k % 2 == 0 ? 0.75f : 0.6180339f) : 1.0f;
        c.seed = static_cast<uint32_t>(4700 + k);
        v.push_back({c, /*graph=*/k % 4 == 3, "sm90_nat"});
        ++k;
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(NaturalKernelSparse, CudaAttention, ::testing::ValuesIn(natural_sparse_cases()), attn_case_name);

INSTANTIATE_TEST_SUITE_P(DenseEveryFormatHeadCountAndBlockSize, CudaAttention, ::testing::ValuesIn(dense_cases()),
                         attn_case_name);
INSTANTIATE_TEST_SUITE_P(CausalMultiTokenAndSplits, CudaAttention, ::testing::ValuesIn(causal_cases()), attn_case_name);
INSTANTIATE_TEST_SUITE_P(SparseWithInvalidIndices, CudaAttention, ::testing::ValuesIn(sparse_cases()), attn_case_name);
INSTANTIATE_TEST_SUITE_P(GraphCaptureAndReplayWithNewContents, CudaAttention, ::testing::ValuesIn(graph_cases()),
                         attn_case_name);
INSTANTIATE_TEST_SUITE_P(TokenScaleMode, CudaAttention, ::testing::ValuesIn(token_scale_cases()), attn_case_name);
INSTANTIATE_TEST_SUITE_P(TensorParallelSparseSplits, CudaAttention, ::testing::ValuesIn(tp_sparse_cases()),
                         attn_case_name);
INSTANTIATE_TEST_SUITE_P(ReducedSanitizerSet, CudaAttention, ::testing::ValuesIn(sanitizer_cases()), attn_case_name);

// ---- the record readers: code by code against the scalar codec -------------------------------
// The sm80 reader (sm80/attention/reader.cuh, the attention's fused dequantization) on
// every code of the format (support/record_sweep.h). The reader forms the codec's
// float32 product and rounds it once to bf16 (the K tile's type), so each bf16 must
// equal bf16_rn(codec value) exactly.
class CudaRecordReader : public ::testing::TestWithParam<KvFormat> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_FAIL() << "no CUDA device: this harness runs on a GPU machine (tools/gpu_check.sh)";
  }
};

TEST_P(CudaRecordReader, MatchesTheScalarCodecCodeByCode) {
  const KvFormat f = GetParam();
  const int rb = record_bytes(f);
  const int64_t n = test::kSweepRecords;
  const std::vector<uint8_t> recs = test::sweep_records(f);
  DeviceBuffer<uint8_t> d_recs(recs.size());
  d_recs.upload(recs);
  DeviceBuffer<uint16_t> d_rows(static_cast<std::size_t>(n) * kQkDim);
  // Each outer scale, then (nvfp4 formats) the token-scale mode: s_t from each record.
  std::vector<std::pair<float, bool>> modes;
  for (float outer : test::sweep_outer_scales(f)) modes.push_back({outer, false});
  if (is_nvfp4_format(f)) modes.push_back({1.0f, true});
  for (auto [outer, token_scale] : modes) {
    SCOPED_TRACE(std::string(format_name(f)) + ", outer scale " + std::to_string(outer) +
                 (token_scale ? ", token-scale mode" : ""));
    std::printf("  sm80 reader, %s, %s: %lld records\n", std::string(format_name(f)).c_str(),
                token_scale ? "token-scale mode" : ("outer scale " + std::to_string(outer)).c_str(),
                static_cast<long long>(n));
    CUDA_OK(cudaMemset(d_rows.ptr, 0xFF, d_rows.n * sizeof(uint16_t)));  // NaN until written
    CUDA_OK(static_cast<cudaError_t>(
        test::dequantize_records_sm80(f, d_recs.ptr, n, outer, d_rows.ptr, nullptr, token_scale)));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = d_rows.download();
    for (int64_t r = 0; r < n; ++r) {
      float want[kQkDim];
      codec::decode_record(f, recs.data() + r * rb, outer, want, want + kLatentDim, token_scale);
      for (int d = 0; d < kQkDim; ++d) {
        const uint16_t g = got[static_cast<std::size_t>(r * kQkDim + d)], w = f32_to_bf16(want[d]);
        ASSERT_EQ(g, w) << "record " << r << " dim " << d << ": reader bf16 0x" << std::hex << g << ", codec "
                        << want[d] << " -> bf16 0x" << w;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, CudaRecordReader, ::testing::ValuesIn(kFormats),
                         [](const ::testing::TestParamInfo<KvFormat>& info) {
                           return std::string(format_name(info.param));
                         });

// ---- the kernel paths: the choice, the forced sm80 path, the sm90 edges -----------------------
// A case's params pointed at device buffers of its sizes, for tests that only plan
// (nothing is uploaded: planning checks devices, shapes and the cache's alignment).
struct PlanParams {
  std::vector<float> out, lse;
  MlaAttentionParams p;
  DeviceBuffer<uint8_t> cache;
  DeviceBuffer<float> q, o, l;
  DeviceBuffer<int32_t> table, seqlens, idx, tl;
  explicit PlanParams(Host& t)
      : p(t.params(out, lse)),
        cache(static_cast<std::size_t>(t.view.num_slots()) * t.view.record_bytes),
        q(t.q.size()),
        o(out.size()),
        l(lse.size()),
        table(t.table.size()),
        seqlens(t.seqlens.size()),
        idx(std::max<std::size_t>(1, t.indices.size())),
        tl(std::max<std::size_t>(1, t.topk_len.size())) {
    const Device dev = Device::cuda(0);
    if (t.c.sparse) {
      p.indices.data = idx.ptr;
      p.indices.device = dev;
      if (t.c.topk_length) {
        p.topk_length.data = tl.ptr;
        p.topk_length.device = dev;
      }
    }
    p.q.data = q.ptr;
    p.q.device = dev;
    p.cache.data = cache.ptr;
    p.cache.device = dev;
    p.block_table.data = table.ptr;
    p.block_table.device = dev;
    p.seqlens.data = seqlens.ptr;
    p.seqlens.device = dev;
    p.out.data = o.ptr;
    p.out.device = dev;
    p.lse.data = l.ptr;
    p.lse.device = dev;
  }
};

// On an sm_90 device the default plan must pick the Hopper kernel (so the tests above
// exercise it there); sm80 forces the portable one; a bad value is a Status.
TEST_F(Cuda, KernelChoiceFollowsTheDeviceAndTheEnvironment) {
  Case c;
  c.format = KvFormat::kFp8DsMla;
  c.heads = 16;
  c.seqlens = {10};
  Host t = build(c);
  PlanParams d(t);
  MlaAttentionParams& p = d.p;
  {
    auto plan = cuda::plan_mla_attention(p);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->path, is_hopper() ? cuda::AttentionPath::kSm90 : cuda::AttentionPath::kSm80);
  }
  {
    KernelEnv env("sm80");
    auto plan = cuda::plan_mla_attention(p);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->path, cuda::AttentionPath::kSm80);
  }
  {
    KernelEnv env("sm90");
    auto plan = cuda::plan_mla_attention(p);
    EXPECT_EQ(plan.ok(), is_hopper());
    p.cache.data = d.cache.ptr + 8;  // misaligned records: only the portable kernel takes them
    auto misaligned = cuda::plan_mla_attention(p);
    EXPECT_FALSE(misaligned.ok());
    p.cache.data = d.cache.ptr;
  }
  {
    // The many-row kernel: never for 16 rows (=sm90_rows refuses them); 128 heads pick
    // it on Hopper, =sm90 keeps them on the 16-row kernel.
    KernelEnv env("sm90_rows");
    EXPECT_FALSE(cuda::plan_mla_attention(p).ok());
  }
  {
    Case w = c;
    w.heads = 128;
    Host tw = build(w);
    PlanParams dw(tw);
    MlaAttentionParams& pw = dw.p;
    auto plan = cuda::plan_mla_attention(pw);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    // fp8 at block size 16: the natural-arrangement kernel (it also serves fp8_ds_mla and nvfp4_ds_mla).
    EXPECT_EQ(plan->path, is_hopper() ? cuda::AttentionPath::kSm90Nat : cuda::AttentionPath::kSm80);
    if (is_hopper()) {
      EXPECT_EQ(plan->row_blocks, 2);
    }
    {
      Case w33 = w;  // a block size the TMA boxes do not tile: the many-row kernel
      w33.block_size = 33;
      Host t33 = build(w33);
      PlanParams d33(t33);
      auto p33 = cuda::plan_mla_attention(d33.p);
      ASSERT_TRUE(p33.ok()) << p33.status().to_string();
      EXPECT_EQ(p33->path, is_hopper() ? cuda::AttentionPath::kSm90Rows : cuda::AttentionPath::kSm80);
    }
    KernelEnv env("sm90");
    auto forced = cuda::plan_mla_attention(pw);
    EXPECT_EQ(forced.ok(), is_hopper());
    if (forced.ok()) {
      EXPECT_EQ(forced->path, cuda::AttentionPath::kSm90);
    }
  }
  {
    // The natural-arrangement kernel: bf16 (and fp8_ds_mla / nvfp4_ds_mla) dense requests of
    // >= 64 rows at the block sizes its TMA boxes tile pick it on Hopper; =sm90_rows keeps
    // them on the many-row kernel; =sm90_nat refuses 16 rows, the token-scale mode, block
    // size 33 and sparse sets.
    Case n = c;
    n.format = KvFormat::kBf16;
    n.heads = 128;
    n.block_size = 64;
    Host tn = build(n);
    PlanParams dn(tn);
    auto plan = cuda::plan_mla_attention(dn.p);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->path, is_hopper() ? cuda::AttentionPath::kSm90Nat : cuda::AttentionPath::kSm80);
    EXPECT_STREQ(cuda::attention_path_name(plan->path), is_hopper() ? "sm90_nat" : "sm80");
    if (is_hopper()) {
      EXPECT_EQ(plan->row_blocks, 2);
    }
    {
      KernelEnv env("sm90_rows");
      auto rows = cuda::plan_mla_attention(dn.p);
      EXPECT_EQ(rows.ok(), is_hopper());
      if (rows.ok()) {
        EXPECT_EQ(rows->path, cuda::AttentionPath::kSm90Rows);
      }
    }
    KernelEnv env("sm90_nat");
    auto forced = cuda::plan_mla_attention(dn.p);
    EXPECT_EQ(forced.ok(), is_hopper());
    EXPECT_FALSE(cuda::plan_mla_attention(p).ok());  // fp8, 16 rows
    Case tsc = n;  // the token-scale mode: not served (sm80 for now)
    tsc.format = KvFormat::kNvfp4DsMlaFp8Rope;
    tsc.token_scale = true;
    Host ttsc = build(tsc);
    PlanParams dtsc(ttsc);
    EXPECT_FALSE(cuda::plan_mla_attention(dtsc.p).ok());
    Case odd = n;
    odd.block_size = 33;
    Host to = build(odd);
    PlanParams dodd(to);
    auto refused = cuda::plan_mla_attention(dodd.p);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("sm90_nat"), std::string::npos) << refused.status().to_string();
    Case sp = n;  // bf16 sparse sets: not served (no converters to gather them)
    sp.sparse = true;
    sp.topk = 16;
    Host ts = build(sp);
    PlanParams dsp(ts);
    EXPECT_FALSE(cuda::plan_mla_attention(dsp.p).ok());
    Case sq = sp;  // a quantized sparse set at block size 33 and 128 heads: served
    sq.format = KvFormat::kFp8DsMla;
    sq.block_size = 33;
    Host tq = build(sq);
    PlanParams dsq(tq);
    auto sparse_nat = cuda::plan_mla_attention(dsq.p);
    EXPECT_EQ(sparse_nat.ok(), is_hopper());
    if (sparse_nat.ok()) {
      EXPECT_EQ(sparse_nat->path, cuda::AttentionPath::kSm90Nat);
      EXPECT_EQ(sparse_nat->row_blocks, 2);
    }
  }
  {
    // Unforced, quantized sparse sets of >= 64 heads pick sm90_nat on Hopper, bf16 ones
    // sm90_rows; 16 heads the 16-row kernel.
    for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMlaInt8Rope}) {
      for (int heads : {16, 64}) {
        Case sp = c;
        sp.format = f;
        sp.heads = heads;
        sp.s_q = 2;
        sp.sparse = true;
        sp.topk = 64;
        Host ts = build(sp);
        PlanParams dsp(ts);
        auto plan = cuda::plan_mla_attention(dsp.p);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const cuda::AttentionPath want = !is_hopper()                ? cuda::AttentionPath::kSm80
                                         : heads < 64                ? cuda::AttentionPath::kSm90
                                         : f == KvFormat::kBf16      ? cuda::AttentionPath::kSm90Rows
                                                                     : cuda::AttentionPath::kSm90Nat;
        EXPECT_EQ(plan->path, want) << format_name(f) << " H=" << heads;
      }
    }
  }
  {
    KernelEnv env("fastest");
    auto plan = cuda::plan_mla_attention(p);
    ASSERT_FALSE(plan.ok());
    EXPECT_NE(plan.status().message().find("MLAKV_CUDA_ATTENTION"), std::string::npos) << plan.status().to_string();
  }
}

// Interim routing (issue 14): token-scale layers have no sm90 kernel, so every device plans
// them on sm80 and MLAKV_CUDA_ATTENTION=sm90 refuses them; nvfp4_ds_mla_int8rope (without the
// mode) plans on the sm90 kernel on an sm_90 device, like the other formats.
TEST_F(Cuda, TokenScaleLayersRunOnSm80AndInt8RopeOnSm90) {
  for (int which = 0; which < 3; ++which) {
    Case c;
    c.format = which == 1 ? KvFormat::kNvfp4DsMlaFp8Rope : KvFormat::kNvfp4DsMlaInt8Rope;
    c.token_scale = which >= 1;
    c.heads = 16;
    c.seqlens = {10};
    SCOPED_TRACE(which == 0 ? "int8 rope" : which == 1 ? "fp8 rope, token-scale mode" : "int8 rope, token-scale mode");
    Host t = build(c);
    PlanParams d(t);
    MlaAttentionParams& p = d.p;
    auto plan = cuda::plan_mla_attention(p);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    const bool sm90 = which == 0 && is_hopper();
    EXPECT_EQ(plan->path, sm90 ? cuda::AttentionPath::kSm90 : cuda::AttentionPath::kSm80);
    KernelEnv env("sm90");
    EXPECT_EQ(cuda::plan_mla_attention(p).ok(), sm90);
  }
}

// The portable kernel on a reduced set of every kind of case (the default on an H200
// is the sm90 kernel, which the tests above cover).
TEST_F(Cuda, PortableKernelWhenForced) {
  KernelEnv env("sm80");
  for (KvFormat f : kFormats) {
    Case c;
    c.format = f;
    c.heads = 16;
    c.s_q = 2;
    c.block_size = 33;
    c.splits = 3;
    c.seqlens = {170, 0, 5};
    c.outer_scale = format_info(f).has_outer_scale ? 0.75f : 1.0f;
    check_case(c);
    if (HasFatalFailure()) return;
    c.sparse = true;
    c.topk = 70;
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

// The sm90 kernel's own edge cases: many tiles per split with the ring wrapping around
// (stages < tiles), a split boundary inside a tile, tiles that end inside a block,
// 128 heads (8 row blocks), strided bf16 q and outer scales far from 1.
TEST_F(Cuda, HopperKernelRingAndSplitEdges) {
  if (!is_hopper()) GTEST_SKIP() << "not an sm_90 device";
  KernelEnv env("sm90");
  for (KvFormat f : kSm90Formats) {
    for (int variant = 0; variant < 3; ++variant) {
      Case c;
      c.format = f;
      c.block_size = variant == 0 ? 64 : (variant == 1 ? 16 : 1);
      c.heads = variant == 2 ? 128 : 16;
      c.s_q = variant == 1 ? 4 : 1;
      c.splits = variant == 0 ? 1 : 5;
      c.seqlens = variant == 2 ? std::vector<int>{97} : std::vector<int>{1000, 31, 33, 600};
      c.bf16_q = variant == 1;
      c.outer_scale = format_info(f).has_outer_scale ? (variant == 0 ? 1e-3f : 37.0f) : 1.0f;
      c.seed = static_cast<uint32_t>(900 + variant);
      check_case(c);
      if (HasFatalFailure()) return;
    }
  }
}

// The warpgroup kernel of the quantized formats (sm90 v8, consumer tiles of 64 tokens
// over two 32-token ring stages): sequences ending on either side of a tile and of a
// stage, split chunks of several tiles with the ring wrapping, causal rows of two
// queries whose visible lengths differ inside one tile, one head (15 empty rows of
// the 16-row tile), bf16 q, and outer scales far from 1.
TEST_F(Cuda, HopperWarpgroupKernelTileEdges) {
  if (!is_hopper()) GTEST_SKIP() << "not an sm_90 device";
  KernelEnv env("sm90");
  for (KvFormat f : kFormats) {
    if (f == KvFormat::kBf16) continue;  // the bf16 format runs the v7 kernel (covered above)
    for (int variant = 0; variant < 3; ++variant) {
      Case c;
      c.format = f;
      c.block_size = variant == 1 ? 16 : 64;
      c.heads = variant == 2 ? 1 : 8;
      c.s_q = variant == 2 ? 1 : 2;
      c.splits = variant == 0 ? 1 : 3;
      c.seqlens = variant == 2 ? std::vector<int>{64, 65, 447} : std::vector<int>{31, 32, 63, 64, 127, 129, 705};
      c.bf16_q = variant == 1;
      c.outer_scale = format_info(f).has_outer_scale ? (variant == 1 ? 1e-3f : 37.0f) : 1.0f;
      c.seed = static_cast<uint32_t>(1200 + variant);
      check_case(c);
      if (HasFatalFailure()) return;
    }
    // Sparse sets (the e2m1 formats' sparse kernels: v10 for the 368-B records, v8's
    // register path for nvfp4_ds_mla): top-k lists around the tile edges, per-request
    // lengths, 16 heads (both of v10's row halves) and 5 (its second half empty).
    for (int variant = 0; variant < 2; ++variant) {
      Case c;
      c.format = f;
      c.block_size = 64;
      c.sparse = true;
      c.heads = variant == 0 ? 16 : 5;
      c.s_q = variant == 0 ? 1 : 2;
      c.topk = variant == 0 ? 193 : 64;
      c.topk_length = variant == 0;
      c.splits = variant == 0 ? 2 : 1;
      c.seqlens = {300, 64, 500};
      c.bf16_q = variant == 1;
      c.outer_scale = format_info(f).has_outer_scale ? 37.0f : 1.0f;
      c.seed = static_cast<uint32_t>(1210 + variant);
      check_case(c);
      if (HasFatalFailure()) return;
    }
  }
}

// The split policy for sparse token sets (suggest_num_splits): a split count in [1, 64]
// whose every split gets tokens, given how the kernel cuts a set of n tokens into S
// chunks (ceil(n / S) rounded up to the kernel's token tile: 64 for sm90's v8 kernel of
// the quantized formats, 32 for its bf16 v7 kernel, not rounded on sm80), and at most
// one split per tile; on an H200 (132 SMs, two v8 CTAs per SM: 264 slots) the TP shape
// B = 1, H = 8 or 16, top-k 2048 gets one 64-token tile per split: 32 splits.
TEST_F(Cuda, SparseSplitPolicyLeavesNoSplitEmpty) {
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  for (KvFormat f : kSm90Formats) {
    for (int B : {1, 8, 64}) {
      for (int H : {8, 16, 128}) {
        for (int topk : {1, 63, 64, 100, 2000, 2048}) {
          MlaAttentionParams p;
          p.q = TensorView::contiguous(nullptr, DType::kF32, {B, 1, H, kQkDim}, Device::cuda(0));
          p.indices = TensorView::contiguous(nullptr, DType::kI32, {B, 1, topk}, Device::cuda(0));
          p.cache.format = f;
          p.cache.record_bytes = record_bytes(f);
          p.cache.block_size = 64;
          p.cache.num_blocks = 1;
          p.cache.device = Device::cuda(0);
          const int S = cuda::suggest_num_splits(p, prop.multiProcessorCount);
          const StatusOr<cuda::AttentionPath> sel = cuda::select_attention_path(p);
          ASSERT_TRUE(sel.ok()) << sel.status().to_string();
          const cuda::AttentionPath path = *sel;
          const int64_t g = path == cuda::AttentionPath::kSm90       ? (f == KvFormat::kBf16 ? 32 : 64)
                            : path == cuda::AttentionPath::kSm90Rows ? 64
                                                                      : 1;
          SCOPED_TRACE(fmt::format("{} B={} H={} topk={} path {}: {} splits", format_name(f), B, H, topk,
                                   cuda::attention_path_name(path), S));
          ASSERT_GE(S, 1);
          ASSERT_LE(S, 64);
          const int64_t chunk = ((topk + S - 1) / S + g - 1) / g * g;
          EXPECT_LT(static_cast<int64_t>(S - 1) * chunk, topk) << "the last split is empty";
          EXPECT_LE(S, (topk + g - 1) / g) << "more splits than tiles";
          if (path == cuda::AttentionPath::kSm90 && f == KvFormat::kFp8DsMla && B == 1 && H <= 16 && topk == 2048 &&
              std::string(prop.name).find("H200") != std::string::npos) {
            EXPECT_EQ(S, 32);
          }
        }
      }
    }
  }
}

// The many-row sm90 kernel's own edges (64 rows per CTA, two warpgroups of 32 rows over
// one ring of 32-token stages, consumer tiles of 64 tokens): sequences ending on either
// side of a stage and of a tile, the ring wrapping in long split chunks, exactly 64 rows
// (H = 64; H = 16 x s_q = 4, causal, so one CTA holds rows of four queries whose visible
// lengths differ inside a tile), 96 heads (the second CTA half empty), 128 heads
// sparse with s_q = 4, bf16 q, outer scales far from 1.
TEST_F(Cuda, HopperManyRowKernelTileEdges) {
  if (!is_hopper()) GTEST_SKIP() << "not an sm_90 device";
  KernelEnv env("sm90_rows");
  for (KvFormat f : kSm90RowsFormats) {
    for (int variant = 0; variant < 4; ++variant) {
      Case c;
      c.format = f;
      c.block_size = variant == 1 ? 16 : (variant == 3 ? 33 : 64);
      c.heads = variant == 0 ? 64 : (variant == 1 ? 16 : (variant == 2 ? 96 : 128));
      c.s_q = variant == 1 ? 4 : (variant == 3 ? 4 : 1);
      c.splits = variant == 0 ? 1 : (variant == 2 ? 2 : 3);
      c.sparse = variant == 3;
      c.topk = c.sparse ? 200 : 0;
      c.seqlens = variant == 3 ? std::vector<int>{300, 64}
                               : (variant == 2 ? std::vector<int>{31, 32, 63, 64, 65, 127, 129, 705}
                                               : std::vector<int>{33, 96, 1000, 0});
      c.bf16_q = variant == 1;
      c.outer_scale = format_info(f).has_outer_scale ? (variant == 1 ? 1e-3f : 37.0f) : 1.0f;
      c.seed = static_cast<uint32_t>(1500 + variant);
      check_case(c);
      if (HasFatalFailure()) return;
    }
  }
}

// The natural-arrangement kernel's own edges (bf16, 64 rows per CTA, 64-token tiles in a
// two-stage TMA ring released per part, two tiles per seesaw step): sequences ending on
// either side of a tile, odd tile counts (the step's second tile empty), long split chunks
// (the ring wrapping many times), exactly 64 rows (H = 64; H = 16 x s_q = 4, causal, so one CTA
// holds four queries whose visible lengths differ inside a tile), 96 heads (the second
// CTA half empty), block sizes 8 (four pages per tile) and 256 (eight tiles per page),
// bf16 q, more splits than tiles.
TEST_F(Cuda, HopperNaturalKernelTileEdges) {
  if (!is_hopper()) GTEST_SKIP() << "not an sm_90 device";
  KernelEnv env("sm90_nat");
  for (KvFormat f : kNatFormats) {
  for (int variant = 0; variant < 5; ++variant) {
    Case c;
    c.format = f;
    c.outer_scale = format_info(f).has_outer_scale ? 37.0f : 1.0f;
    c.block_size = variant == 1 ? 8 : (variant == 3 ? 256 : 64);
    c.heads = variant == 0 ? 64 : (variant == 1 ? 16 : (variant == 2 ? 96 : 128));
    c.s_q = variant == 1 ? 4 : (variant == 3 ? 2 : 1);
    c.splits = variant == 0 ? 1 : (variant == 2 ? 2 : (variant == 4 ? 40 : 3));
    c.seqlens = variant == 2 ? std::vector<int>{31, 32, 63, 64, 65, 127, 129, 705}
                             : (variant == 4 ? std::vector<int>{130, 3} : std::vector<int>{33, 96, 1000, 0});
    c.causal = variant != 3;
    c.bf16_q = variant == 1;
    c.seed = static_cast<uint32_t>(1600 + variant);
    SCOPED_TRACE(fmt::format("{} variant {}", format_name(f), variant));
    check_case(c);
    if (HasFatalFailure()) return;
  }
  }
}

// Scores that rise from tile to tile (record magnitudes x 1 + 1.5 * tile): every tile's
// maximum passes the lazy reference (2^8 above it), so both warpgroups rescale O at every
// step and warpgroup 0 recomputes P_a against warpgroup 1's maximum (paths random scores
// reach only at the first tile). Two row blocks (H = 128), two queries of 64 heads
// (causal), odd and even tile counts, 1 and 3 splits.
TEST_F(Cuda, HopperNaturalKernelFollowsRisingScores) {
  if (!is_hopper()) GTEST_SKIP() << "not an sm_90 device";
  KernelEnv env("sm90_nat");
  for (KvFormat f : kNatFormats) {
  for (int variant = 0; variant < 4; ++variant) {
    Case c;
    c.format = f;
    c.outer_scale = format_info(f).has_outer_scale ? 0.6f : 1.0f;
    c.ramp = 1.5f;
    c.block_size = variant == 2 ? 16 : 64;
    c.heads = variant % 2 == 0 ? 128 : 64;
    c.s_q = variant % 2 == 0 ? 1 : 2;
    c.splits = variant < 2 ? 1 : 3;
    c.seqlens = {700, 130, 320};
    c.bf16_q = variant == 3;
    c.seed = static_cast<uint32_t>(1800 + variant);
    SCOPED_TRACE(fmt::format("{} variant {}", format_name(f), variant));
    check_case(c);
    if (HasFatalFailure()) return;
  }
  }
}

// The same rising scores on the path the plan picks for every format (the 16-row sm90
// kernel at 16 heads, the many-row ones at 128), dense and sparse.
TEST_F(Cuda, RisingScoresOnEveryPath) {
  for (KvFormat f : kFormats) {
    for (int variant = 0; variant < 3; ++variant) {
      Case c;
      c.format = f;
      c.ramp = 1.5f;
      c.block_size = 64;
      c.heads = variant == 1 ? 128 : 16;
      c.s_q = variant == 1 ? 2 : 1;
      c.splits = 2;
      c.seqlens = {700, 130};
      c.sparse = variant == 2;
      c.topk = variant == 2 ? 300 : 0;
      c.outer_scale = format_info(f).has_outer_scale ? 0.6f : 1.0f;
      c.seed = static_cast<uint32_t>(1900 + 3 * static_cast<int>(f) + variant);
      SCOPED_TRACE(fmt::format("{} variant {}", format_name(f), variant));
      check_case(c);
      if (HasFatalFailure()) return;
    }
  }
}

// Dense block tables with invalid entries inside a request's length (an id of -1 and one
// past num_blocks): the kernel skips those pages (no box is loaded, the tokens are masked,
// the V rows of the stale stage bytes zeroed) and the reference drops their tokens. Whole
// tiles of invalid pages (block size 16: four pages per tile), single pages inside a tile,
// a page at a split boundary.
TEST_F(Cuda, HopperNaturalKernelSkipsInvalidPages) {
  if (!is_hopper()) GTEST_SKIP() << "not an sm_90 device";
  KernelEnv env("sm90_nat");
  for (KvFormat f : kNatFormats) {
  for (int bs : {16, 64}) {
    Case c;
    c.format = f;
    c.block_size = bs;
    c.heads = 64;
    c.s_q = 2;
    c.splits = 3;
    c.seqlens = {600, 250};
    c.seed = static_cast<uint32_t>(1700 + bs);
    Host t = build(c);
    // request 0: pages 1 and 4..7 (bs 16: one whole 64-token tile) invalid, 9 past num_blocks;
    // request 1: its second page.
    const std::vector<std::pair<int, int64_t>> holes = {{0, 1}, {0, 4}, {0, 5}, {0, 6}, {0, 7}, {0, 9}, {1, 1}};
    for (const auto& [b, page] : holes) {
      if (page * bs >= c.seqlens[static_cast<std::size_t>(b)]) continue;
      test::invalidate_page(t, b, page, page == 9 ? static_cast<int32_t>(t.view.num_blocks + 5) : -1);
    }
    SCOPED_TRACE(fmt::format("{} block size {}", format_name(f), bs));
    check_built(t);
    if (HasFatalFailure()) return;
  }
  }
}

// ---- cache writers: byte-identical to the CPU codecs ---------------------------------------
TEST_F(Cuda, WritersAreByteIdenticalToTheCpuCodecs) {
  const int n = 300;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> lat(static_cast<std::size_t>(n) * kLatentDim), rope(static_cast<std::size_t>(n) * kRopeDim);
  for (std::size_t i = 0; i < lat.size(); ++i) lat[i] = nd(rng) * (i % 97 == 0 ? 40.0f : 1.0f) * (i % 512 < 16 ? 1e-3f : 1.0f);
  for (float& x : rope) x = nd(rng);
  std::vector<uint16_t> lat16, rope16;
  for (float x : lat) lat16.push_back(f32_to_bf16(x));
  for (float x : rope) rope16.push_back(f32_to_bf16(x));
  const int64_t slots_cap = 512;
  std::vector<int64_t> slots(n);
  std::vector<int64_t> perm(slots_cap);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < n; ++i) slots[static_cast<std::size_t>(i)] = perm[static_cast<std::size_t>(i)];
  slots[5] = -1;        // padding: skipped
  slots[7] = slots_cap; // past capacity: skipped and counted
  // Tokens 11 and 12: an all-zero latent (token-scale mode: s_t = 0, zero codes) and a
  // small one (amax ~1e-3: the group scales the mode rescues).
  for (int d = 0; d < kLatentDim; ++d) {
    lat[static_cast<std::size_t>(11 * kLatentDim + d)] = 0.0f;
    lat[static_cast<std::size_t>(12 * kLatentDim + d)] *= 1e-3f;
  }
  lat16.clear();
  for (float x : lat) lat16.push_back(f32_to_bf16(x));
  // Inputs also with rows of 513 / 65 elements (row starts off the 16-byte grid): the
  // writers' element-by-element load path instead of their vector loads.
  const int64_t kOddL = kLatentDim + 1, kOddR = kRopeDim + 1;
  std::vector<float> lat_odd(static_cast<std::size_t>(n * kOddL), 0.0f), rope_odd(static_cast<std::size_t>(n * kOddR), 0.0f);
  std::vector<uint16_t> lat16_odd(lat_odd.size(), 0), rope16_odd(rope_odd.size(), 0);
  for (int i = 0; i < n; ++i) {
    for (int d = 0; d < kLatentDim; ++d) {
      lat_odd[static_cast<std::size_t>(i * kOddL + 1 + d)] = lat[static_cast<std::size_t>(i * kLatentDim + d)];
      lat16_odd[static_cast<std::size_t>(i * kOddL + 1 + d)] = lat16[static_cast<std::size_t>(i * kLatentDim + d)];
    }
    for (int d = 0; d < kRopeDim; ++d) {
      rope_odd[static_cast<std::size_t>(i * kOddR + 1 + d)] = rope[static_cast<std::size_t>(i * kRopeDim + d)];
      rope16_odd[static_cast<std::size_t>(i * kOddR + 1 + d)] = rope16[static_cast<std::size_t>(i * kRopeDim + d)];
    }
  }
  for (KvFormat f : kFormats) {
    for (int in = 0; in < 4; ++in) {  // f32 / bf16 input, contiguous / odd row strides
      const bool bf16_in = (in & 1) != 0, odd = (in & 2) != 0;
      for (int m = 0; m < 3; ++m) {  // 0 pow2 / static, 1 exact (fp8), 2 token-scale mode (nvfp4)
        const Fp8ScaleMode mode = m == 1 ? Fp8ScaleMode::kExact : Fp8ScaleMode::kPow2;
        const bool token_scale = m == 2;
        if (f != KvFormat::kFp8DsMla && m == 1) continue;
        if (!is_nvfp4_format(f) && token_scale) continue;
        if (odd && m != 0) continue;
        SCOPED_TRACE(std::string(format_name(f)) + (bf16_in ? " bf16 in" : " f32 in") + (odd ? " odd strides" : "") +
                     (m == 1 ? " exact" : "") + (token_scale ? " token-scale" : ""));
        std::printf("  writer: %s, %s input%s, %s, %d tokens\n", std::string(format_name(f)).c_str(),
                    bf16_in ? "bf16" : "f32", odd ? " (rows of 513/65)" : "", m == 1 ? "exact fp8 scales" : (token_scale ? "token-scale mode" : "pow2 fp8 scales / static"), n);
        const float outer = format_info(f).has_outer_scale && !token_scale ? 0.3f : 1.0f;
        const int rb = record_bytes(f);
        // CPU expectation, slot by slot, on a cache poisoned with 0xAB.
        std::vector<uint8_t> want(static_cast<std::size_t>(slots_cap) * rb, 0xAB);
        for (int i = 0; i < n; ++i) {
          const int64_t s = slots[static_cast<std::size_t>(i)];
          if (s < 0 || s >= slots_cap) continue;
          float l[kLatentDim], r[kRopeDim];
          for (int d = 0; d < kLatentDim; ++d) l[d] = bf16_in ? bf16_to_f32(lat16[static_cast<std::size_t>(i * kLatentDim + d)]) : lat[static_cast<std::size_t>(i * kLatentDim + d)];
          for (int d = 0; d < kRopeDim; ++d) r[d] = bf16_in ? bf16_to_f32(rope16[static_cast<std::size_t>(i * kRopeDim + d)]) : rope[static_cast<std::size_t>(i * kRopeDim + d)];
          codec::encode_record(f, l, r, outer, mode, want.data() + s * rb, token_scale);
        }
        DeviceBuffer<uint8_t> d_cache(want.size());
        CUDA_OK(cudaMemset(d_cache.ptr, 0xAB, want.size()));
        DeviceBuffer<int64_t> d_slots(slots.size());
        d_slots.upload(slots);
        DeviceBuffer<float> d_lat(odd ? lat_odd.size() : lat.size()), d_rope(odd ? rope_odd.size() : rope.size());
        DeviceBuffer<uint16_t> d_lat16(odd ? lat16_odd.size() : lat16.size()), d_rope16(odd ? rope16_odd.size() : rope16.size());
        d_lat.upload(odd ? lat_odd : lat);
        d_rope.upload(odd ? rope_odd : rope);
        d_lat16.upload(odd ? lat16_odd : lat16);
        d_rope16.upload(odd ? rope16_odd : rope16);
        DeviceBuffer<int> d_err(1);
        CUDA_OK(cudaMemset(d_err.ptr, 0, sizeof(int)));
        CacheLayerView v;
        v.data = d_cache.ptr;
        v.num_blocks = slots_cap / 16;
        v.block_size = 16;
        v.record_bytes = rb;
        v.format = f;
        v.outer_scale = outer;
        v.token_scale = token_scale;
        v.device = Device::cuda(0);
        const auto dt = bf16_in ? DType::kBF16 : DType::kF32;
        TensorView tl = TensorView::contiguous(bf16_in ? static_cast<void*>(d_lat16.ptr) : d_lat.ptr, dt, {n, kLatentDim}, Device::cuda(0));
        TensorView tr = TensorView::contiguous(bf16_in ? static_cast<void*>(d_rope16.ptr) : d_rope.ptr, dt, {n, kRopeDim}, Device::cuda(0));
        if (odd) {  // element 1 of each 513 / 65-element row
          tl.data = static_cast<char*>(tl.data) + dtype_size(dt);
          tl.strides[0] = kOddL;
          tr.data = static_cast<char*>(tr.data) + dtype_size(dt);
          tr.strides[0] = kOddR;
        }
        const Status st = cuda::write_cache(v, TensorView::contiguous(d_slots.ptr, DType::kI64, {n}, Device::cuda(0)), tl,
                                            tr, mode, nullptr, d_err.ptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        CUDA_OK(cudaDeviceSynchronize());
        const auto got = d_cache.download();
        EXPECT_EQ(d_err.download()[0], 1) << "one slot was past capacity";
        for (std::size_t k = 0; k < got.size(); ++k) {
          ASSERT_EQ(got[k], want[k]) << "byte " << k << " (slot " << k / static_cast<std::size_t>(rb) << ", offset "
                                     << k % static_cast<std::size_t>(rb) << ")";
        }
      }
    }
  }
}

// The writers with a latent transform (the mlakv recipe) write exactly the CPU's records:
// LatentTransformKernel::latent / rope (the spec), then the scalar codec.
TEST_F(Cuda, WritersApplyTheLatentTransformAsTheCpu) {
  const int n = 200;
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  std::vector<float> lat(static_cast<std::size_t>(n) * kLatentDim), rope(static_cast<std::size_t>(n) * kRopeDim);
  for (std::size_t i = 0; i < lat.size(); ++i) lat[i] = nd(rng) * (i % 512 < 32 ? 3.0f : 0.2f) + 0.05f;
  for (float& x : rope) x = nd(rng);
  std::vector<uint16_t> lat16, rope16;
  for (float x : lat) lat16.push_back(f32_to_bf16(x));
  for (float x : rope) rope16.push_back(f32_to_bf16(x));
  const int64_t cap = 256;
  std::vector<int64_t> slots(static_cast<std::size_t>(n));
  std::vector<int64_t> perm(static_cast<std::size_t>(cap));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < n; ++i) slots[static_cast<std::size_t>(i)] = perm[static_cast<std::size_t>(i)];
  for (int variant = 0; variant < 3; ++variant) {  // both rotations; latent only; centre + scale only
    LatentTransformLayer tl = LatentTransformLayer::identity();
    for (int d = 0; d < kLatentDim; ++d) {
      tl.mu[static_cast<std::size_t>(d)] = 0.05f + 0.01f * nd(rng);
      tl.d[static_cast<std::size_t>(d)] = std::exp(0.5f * nd(rng));
    }
    tl.rotate = variant < 2;
    tl.sign_seed = 1234;
    tl.rope_rotate = variant == 0;
    tl.rope_sign_seed = 99;
    tl.outer_scale = 0.7f;
    auto kernel = LatentTransformKernel::create(tl);
    ASSERT_TRUE(kernel.ok()) << kernel.status().to_string();
    auto dt = cuda::DeviceLatentTransform::upload(*kernel, 0);
    ASSERT_TRUE(dt.ok()) << dt.status().to_string();
    for (KvFormat f : kFormats) {
      for (bool bf16_in : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} input, variant {}", format_name(f), bf16_in ? "bf16" : "f32", variant));
        const float outer = format_info(f).has_outer_scale ? tl.outer_scale : 1.0f;
        const int rb = record_bytes(f);
        std::vector<uint8_t> want(static_cast<std::size_t>(cap) * rb, 0xAB);
        for (int i = 0; i < n; ++i) {
          float l[kLatentDim], r[kRopeDim], lt[kLatentDim], rt[kRopeDim];
          for (int d = 0; d < kLatentDim; ++d) {
            const std::size_t k = static_cast<std::size_t>(i * kLatentDim + d);
            l[d] = bf16_in ? bf16_to_f32(lat16[k]) : lat[k];
          }
          for (int d = 0; d < kRopeDim; ++d) {
            const std::size_t k = static_cast<std::size_t>(i * kRopeDim + d);
            r[d] = bf16_in ? bf16_to_f32(rope16[k]) : rope[k];
          }
          kernel->latent(l, lt);
          kernel->rope(r, rt);
          codec::encode_record(f, lt, rt, outer, Fp8ScaleMode::kPow2, want.data() + slots[static_cast<std::size_t>(i)] * rb,
                               false);
        }
        DeviceBuffer<uint8_t> d_cache(want.size());
        CUDA_OK(cudaMemset(d_cache.ptr, 0xAB, want.size()));
        DeviceBuffer<int64_t> d_slots(slots.size());
        d_slots.upload(slots);
        DeviceBuffer<float> d_lat(lat.size()), d_rope(rope.size());
        DeviceBuffer<uint16_t> d_lat16(lat16.size()), d_rope16(rope16.size());
        d_lat.upload(lat);
        d_rope.upload(rope);
        d_lat16.upload(lat16);
        d_rope16.upload(rope16);
        CacheLayerView v;
        v.data = d_cache.ptr;
        v.num_blocks = cap / 16;
        v.block_size = 16;
        v.record_bytes = rb;
        v.format = f;
        v.outer_scale = outer;
        v.device = Device::cuda(0);
        const auto ty = bf16_in ? DType::kBF16 : DType::kF32;
        const Status st = cuda::write_cache(
            v, TensorView::contiguous(d_slots.ptr, DType::kI64, {n}, Device::cuda(0)),
            TensorView::contiguous(bf16_in ? static_cast<void*>(d_lat16.ptr) : d_lat.ptr, ty, {n, kLatentDim}, Device::cuda(0)),
            TensorView::contiguous(bf16_in ? static_cast<void*>(d_rope16.ptr) : d_rope.ptr, ty, {n, kRopeDim}, Device::cuda(0)),
            Fp8ScaleMode::kPow2, *dt, nullptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        CUDA_OK(cudaDeviceSynchronize());
        const auto got = d_cache.download();
        for (std::size_t k = 0; k < got.size(); ++k) {
          ASSERT_EQ(got[k], want[k]) << "byte " << k << " (slot " << k / static_cast<std::size_t>(rb) << ", offset "
                                     << k % static_cast<std::size_t>(rb) << ")";
        }
        if (format_info(f).has_outer_scale) {  // an outer scale other than the transform's s_l is refused
          CacheLayerView w = v;
          w.outer_scale = 1.0f;
          const Status bad = cuda::write_cache(
              w, TensorView::contiguous(d_slots.ptr, DType::kI64, {n}, Device::cuda(0)),
              TensorView::contiguous(d_lat.ptr, DType::kF32, {n, kLatentDim}, Device::cuda(0)),
              TensorView::contiguous(d_rope.ptr, DType::kF32, {n, kRopeDim}, Device::cuda(0)), Fp8ScaleMode::kPow2,
              *dt, nullptr);
          EXPECT_NE(bad.message().find("transform's s_l"), std::string::npos) << bad.to_string();
        }
      }
    }
  }
}

// The writers' fast element primitives (format/record_codec.h) on the device against the
// scalar codec on the device: every float32 through the hardware e4m3 / bf16 conversions,
// the e2m1 rounding and the nvfp4 group-scale code; every e4m3 code through the decode; the division through the reciprocal for every e4m3 group scale
// over two whole binades of dividends and for 512 random divisors over a binade each.
// NaN inputs are reported, not required (not specified on the device).
TEST_F(Cuda, WriterPrimitivesEqualTheScalarCodec) {
  unsigned long long counts[test::kNumPrimitiveChecks], first[test::kNumPrimitiveChecks];
  ASSERT_EQ(test::check_writer_primitives(counts, first), 0);
  const char* names[] = {"e4m3x2", "e4m3x2 (NaN in)", "bf16x2", "bf16x2 (NaN in)", "e2m1", "division by group scales",
                         "division by s", "nvfp4 group-scale code", "e4m3 decode", "e2m1 below 7 (fast path)"};
  for (int k = 0; k < test::kNumPrimitiveChecks; ++k) {
    std::printf("  %-26s %llu mismatches%s\n", names[k], counts[k],
                counts[k] ? fmt::format(" (first: input 0x{:08x}, got 0x{:x})", first[k] >> 32, first[k] & 0xFFFFFFFFu).c_str() : "");
    if (k != test::kE4m3NaN && k != test::kBf16NaN) {
      EXPECT_EQ(counts[k], 0u) << names[k];
    }
  }
}

// The writers on inputs built to hit every rounding edge: latent values on e2m1 / e4m3 ties
// and their neighbours after the divisions, group and tile maxima at e4m3's subnormal,
// normal and saturation edges, signed zeros, tiny and huge groups, zero tokens, outer scales
// on every division path (powers of two, the reciprocal path, the IEEE fallback: 1e-20,
// 1e35), both fp8 scale modes, the token-scale mode, and more tokens than the GPU holds
// warps (each warp encodes several), with padding and a slot past the layer.
TEST_F(Cuda, WritersAreByteIdenticalOnAdversarialInputs) {
  const int n = 9001;
  const int64_t cap = 9216;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> pick(0, 9), nb(-2, 2);
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.5f, 0.0625f};
  std::vector<int64_t> perm(static_cast<std::size_t>(cap));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(perm.begin(), perm.begin() + n);
  slots[17] = -1;
  slots[4000] = cap;
  std::vector<float> rope(static_cast<std::size_t>(n) * kRopeDim);
  for (std::size_t i = 0; i < rope.size(); ++i) {
    const int kind = static_cast<int>(i / kRopeDim) % 5;
    rope[i] = kind == 0 ? 0.0f : (kind == 1 ? nd(rng) * 1e-30f : (kind == 2 ? nd(rng) * 1e30f : nd(rng)));
    if (kind == 4 && i % 7 == 0) rope[i] = -0.0f;
  }
  for (KvFormat f : kFormats) {
    // Powers of two inside (0.125) and outside (2^-70, 2^70) the nvfp4 fast path's
    // [2^-64, 2^64], the reciprocal path (0.3, 7.44e-6), the IEEE fallback (1e-20, 1e35).
    for (float outer : {1.0f, 0.125f, 0x1p-70f, 0x1p70f, 0.3f, 7.44e-6f, 1e-20f, 1e35f}) {
      for (int m = 0; m < 3; ++m) {  // 0 pow2 fp8 / static, 1 exact fp8, 2 token-scale
        const bool token_scale = m == 2;
        if ((m == 1 && f != KvFormat::kFp8DsMla) || (token_scale && !is_nvfp4_format(f))) continue;
        if (!format_info(f).has_outer_scale && outer != 1.0f) continue;
        const Fp8ScaleMode mode = m == 1 ? Fp8ScaleMode::kExact : Fp8ScaleMode::kPow2;
        const float s_l = format_info(f).has_outer_scale && !token_scale ? outer : 1.0f;
        // The latent, with the values placed for this outer scale's divisions.
        std::vector<float> lat(static_cast<std::size_t>(n) * kLatentDim);
        for (int t = 0; t < n; ++t) {
          for (int g = 0; g < 32; ++g) {
            float* x = lat.data() + (static_cast<std::size_t>(t) * 32 + g) * 16;
            const int kind = (t + g) % 9;
            const float sf = e4m3_to_f32(static_cast<uint8_t>(1 + (t * 7 + g * 37) % kE4m3MaxCode));
            const float unit = (m == 1 || f == KvFormat::kFp8DsMla) ? std::ldexp(1.0f, (t % 40) - 20) : sf * outer;
            for (int i = 0; i < 16; ++i) {
              float v;
              if (t % 97 == 3 || kind == 0) {
                v = 0.0f;
              } else if (kind == 1) {
                v = i % 2 ? -0.0f : 1e-38f * static_cast<float>(i);
              } else if (kind == 2) {
                v = nd(rng) * 1e30f;
              } else {
                v = (i == 0 ? 6.0f : ties[pick(rng)]) * unit;
                v = std::bit_cast<float>(std::bit_cast<uint32_t>(v) + static_cast<uint32_t>(nb(rng)));
                if (kind >= 7) v = nd(rng) * unit * 2.0f;
              }
              x[i] = i % 3 == 1 ? -v : v;
            }
          }
        }
        SCOPED_TRACE(fmt::format("{} outer {} mode {}", format_name(f), outer, m));
        const int rb = record_bytes(f);
        std::vector<uint8_t> want(static_cast<std::size_t>(cap) * rb, 0xAB);
        for (int i = 0; i < n; ++i) {
          const int64_t s = slots[static_cast<std::size_t>(i)];
          if (s < 0 || s >= cap) continue;
          codec::encode_record(f, lat.data() + static_cast<std::size_t>(i) * kLatentDim,
                               rope.data() + static_cast<std::size_t>(i) * kRopeDim, s_l, mode, want.data() + s * rb,
                               token_scale);
        }
        DeviceBuffer<uint8_t> d_cache(want.size());
        CUDA_OK(cudaMemset(d_cache.ptr, 0xAB, want.size()));
        DeviceBuffer<int64_t> d_slots(slots.size());
        d_slots.upload(slots);
        DeviceBuffer<float> d_lat(lat.size()), d_rope(rope.size());
        d_lat.upload(lat);
        d_rope.upload(rope);
        DeviceBuffer<int> d_err(1);
        CUDA_OK(cudaMemset(d_err.ptr, 0, sizeof(int)));
        CacheLayerView v;
        v.data = d_cache.ptr;
        v.num_blocks = cap / 16;
        v.block_size = 16;
        v.record_bytes = rb;
        v.format = f;
        v.outer_scale = s_l;
        v.token_scale = token_scale;
        v.device = Device::cuda(0);
        const Status st = cuda::write_cache(v, TensorView::contiguous(d_slots.ptr, DType::kI64, {n}, Device::cuda(0)),
                                            TensorView::contiguous(d_lat.ptr, DType::kF32, {n, kLatentDim}, Device::cuda(0)),
                                            TensorView::contiguous(d_rope.ptr, DType::kF32, {n, kRopeDim}, Device::cuda(0)),
                                            mode, nullptr, d_err.ptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(d_err.download()[0], 1);
        const auto got = d_cache.download();
        for (std::size_t k = 0; k < got.size(); ++k) {
          ASSERT_EQ(got[k], want[k]) << "byte " << k << " (slot " << k / static_cast<std::size_t>(rb) << ", offset "
                                     << k % static_cast<std::size_t>(rb) << ")";
        }
      }
    }
  }
}

// The nvfp4 scale search (Nvfp4ScaleMode::kSearch) on the device: the records equal the
// scalar codec's (codec::nvfp4_search_scale_code, with its float32 error and ties) for every
// nvfp4 format, f32 and bf16 inputs, outer scales on every division path (powers of two in and
// out of [2^-64, 2^64], the reciprocal path, the IEEE fallback), inputs on e2m1 midpoints of
// each candidate scale (RN - 1, RN, RN + 1) and their neighbours, e4m3 subnormal and saturating
// group maxima, zeros, tiny and huge groups, more tokens than warps, padding, a slot past the
// layer; with the latent transform too. The per-token scale mode with the search is refused.
// The scale-search writer tests' inputs: n of cap slots in a shuffled order, slot `skipped`
// -1 and slot `past` = cap (both left alone by the writer); a latent transform with a small
// mean, per-dim gains around 1 and the seeded rotation.
std::vector<int64_t> search_writer_slots(int64_t cap, int n, int skipped, int past, std::mt19937& rng) {
  std::vector<int64_t> perm(static_cast<std::size_t>(cap));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(perm.begin(), perm.begin() + n);
  slots[static_cast<std::size_t>(skipped)] = -1;
  slots[static_cast<std::size_t>(past)] = cap;
  return slots;
}
LatentTransformLayer search_writer_transform(std::mt19937& rng, std::normal_distribution<float>& nd, uint64_t sign_seed) {
  LatentTransformLayer tl = LatentTransformLayer::identity();
  for (int d = 0; d < kLatentDim; ++d) {
    tl.mu[static_cast<std::size_t>(d)] = 0.01f * nd(rng);
    tl.d[static_cast<std::size_t>(d)] = std::exp(0.3f * nd(rng));
  }
  tl.rotate = true;
  tl.sign_seed = sign_seed;
  return tl;
}

// The CUDA writer in the nvfp4 scale search mode over `slots` (lat / rope float32, or bf16
// when bf16_in; the latent transform `kernel` fused when tf) against the CPU codec's bytes
// `want` (unwritten slots 0xAB), every byte; with `refusal` also that the search refuses the
// per-token scale mode and launches nothing.
void expect_search_writer_bytes(KvFormat f, int cap, float outer, bool bf16_in, bool tf, const LatentTransformKernel& kernel,
                                const std::vector<int64_t>& slots, const std::vector<float>& lat,
                                const std::vector<float>& rp, const std::vector<uint8_t>& want, bool refusal) {
  const int rb = record_bytes(f);
  const int64_t n = static_cast<int64_t>(slots.size());
  DeviceBuffer<uint8_t> d_cache(want.size());
  CUDA_OK(cudaMemset(d_cache.ptr, 0xAB, want.size()));
  DeviceBuffer<int64_t> d_slots(slots.size());
  d_slots.upload(slots);
  std::vector<uint16_t> lat16, rope16;
  for (float x : lat) lat16.push_back(f32_to_bf16(x));
  for (float x : rp) rope16.push_back(f32_to_bf16(x));
  DeviceBuffer<float> d_lat(lat.size()), d_rope(rp.size());
  DeviceBuffer<uint16_t> d_lat16(lat16.size()), d_rope16(rope16.size());
  d_lat.upload(lat);
  d_rope.upload(rp);
  d_lat16.upload(lat16);
  d_rope16.upload(rope16);
  DeviceBuffer<int> d_err(1);
  CUDA_OK(cudaMemset(d_err.ptr, 0, sizeof(int)));
  CacheLayerView v;
  v.data = d_cache.ptr;
  v.num_blocks = cap / 16;
  v.block_size = 16;
  v.record_bytes = rb;
  v.format = f;
  v.outer_scale = outer;
  v.nvfp4_scales = Nvfp4ScaleMode::kSearch;
  v.device = Device::cuda(0);
  const auto dt = bf16_in ? DType::kBF16 : DType::kF32;
  const TensorView ts = TensorView::contiguous(d_slots.ptr, DType::kI64, {n}, Device::cuda(0));
  const TensorView tlv = TensorView::contiguous(bf16_in ? static_cast<void*>(d_lat16.ptr) : d_lat.ptr, dt,
                                                {n, kLatentDim}, Device::cuda(0));
  const TensorView trv = TensorView::contiguous(bf16_in ? static_cast<void*>(d_rope16.ptr) : d_rope.ptr, dt,
                                                {n, kRopeDim}, Device::cuda(0));
  Status st = Status::Ok();
  if (tf) {
    auto dtf = cuda::DeviceLatentTransform::upload(kernel, 0);
    ASSERT_TRUE(dtf.ok()) << dtf.status().to_string();
    st = cuda::write_cache(v, ts, tlv, trv, Fp8ScaleMode::kPow2, *dtf, nullptr, d_err.ptr);
    CUDA_OK(cudaDeviceSynchronize());
  } else {
    st = cuda::write_cache(v, ts, tlv, trv, Fp8ScaleMode::kPow2, nullptr, d_err.ptr);
  }
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d_err.download()[0], 1);
  const auto got = d_cache.download();
  for (std::size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k], want[k]) << "byte " << k << " (slot " << k / static_cast<std::size_t>(rb) << ", offset "
                               << k % static_cast<std::size_t>(rb) << ")";
  }
  if (refusal) {  // the search with the per-token scale mode: refused, nothing launched
    CacheLayerView w = v;
    w.token_scale = true;
    const Status bad = cuda::write_cache(w, ts, tlv, trv, Fp8ScaleMode::kPow2, nullptr, d_err.ptr);
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(bad.message().find("per-token scale mode"), std::string::npos) << bad.to_string();
  }
}

TEST_F(Cuda, WritersScaleSearchIsByteIdenticalToTheCpu) {
  const int n = 3001;
  const int64_t cap = 3072;
  std::mt19937 rng(53);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> pick(0, 9), nb(-2, 2), cand(-1, 1);
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.5f, 0.0625f};
  const std::vector<int64_t> slots = search_writer_slots(cap, n, 9, 2000, rng);
  std::vector<float> rope(static_cast<std::size_t>(n) * kRopeDim);
  for (float& x : rope) x = nd(rng);
  LatentTransformLayer tl = search_writer_transform(rng, nd, 77);
  tl.rope_rotate = true;
  tl.rope_sign_seed = 78;
  for (KvFormat f : {KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope}) {
    for (float outer : {1.0f, 0.125f, 0x1p-70f, 0x1p70f, 0.3f, 7.44e-6f, 1e-20f, 1e35f}) {
      for (int in = 0; in < 3; ++in) {  // 0 f32, 1 bf16, 2 f32 with the latent transform
        const bool bf16_in = in == 1, tf = in == 2;
        if (tf && outer != 1.0f && outer != 0.3f) continue;
        std::vector<float> lat(static_cast<std::size_t>(n) * kLatentDim);
        for (int t = 0; t < n; ++t) {
          for (int g = 0; g < 32; ++g) {
            float* x = lat.data() + (static_cast<std::size_t>(t) * 32 + g) * 16;
            const int kind = (t + g) % 10;
            // The unit: an e4m3 scale next to the group's RN code (so the values sit on the e2m1
            // midpoints of one of the three candidates), times s_l.
            const int code = 2 + (t * 7 + g * 37) % (kE4m3MaxCode - 3) + cand(rng);
            const float unit = e4m3_to_f32(static_cast<uint8_t>(code)) * outer;
            for (int i = 0; i < 16; ++i) {
              float v;
              if (t % 89 == 3 || kind == 0) {
                v = 0.0f;
              } else if (kind == 1) {
                v = i % 2 ? -0.0f : 1e-38f * static_cast<float>(i);
              } else if (kind == 2) {
                v = nd(rng) * 1e30f;
              } else if (kind == 3) {  // a group maximum past e4m3's largest scale (saturated code)
                v = (i == 0 ? 3000.0f : nd(rng) * 500.0f) * outer;
              } else if (kind == 4) {  // an RN code of 0 (amax / 6 below 2^-10) or 1
                v = (i == 0 ? 0.004f + 0.003f * static_cast<float>(t % 3) : 0.001f * nd(rng)) * outer;
              } else {
                v = (i == 0 ? 6.0f : ties[pick(rng)]) * unit;
                v = std::bit_cast<float>(std::bit_cast<uint32_t>(v) + static_cast<uint32_t>(nb(rng)));
                if (kind >= 8) v = nd(rng) * unit * 2.0f;
              }
              if (!std::isfinite(v)) v = 1.0f;  // (unit 384 * 1e35 times a large normal draw)
              x[i] = i % 3 == 1 ? -v : v;
            }
          }
        }
        if (bf16_in) {
          for (float& x : lat) x = bf16_to_f32(f32_to_bf16(x));
        }
        std::vector<float> rp = rope;
        if (bf16_in) {
          for (float& x : rp) x = bf16_to_f32(f32_to_bf16(x));
        }
        const float s_l = outer;
        LatentTransformLayer tli = tl;
        tli.outer_scale = s_l;
        auto kernel = LatentTransformKernel::create(tli);
        ASSERT_TRUE(kernel.ok()) << kernel.status().to_string();
        if (tf) {  // keep |(c - mu) d| inside the transform's range: drop the huge groups
          for (float& x : lat) {
            if (!(std::abs(x) < 1e20f)) x = 1.0f;
          }
        }
        SCOPED_TRACE(fmt::format("{} outer {} input {}", format_name(f), outer, in));
        const int rb = record_bytes(f);
        std::vector<uint8_t> want(static_cast<std::size_t>(cap) * rb, 0xAB);
        for (int i = 0; i < n; ++i) {
          const int64_t s = slots[static_cast<std::size_t>(i)];
          if (s < 0 || s >= cap) continue;
          const float* l = lat.data() + static_cast<std::size_t>(i) * kLatentDim;
          const float* r = rp.data() + static_cast<std::size_t>(i) * kRopeDim;
          float lt[kLatentDim], rt[kRopeDim];
          if (tf) {
            kernel->latent(l, lt);
            kernel->rope(r, rt);
            l = lt;
            r = rt;
          }
          codec::encode_record(f, l, r, s_l, Fp8ScaleMode::kPow2, want.data() + s * rb, false, Nvfp4ScaleMode::kSearch);
        }
        expect_search_writer_bytes(f, cap, s_l, bf16_in, tf, *kernel, slots, lat, rp, want,
                                   /*refusal=*/in == 0 && outer == 1.0f);
      }
    }
  }
}

// The scale search's screened fast path on the device (codec::nvfp4_search_group, taken by a
// warp where every group's RN code is in [9, 0x7E] and its max |y| at most 2856): tokens whose
// every group qualifies - Gaussian groups over three decades, groups of values on the three
// candidates' e2m1 midpoints and values (and 2 ulps either side), and near ties (one element
// moved along the floats to where two candidates' float32 errors cross, exact ties among
// them: the groups the screen leaves to the spec) - plus one token in 16 with a group that
// does not (the whole warp on the spec's path); outer scales folded into the screen (1, 0.125),
// a power of two outside the fold (2^-20) and past the fast path's (2^70: the reciprocal
// path), the reciprocal path (0.3, 7.44e-6) and none (1e-20); f32 input, bf16 and the latent
// transform at 1 and 0.3. The records equal the CPU codec's byte for byte.
TEST_F(Cuda, WritersScreenedScaleSearchIsByteIdenticalToTheCpu) {
  const int n = 2001;
  const int64_t cap = 2048;
  std::mt19937 rng(97);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> code(static_cast<int>(codec::kNvfp4SearchMinCode), 0x7E), nb(-2, 2), pick(0, 12),
      cand(-1, 1);
  const float points[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 2.25f, 4.5f, 1.0f, 3.0f};
  const std::vector<int64_t> slots = search_writer_slots(cap, n, 5, 1000, rng);
  std::vector<float> rope(static_cast<std::size_t>(n) * kRopeDim);
  for (float& x : rope) x = nd(rng);
  LatentTransformLayer tl = search_writer_transform(rng, nd, 91);
  // The spec's group error at code c for x / s (IEEE quotients, as the codec takes them).
  auto sq_error = [](const float* x, float s, uint32_t c) {
    float a[16];
    for (int i = 0; i < 16; ++i) a[i] = std::abs(x[i] / s);
    uint32_t m[2];
    return codec::nvfp4_group_sq_error(a, c, m);
  };
  auto rn_code = [](const float* x, float s, float* amax_y) {
    float a = 0.0f;
    for (int i = 0; i < 16; ++i) a = std::max(a, std::abs(x[i] / s));
    *amax_y = a;
    return static_cast<uint32_t>(codec::nvfp4_group_scale_code(a));
  };
  auto eligible = [&](const float* x, float s) {
    float amax_y;
    const uint32_t c0 = rn_code(x, s, &amax_y);
    return codec::nvfp4_search_fast_applies(c0, amax_y);
  };
  for (float outer : {1.0f, 0.125f, 0x1p-20f, 0x1p70f, 0.3f, 7.44e-6f, 1e-20f}) {
    std::vector<float> lat(static_cast<std::size_t>(n) * kLatentDim);
    int64_t near_ties = 0;
    for (int t = 0; t < n; ++t) {
      for (int g = 0; g < 32; ++g) {
        float* x = lat.data() + (static_cast<std::size_t>(t) * 32 + g) * 16;
        const int kind = (t * 32 + g) % 3;
        if (kind == 0 || kind == 2) {  // Gaussian (kind 2: then a near tie); rescaled until it qualifies
          const float sc = std::pow(10.0f, std::uniform_real_distribution<float>(-0.8f, 2.2f)(rng));
          for (int i = 0; i < 16; ++i) x[i] = nd(rng) * sc * outer;
          for (int k = 0; k < 8 && !eligible(x, outer); ++k) {
            float amax_y;
            rn_code(x, outer, &amax_y);
            for (int i = 0; i < 16; ++i) x[i] *= amax_y > 100.0f ? 0.25f : 4.0f;
          }
        } else {  // values on the candidates' midpoints and values, the maximum near 6 sf_c0
          const int c = code(rng);
          for (int i = 0; i < 16; ++i) {
            const int cc = std::min(c + cand(rng), 0x7E);
            float v = points[pick(rng)] * e4m3_to_f32(static_cast<uint8_t>(cc));
            if (i == 0) v = 6.0f * e4m3_to_f32(static_cast<uint8_t>(c)) * (0.94f + 0.12f * static_cast<float>((t + g) % 100) / 100.0f);
            v = std::bit_cast<float>(std::bit_cast<uint32_t>(v) + static_cast<uint32_t>(nb(rng)));
            x[i] = ((i % 3 == 1) ? -v : v) * outer;
          }
        }
        if (kind == 2 && eligible(x, outer)) {  // a near tie: element j swept to where two errors cross
          float amax_y;
          const uint32_t c0 = rn_code(x, outer, &amax_y);
          int im = 0;
          for (int i = 1; i < 16; ++i) {
            if (std::abs(x[i]) > std::abs(x[im])) im = i;
          }
          const int j = (im + 1 + (t + g) % 15) % 16;
          const int pair = (t + g) % 3;
          const uint32_t ca = pair == 0 ? c0 - 1 : c0 + 1, cb = pair == 2 ? c0 - 1 : c0;
          const float xmax = std::abs(x[im]), keep = x[j];
          auto diff = [&](float v) {
            x[j] = v;
            const float d = sq_error(x, outer, ca) - sq_error(x, outer, cb);
            x[j] = keep;
            return d;
          };
          if (ca <= 0x7E) {
            float lo = -1.0f, hi = -1.0f, prev = diff(0.0f);
            for (int k = 1; k <= 48; ++k) {
              const float v = xmax * 0.999f * static_cast<float>(k) / 48.0f, d = diff(v);
              if ((d < 0.0f) != (prev < 0.0f)) {
                lo = xmax * 0.999f * static_cast<float>(k - 1) / 48.0f;
                hi = v;
                break;
              }
              prev = d;
            }
            if (lo >= 0.0f) {
              uint32_t blo = std::bit_cast<uint32_t>(lo), bhi = std::bit_cast<uint32_t>(hi);
              const bool neg_lo = diff(lo) < 0.0f;
              while (bhi - blo > 1) {
                const uint32_t mid = blo + (bhi - blo) / 2;
                if ((diff(std::bit_cast<float>(mid)) < 0.0f) == neg_lo) blo = mid; else bhi = mid;
              }
              x[j] = std::bit_cast<float>(blo + static_cast<uint32_t>(nb(rng)) + 1u);  // within 3 floats of the crossing
              ++near_ties;
            }
          }
        }
        if (t % 16 == 7 && g == 5) {  // one group past the fast path: RN code below 9
          for (int i = 0; i < 16; ++i) x[i] = 0.01f * nd(rng) * outer;
        }
      }
    }
    for (int in = 0; in < 3; ++in) {  // 0 f32, 1 bf16, 2 f32 with the latent transform
      const bool bf16_in = in == 1, tf = in == 2;
      if (in != 0 && outer != 1.0f && outer != 0.3f) continue;
      std::vector<float> li = lat;
      if (bf16_in) {
        for (float& x : li) x = bf16_to_f32(f32_to_bf16(x));
      }
      std::vector<float> rp = rope;
      if (bf16_in) {
        for (float& x : rp) x = bf16_to_f32(f32_to_bf16(x));
      }
      LatentTransformLayer tli = tl;
      tli.outer_scale = outer;
      auto kernel = LatentTransformKernel::create(tli);
      ASSERT_TRUE(kernel.ok()) << kernel.status().to_string();
      // What the device's paths see, from the host's copy of the screen: warps on the fast
      // path and the groups it leaves to the spec there.
      int64_t fast_tokens = 0, undecided = 0;
      for (KvFormat f : {KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope, KvFormat::kNvfp4DsMlaInt8Rope}) {
        SCOPED_TRACE(fmt::format("{} outer {} input {}", format_name(f), outer, in));
        const int rb = record_bytes(f);
        std::vector<uint8_t> want(static_cast<std::size_t>(cap) * rb, 0xAB);
        for (int i = 0; i < n; ++i) {
          const float* l = li.data() + static_cast<std::size_t>(i) * kLatentDim;
          const float* r = rp.data() + static_cast<std::size_t>(i) * kRopeDim;
          float lt[kLatentDim], rt[kRopeDim];
          if (tf) {
            kernel->latent(l, lt);
            kernel->rope(r, rt);
            l = lt;
            r = rt;
          }
          if (f == KvFormat::kNvfp4DsMla && codec::nvfp4_fast_mode(outer) != codec::Nvfp4Fast::kNone) {
            bool all = true;
            for (int g = 0; g < 32; ++g) all = all && eligible(l + 16 * g, outer);
            if (all) {
              ++fast_tokens;
              for (int g = 0; g < 32; ++g) {
                float a[16], amax_y, sf[3], rsf[3];
                for (int k = 0; k < 16; ++k) a[k] = std::abs(l[16 * g + k] / outer);
                const uint32_t c0 = rn_code(l + 16 * g, outer, &amax_y);
                for (int k = 0; k < 3; ++k) {
                  const uint32_t c = c0 - 1 + static_cast<uint32_t>(k);
                  sf[k] = c <= 0x7E ? e4m3_to_f32(static_cast<uint8_t>(c)) : 0.0f;
                  rsf[k] = sf[k] != 0.0f ? codec::reciprocal_rn(sf[k]) : 0.0f;
                }
                uint32_t signs[2] = {0, 0}, w[2];
                if (codec::nvfp4_search_group(a, c0, sf, rsf, signs, w) < 0) ++undecided;
              }
            }
          }
          const int64_t s = slots[static_cast<std::size_t>(i)];
          if (s < 0 || s >= cap) continue;
          codec::encode_record(f, l, r, outer, Fp8ScaleMode::kPow2, want.data() + s * rb, false, Nvfp4ScaleMode::kSearch);
        }
        expect_search_writer_bytes(f, cap, outer, bf16_in, tf, *kernel, slots, li, rp, want, /*refusal=*/false);
      }
      std::printf("  outer %g input %d: %lld near ties built, %lld of %d tokens on the fast path, %lld groups there left "
                  "to the spec\n",
                  static_cast<double>(outer), in, static_cast<long long>(near_ties), static_cast<long long>(fast_tokens), n,
                  static_cast<long long>(undecided));
      if (in == 0 && codec::nvfp4_fast_mode(outer) != codec::Nvfp4Fast::kNone) {
        EXPECT_GT(fast_tokens, n / 2);  // the fast path is what runs
        EXPECT_GT(undecided, 20);       // and its fallback too
      }
    }
  }
}

// The writer's nvfp4 subnormal-scale tally equals the CPU's check (nvfp4_scale_check, what
// KvCache::write warns from) over the tokens written: groups of every size around the
// subnormal edge amax_g = 6 * 2^-6 * s_l (and exactly on it), zero groups, several outer
// scales; the warning text then is the CPU's. Other formats and token-scale mode leave it.
TEST_F(Cuda, WriterTalliesTheNvfp4SubnormalScalesAsTheCpu) {
  const int n = 5000;
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  std::vector<int64_t> slots(static_cast<std::size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  slots[3] = -1;  // not written: not counted
  for (float outer : {1.0f, 0.3f, 7.44e-6f}) {
    std::vector<float> lat(static_cast<std::size_t>(n) * kLatentDim), rope(static_cast<std::size_t>(n) * kRopeDim, 0.5f);
    for (int t = 0; t < n; ++t) {
      for (int g = 0; g < 32; ++g) {
        const float edge = 0.09375f * outer;  // amax / (6 s_l) = 2^-6
        const int kind = (t + g) % 5;
        const float scale = kind == 0 ? 0.0f : (kind == 1 ? edge : edge * std::exp(2.0f * nd(rng)));
        for (int i = 0; i < 16; ++i) {
          float v = kind == 1 ? (i == 5 ? edge : 0.5f * edge) : scale * nd(rng) * 0.3f;
          if (kind == 1 && t % 2 == 1 && i == 5) v = std::nextafter(edge, 0.0f);
          lat[(static_cast<std::size_t>(t) * 32 + g) * 16 + i] = v;
        }
      }
    }
    // The CPU check over the written rows.
    std::vector<float> written;
    for (int t = 0; t < n; ++t) {
      if (slots[static_cast<std::size_t>(t)] < 0) continue;
      written.insert(written.end(), lat.begin() + static_cast<std::ptrdiff_t>(t) * kLatentDim,
                     lat.begin() + static_cast<std::ptrdiff_t>(t + 1) * kLatentDim);
    }
    const int64_t nw = static_cast<int64_t>(written.size()) / kLatentDim;
    auto want = nvfp4_scale_check(TensorView::contiguous(written.data(), DType::kF32, {nw, kLatentDim}), outer);
    ASSERT_TRUE(want.ok());
    DeviceBuffer<int64_t> d_slots(slots.size());
    d_slots.upload(slots);
    DeviceBuffer<float> d_lat(lat.size()), d_rope(rope.size());
    d_lat.upload(lat);
    d_rope.upload(rope);
    for (KvFormat f : kFormats) {
      for (bool token_scale : {false, true}) {
        if (token_scale && !is_nvfp4_format(f)) continue;
        SCOPED_TRACE(fmt::format("{} outer {}{}", format_name(f), outer, token_scale ? " token-scale" : ""));
        const int rb = record_bytes(f);
        DeviceBuffer<uint8_t> d_cache(static_cast<std::size_t>(n) * rb);
        DeviceBuffer<cuda::Nvfp4ScaleTally> d_tally(1);
        CUDA_OK(cudaMemset(d_tally.ptr, 0, sizeof(cuda::Nvfp4ScaleTally)));
        CacheLayerView v;
        v.data = d_cache.ptr;
        v.num_blocks = (n + 15) / 16;
        v.block_size = 16;
        v.record_bytes = rb;
        v.format = f;
        v.outer_scale = format_info(f).has_outer_scale && !token_scale ? outer : 1.0f;
        v.token_scale = token_scale;
        v.device = Device::cuda(0);
        const Status st = cuda::write_cache(v, TensorView::contiguous(d_slots.ptr, DType::kI64, {n}, Device::cuda(0)),
                                            TensorView::contiguous(d_lat.ptr, DType::kF32, {n, kLatentDim}, Device::cuda(0)),
                                            TensorView::contiguous(d_rope.ptr, DType::kF32, {n, kRopeDim}, Device::cuda(0)),
                                            Fp8ScaleMode::kPow2, nullptr, nullptr, d_tally.ptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        CUDA_OK(cudaDeviceSynchronize());
        const Nvfp4ScaleCheck got = d_tally.download()[0].to_check();
        if (!is_nvfp4_format(f) || token_scale) {
          EXPECT_EQ(got.tokens, 0);
          EXPECT_EQ(got.groups, 0);
          continue;
        }
        EXPECT_EQ(got.tokens, want->tokens);
        EXPECT_EQ(got.groups, want->groups);
        EXPECT_EQ(got.subnormal_groups, want->subnormal_groups);
        EXPECT_EQ(got.max_abs, want->max_abs);
        EXPECT_EQ(nvfp4_scale_warning(f, got, outer), nvfp4_scale_warning(f, *want, outer));
      }
    }
  }
}

TEST_F(Cuda, MergeAttnStatesMatchesTheCpu) {
  const int P = 5, N = 37, D = 512;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> o(static_cast<std::size_t>(P * N * D)), l(static_cast<std::size_t>(P * N));
  for (float& x : o) x = nd(rng);
  for (std::size_t k = 0; k < l.size(); ++k) l[k] = (k % 7 == 0) ? -INFINITY : nd(rng) * 3;
  for (int n = 0; n < N; n += 9) {
    for (int k = 0; k < P; ++k) l[static_cast<std::size_t>(k * N + n)] = -INFINITY;  // all-empty rows
  }
  std::vector<float> co(static_cast<std::size_t>(N * D)), cl(N);
  ASSERT_TRUE(merge_attn_states(TensorView::contiguous(o.data(), DType::kF32, {P, N, D}),
                                TensorView::contiguous(l.data(), DType::kF32, {P, N}),
                                TensorView::contiguous(co.data(), DType::kF32, {N, D}),
                                TensorView::contiguous(cl.data(), DType::kF32, {N}))
                  .ok());
  DeviceBuffer<float> d_o(o.size()), d_l(l.size()), d_co(co.size() + 2 * kGuard), d_cl(cl.size() + 2 * kGuard);
  d_o.upload(o);
  d_l.upload(l);
  d_co.upload(std::vector<float>(co.size() + 2 * kGuard, kSentinel));
  d_cl.upload(std::vector<float>(cl.size() + 2 * kGuard, kSentinel));
  const Status st = cuda::merge_attn_states(TensorView::contiguous(d_o.ptr, DType::kF32, {P, N, D}, Device::cuda(0)),
                                            TensorView::contiguous(d_l.ptr, DType::kF32, {P, N}, Device::cuda(0)),
                                            TensorView::contiguous(d_co.ptr + kGuard, DType::kF32, {N, D}, Device::cuda(0)),
                                            TensorView::contiguous(d_cl.ptr + kGuard, DType::kF32, {N}, Device::cuda(0)), nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  const auto go = d_co.download(), gl = d_cl.download();
  for (int k = 0; k < kGuard; ++k) {
    ASSERT_EQ(go[static_cast<std::size_t>(k)], kSentinel);
    ASSERT_EQ(go[go.size() - 1 - static_cast<std::size_t>(k)], kSentinel);
  }
  for (int n = 0; n < N; ++n) {
    // Same AttnState code on both sides; fp32 exp/log implementations differ by a few ulp.
    if (std::isinf(cl[static_cast<std::size_t>(n)])) {
      EXPECT_EQ(gl[static_cast<std::size_t>(kGuard + n)], -INFINITY);
    } else {
      EXPECT_NEAR(gl[static_cast<std::size_t>(kGuard + n)], cl[static_cast<std::size_t>(n)], 1e-5 * (1 + std::fabs(cl[static_cast<std::size_t>(n)])));
    }
    for (int d = 0; d < D; ++d) {
      const float want = co[static_cast<std::size_t>(n * D + d)], got = go[static_cast<std::size_t>(kGuard + n * D + d)];
      ASSERT_TRUE(std::isfinite(got));
      ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << "row " << n << " dim " << d;
    }
  }
}

// ---- the GPU layer path against the CPU layer ---------------------------------------------
// The GPU layer differs from the CPU one only inside the attention (bf16 q, K/V and P,
// bounded per element by the tolerance above: <= 2^-8 MAV + the score term, i.e. about
// 2^-8 relative) and in fp32-vs-f64 projections (~1e-6 relative). W_UV and o_proj are
// linear, so the layer output's relative L2 error stays near 2^-8; the check allows
// 2^-6 (4x) and requires the outputs to be finite and the same shape.
TEST_F(Cuda, LayerForwardMatchesTheCpuLayer) {
  for (const char* name : {"deepseek_v3", "deepseek_v2_lite", "glm4_moe_lite", "kimi_k2"}) {
    for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                       KvFormat::kNvfp4DsMlaInt8Rope}) {
      SCOPED_TRACE(std::string(name) + " " + std::string(format_name(f)));
      const std::string dir = std::string(MLAKV_TEST_DATA_DIR) + "/hf_parity/" + name;
      auto cfg = load_hf_config(dir);
      ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
      auto ck = Checkpoint::open(dir);
      ASSERT_TRUE(ck.ok()) << ck.status().to_string();
      MlaLoadOptions lo;
      auto parsed = load_checkpoint_quant_options(dir);
      ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
      lo.quant = *parsed;
      auto io = SafetensorsFile::open(dir + "/io.safetensors");
      ASSERT_TRUE(io.ok()) << io.status().to_string();
      const auto& meta = (*io)->metadata();
      const int layer = meta.count("layer") ? std::atoi(meta.at("layer").c_str()) : 0;
      auto w = load_mla_layer(**ck, *cfg, layer, lo);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      const TensorView hs = *(*io)->find("hidden_states");
      const TensorView ps = *(*io)->find("positions");
      const int64_t T = hs.size(0), D = hs.size(1);
      std::vector<float> hidden(hs.ptr<const float>(), hs.ptr<const float>() + T * D);
      std::vector<int64_t> pos(ps.ptr<const int64_t>(), ps.ptr<const int64_t>() + T);
      // Prefill T-1 tokens, then decode the last one, on both devices.
      KvCache::Config kc;
      kc.num_blocks = (T + 15) / 16 + 1;
      kc.block_size = 16;
      kc.layers = {{f, 1.0f}};
      auto cpu_cache = PagedKvCache::create_cpu(kc);
      ASSERT_TRUE(cpu_cache.ok());
      auto gpu_blocks = BlockManager::create(kc.num_blocks, kc.block_size);
      const SeqId cs = (*cpu_cache)->add_sequence(), gs = gpu_blocks->add_sequence();
      auto dl = cuda::DeviceMlaLayer::upload(*w, *cfg);
      ASSERT_TRUE(dl.ok()) << dl.status().to_string();
      DeviceBuffer<uint8_t> d_cache(static_cast<std::size_t>(kc.num_blocks * kc.block_size * record_bytes(f)));
      CUDA_OK(cudaMemset(d_cache.ptr, 0, d_cache.n));
      CacheLayerView gv = *(*cpu_cache)->storage().layer(0);
      gv.data = d_cache.ptr;
      gv.device = Device::cuda(0);
      const int64_t chunks[2][2] = {{0, T - 1}, {T - 1, T}};
      for (const auto& ch : chunks) {
        const int64_t n = ch[1] - ch[0];
        ASSERT_TRUE((*cpu_cache)->append(cs, n).ok());
        auto slots = gpu_blocks->append(gs, n);
        ASSERT_TRUE(slots.ok());
        std::vector<float> cpu_out(static_cast<std::size_t>(n * D)), gpu_out(static_cast<std::size_t>(n * D));
        const Status st = mla_layer_forward(
            *w, *cfg, **cpu_cache, 0, cs, TensorView::contiguous(hidden.data() + ch[0] * D, DType::kF32, {n, D}),
            TensorView::contiguous(pos.data() + ch[0], DType::kI64, {n}),
            TensorView::contiguous(cpu_out.data(), DType::kF32, {n, D}));
        ASSERT_TRUE(st.ok()) << st.to_string();
        std::vector<int32_t> table;
        std::vector<int32_t> lens;
        int64_t max_blocks = 0;
        const SeqId one[1] = {gs};
        ASSERT_TRUE(gpu_blocks->fill_tables(one, table, max_blocks, lens).ok());
        DeviceBuffer<int32_t> d_table(table.size());
        d_table.upload(table);
        DeviceBuffer<int64_t> d_slots(slots->size());
        d_slots.upload(*slots);
        DeviceBuffer<float> d_hidden(static_cast<std::size_t>(n * D)), d_out(static_cast<std::size_t>(n * D));
        d_hidden.upload(std::vector<float>(hidden.begin() + ch[0] * D, hidden.begin() + ch[1] * D));
        const Status gst = (*dl)->forward(gv, TensorView::contiguous(d_table.ptr, DType::kI32, {1, max_blocks}, Device::cuda(0)),
                                          lens[0], TensorView::contiguous(d_slots.ptr, DType::kI64, {n}, Device::cuda(0)),
                                          TensorView::contiguous(d_hidden.ptr, DType::kF32, {n, D}, Device::cuda(0)),
                                          std::span<const int64_t>(pos.data() + ch[0], static_cast<std::size_t>(n)),
                                          TensorView::contiguous(d_out.ptr, DType::kF32, {n, D}, Device::cuda(0)));
        ASSERT_TRUE(gst.ok()) << gst.to_string();
        gpu_out = d_out.download();
        double num = 0, den = 0;
        for (std::size_t k = 0; k < cpu_out.size(); ++k) {
          ASSERT_TRUE(std::isfinite(gpu_out[k])) << "element " << k;
          num += (static_cast<double>(gpu_out[k]) - cpu_out[k]) * (static_cast<double>(gpu_out[k]) - cpu_out[k]);
          den += static_cast<double>(cpu_out[k]) * cpu_out[k];
        }
        const double rel = std::sqrt(num / std::max(den, 1e-300));
        EXPECT_LE(rel, std::ldexp(1.0, -6)) << "chunk [" << ch[0] << ", " << ch[1] << ")";
        RecordProperty(std::string("rel_l2_") + name + "_" + std::string(format_name(f)) + "_" + std::to_string(ch[0]),
                       std::to_string(rel));
        std::printf("  layer %-18s %-22s tokens [%2lld, %2lld): GPU vs CPU relative L2 %.3e\n", name,
                    std::string(format_name(f)).c_str(), static_cast<long long>(ch[0]), static_cast<long long>(ch[1]), rel);
      }
    }
  }
}

TEST_F(Cuda, BadArgumentsAreStatusesNotCrashes) {
  Case c;
  Host t = build(c);
  MlaAttentionParams p;
  std::vector<float> out(c.heads * kLatentDim), lse(c.heads);
  p.q = TensorView::contiguous(t.q.data(), DType::kF32, {1, 1, c.heads, kQkDim});  // host tensor
  p.cache = t.view;
  p.cache.device = Device::cuda(0);
  p.block_table = TensorView::contiguous(t.table.data(), DType::kI32, {1, t.max_blocks}, Device::cuda(0));
  p.seqlens = TensorView::contiguous(t.seqlens.data(), DType::kI32, {1}, Device::cuda(0));
  p.softmax_scale = 0.1f;
  p.out = TensorView::contiguous(out.data(), DType::kF32, {1, 1, c.heads, kLatentDim}, Device::cuda(0));
  p.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, 1, c.heads}, Device::cuda(0));
  auto plan = cuda::plan_mla_attention(p);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("q: expected a tensor on cuda:0"), std::string::npos) << plan.status().message();
  p.q.device = Device::cuda(0);
  p.num_splits = 4;
  plan = cuda::plan_mla_attention(p);
  ASSERT_TRUE(plan.ok());
  EXPECT_GT(plan->workspace_bytes, 0u);
  const Status st = cuda::run_mla_attention(p, *plan, nullptr, nullptr);
  EXPECT_NE(st.message().find("workspace"), std::string::npos) << st.message();
  p.num_splits = 2;
  EXPECT_NE(cuda::run_mla_attention(p, *plan, nullptr, nullptr).message().find("plan is for 4 splits"), std::string::npos);
  CacheLayerView host = t.view;
  EXPECT_FALSE(cuda::write_cache(host, p.seqlens, p.q, p.q, Fp8ScaleMode::kPow2, nullptr).ok());
  // A cache pointer off the 16-byte grid the writers store in is refused, naming it.
  CacheLayerView off = t.view;
  off.device = Device::cuda(0);
  off.data = static_cast<uint8_t*>(off.data) + 4;
  const Status mis = cuda::write_cache(off, p.seqlens, p.q, p.q, Fp8ScaleMode::kPow2, nullptr);
  EXPECT_NE(mis.message().find("16-byte aligned"), std::string::npos) << mis.to_string();
}

}  // namespace
}  // namespace mlakv

// A filter that selects no test is an error, not a silent pass.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (::testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    std::fprintf(stderr, "error: the filter selects no test\n");
    return 1;
  }
  return rc;
}
