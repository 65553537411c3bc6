// DCP over NCCL on several GPUs, checked against the single-GPU result.
//
//   nccl_test [--ranks N]      (N GPUs, default min(4, visible); runs dcp = 1, 2, 4 <= N)
//
// Built in CI when MLAKV_NCCL finds NCCL; needs a multi-GPU machine to run (not
// registered with CTest). NCCL_NVLS_ENABLE must stay unset or 0: the library refuses
// anything else, and sets it to 0 when it is unset.
//
// Each case: tokens made on the host, one cache with every token (the single-GPU run on
// GPU 0) and dcp per-rank caches through DcpBlockManager + dcp_write (records are
// per token, so each rank holds the single cache's bytes for its tokens), the bytes
// copied to the GPUs. Every rank runs run_mla_attention on its local metadata
// (dcp_local_metadata) and cuda::dcp_combine through its NCCL communicator, one thread
// per GPU; every rank's result is compared with the single-GPU one.
//
// Tolerance per row (tests/cuda/cuda_harness.cc's bound, applied to both runs): the
// kernel rounds q and K/V to bf16 (identical in both runs) and P to bf16 in the
// numerator only, accumulating in fp32, so each run is within
//   E = e_s MAD / (1 - e_s) + 2^-8 (1 + e_s) MAV + (2n + 8 + 4S) u vmax
// of the exact attention on the rounded inputs (e_s = e^(2d) - 1, d = 576 u scale
// max sum|q K|; MAV = sum_t w_t |v_t|, MAD <= 2 MAV; the weights w_t of the bf16-rounded
// scores are within e^(2 d_b), d_b = 2^-8 scale max sum|q K|, of the float64 ones used
// here). A DCP result is a merge of rank partials, each within its E over its own
// tokens; the merge weights sum the per-rank MAVs back to the row's MAV, and each
// rank's lse error (<= e_l = d + (n + 8 + 4S) u + 4 u |lse|) moves them by factors
// within e^(+-2 e_l). So |dcp - single| <= 2 E + 2 (e^(2 e_l) - 1) vmax, and
// |lse_dcp - lse_single| <= 2 e_l + (dcp + 2) u (|lse| + 1).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/common/status.h"
#include "format/record_codec.h"
#include "mlakv/cuda.h"
#include "mlakv/dcp.h"

namespace mlakv {
namespace {

constexpr double kU = 1.0 / (1 << 24);
constexpr float kScale = 0.1352f;
constexpr int kHeads = 16;
const std::vector<int> kSeqlens = {1, 3, 1000, 4097, 0};  // shorter than the ranks, ragged, empty

// Move-only: a copy would free the buffer twice (and a vector reallocation would free
// buffers still in use by queued kernels).
struct DeviceMem {
  void* p = nullptr;
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  DeviceMem(DeviceMem&& o) noexcept : p(o.p) { o.p = nullptr; }
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
  ~DeviceMem() {
    if (p != nullptr) cudaFree(p);
  }
  Status alloc(std::size_t bytes) {
    MLAKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)));
    return Status::Ok();
  }
  Status upload(const void* src, std::size_t bytes) {
    MLAKV_RETURN_IF_ERROR(alloc(bytes));
    if (bytes != 0) MLAKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
    return Status::Ok();
  }
};

struct Case {
  KvFormat format;
  int s_q;
  bool causal;
  DcpCombine mode;
  std::string name(int dcp) const {
    return fmt::format("{} dcp={} s_q={} {} {}", format_name(format), dcp, s_q, causal ? "causal" : "full",
                       mode == DcpCombine::kAllGather ? "all-gather" : "reduce-scatter");
  }
};

struct Host {
  std::vector<std::vector<float>> lat, rope;
  std::vector<float> q;
  std::unique_ptr<KvCache> single;
  std::vector<int32_t> table, seqlens;
  int64_t max_blocks = 1;
  std::vector<std::unique_ptr<KvCache>> ranks;
  std::vector<std::vector<int32_t>> rank_tables;
  std::vector<int64_t> rank_max_blocks;
  std::vector<int32_t> global_seqlens;
};

Status make_host(const Case& c, int dcp, int bs, Host& h) {
  std::mt19937 rng(17 + static_cast<uint32_t>(c.format));
  std::normal_distribution<float> nd;
  const float outer = format_info(c.format).has_outer_scale ? 0.6f : 1.0f;
  int64_t blocks = 0;
  for (int len : kSeqlens) {
    std::vector<float> lat(static_cast<std::size_t>(len) * kLatentDim), rope(static_cast<std::size_t>(len) * kRopeDim);
    for (float& x : lat) x = nd(rng);
    for (float& x : rope) x = nd(rng);
    h.lat.push_back(std::move(lat));
    h.rope.push_back(std::move(rope));
    blocks += (len + bs - 1) / bs;
    h.max_blocks = std::max<int64_t>(h.max_blocks, (len + bs - 1) / bs);
  }
  const int B = static_cast<int>(kSeqlens.size());
  h.q.resize(static_cast<std::size_t>(B * c.s_q * kHeads * kQkDim));
  for (float& x : h.q) x = nd(rng) * 0.7f;
  KvCache::Config cfg;
  cfg.num_blocks = blocks + 1;
  cfg.block_size = bs;
  cfg.layers = {{c.format, outer}};
  MLAKV_ASSIGN_OR_RETURN(h.single, KvCache::create_cpu(cfg));
  h.single->fill(0xFF);
  h.table.assign(static_cast<std::size_t>(B * h.max_blocks), -1);
  int32_t next = 0;
  for (int b = 0; b < B; ++b) {
    const int len = kSeqlens[static_cast<std::size_t>(b)];
    h.seqlens.push_back(len);
    std::vector<int64_t> slots;
    for (int64_t k = 0; k < (len + bs - 1) / bs; ++k) h.table[static_cast<std::size_t>(b * h.max_blocks + k)] = next++;
    for (int p = 0; p < len; ++p) slots.push_back(int64_t{h.table[static_cast<std::size_t>(b * h.max_blocks + p / bs)]} * bs + p % bs);
    if (len == 0) continue;
    MLAKV_RETURN_IF_ERROR(h.single->write(0, TensorView::contiguous(slots.data(), DType::kI64, {len}),
                                          TensorView::contiguous(h.lat[static_cast<std::size_t>(b)].data(), DType::kF32, {len, kLatentDim}),
                                          TensorView::contiguous(h.rope[static_cast<std::size_t>(b)].data(), DType::kF32, {len, kRopeDim})));
  }
  // Per-rank caches.
  int64_t per_rank = 1;
  for (int len : kSeqlens) per_rank += (dcp_local_count(len, 0, dcp) + bs - 1) / bs;
  MLAKV_ASSIGN_OR_RETURN(DcpBlockManager m, DcpBlockManager::create(dcp, per_rank, bs));
  cfg.num_blocks = per_rank;
  std::vector<KvCache*> raw;
  for (int r = 0; r < dcp; ++r) {
    MLAKV_ASSIGN_OR_RETURN(auto cache, KvCache::create_cpu(cfg));
    cache->fill(0xFF);
    raw.push_back(cache.get());
    h.ranks.push_back(std::move(cache));
  }
  std::vector<SeqId> seqs;
  for (int b = 0; b < B; ++b) {
    seqs.push_back(m.add_sequence());
    const int len = kSeqlens[static_cast<std::size_t>(b)];
    MLAKV_ASSIGN_OR_RETURN(DcpSlots s, m.append(seqs.back(), len));
    MLAKV_RETURN_IF_ERROR(dcp_write(raw, 0, s,
                                    TensorView::contiguous(h.lat[static_cast<std::size_t>(b)].data(), DType::kF32, {len, kLatentDim}),
                                    TensorView::contiguous(h.rope[static_cast<std::size_t>(b)].data(), DType::kF32, {len, kRopeDim})));
  }
  h.rank_tables.resize(static_cast<std::size_t>(dcp));
  h.rank_max_blocks.resize(static_cast<std::size_t>(dcp));
  for (int r = 0; r < dcp; ++r) {
    std::vector<int32_t> local;
    MLAKV_RETURN_IF_ERROR(m.fill_tables(r, seqs, h.rank_tables[static_cast<std::size_t>(r)],
                                        h.rank_max_blocks[static_cast<std::size_t>(r)], local, h.global_seqlens));
  }
  return Status::Ok();
}

// A host cache layer copied to the current device.
StatusOr<CacheLayerView> to_device(const KvCache& cache, int device, DeviceMem& mem) {
  MLAKV_ASSIGN_OR_RETURN(CacheLayerView v, cache.layer(0));
  MLAKV_RETURN_IF_ERROR(mem.upload(v.data, static_cast<std::size_t>(v.num_slots() * v.record_bytes)));
  v.data = static_cast<uint8_t*>(mem.p);
  v.device = Device::cuda(device);
  return v;
}

struct Out {
  std::vector<float> o, l;
};

// One attention call on the current device; q/out/lse are [rows, s_q, H, ...] host arrays.
Status attention_on_device(const MlaAttentionParams& host_shape, const CacheLayerView& cache, int device,
                           const std::vector<int32_t>& table, const std::vector<int32_t>& seqlens, const float* q,
                           float* out_dev, float* lse_dev, cudaStream_t stream, std::vector<DeviceMem>& keep) {
  const Device dev = Device::cuda(device);
  keep.resize(keep.size() + 3);
  DeviceMem& dq = keep[keep.size() - 3];
  DeviceMem& dt = keep[keep.size() - 2];
  DeviceMem& ds = keep[keep.size() - 1];
  MlaAttentionParams p = host_shape;
  MLAKV_RETURN_IF_ERROR(dq.upload(q, static_cast<std::size_t>(p.q.numel()) * sizeof(float)));
  MLAKV_RETURN_IF_ERROR(dt.upload(table.data(), table.size() * sizeof(int32_t)));
  MLAKV_RETURN_IF_ERROR(ds.upload(seqlens.data(), seqlens.size() * sizeof(int32_t)));
  p.q.data = dq.p;
  p.q.device = dev;
  p.block_table.data = dt.p;
  p.block_table.device = dev;
  p.seqlens.data = ds.p;
  p.seqlens.device = dev;
  p.out.data = out_dev;
  p.out.device = dev;
  p.lse.data = lse_dev;
  p.lse.device = dev;
  p.cache = cache;
  cudaDeviceProp prop;
  MLAKV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  p.num_splits = cuda::suggest_num_splits(p, prop.multiProcessorCount);
  MLAKV_ASSIGN_OR_RETURN(cuda::AttentionPlan plan, cuda::plan_mla_attention(p));
  keep.emplace_back();
  MLAKV_RETURN_IF_ERROR(keep.back().alloc(plan.workspace_bytes));
  return cuda::run_mla_attention(p, plan, keep.back().p, stream);
}

Status single_gpu(const Case& c, const Host& h, Out& out) {
  MLAKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  const int64_t B = static_cast<int64_t>(kSeqlens.size());
  DeviceMem cache_mem, o, l;
  MLAKV_ASSIGN_OR_RETURN(CacheLayerView v, to_device(*h.single, 0, cache_mem));
  const int64_t rows = B * c.s_q * kHeads;
  MLAKV_RETURN_IF_ERROR(o.alloc(static_cast<std::size_t>(rows * kLatentDim) * sizeof(float)));
  MLAKV_RETURN_IF_ERROR(l.alloc(static_cast<std::size_t>(rows) * sizeof(float)));
  MlaAttentionParams p;
  p.q = TensorView::contiguous(nullptr, DType::kF32, {B, c.s_q, kHeads, kQkDim});
  p.block_table = TensorView::contiguous(nullptr, DType::kI32, {B, h.max_blocks});
  p.seqlens = TensorView::contiguous(nullptr, DType::kI32, {B});
  p.out = TensorView::contiguous(nullptr, DType::kF32, {B, c.s_q, kHeads, kLatentDim});
  p.lse = TensorView::contiguous(nullptr, DType::kF32, {B, c.s_q, kHeads});
  p.softmax_scale = kScale;
  p.causal = c.causal;
  std::vector<DeviceMem> keep;
  MLAKV_RETURN_IF_ERROR(attention_on_device(p, v, 0, h.table, h.seqlens, h.q.data(), static_cast<float*>(o.p),
                                            static_cast<float*>(l.p), nullptr, keep));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  out.o.resize(static_cast<std::size_t>(rows * kLatentDim));
  out.l.resize(static_cast<std::size_t>(rows));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.o.data(), o.p, out.o.size() * sizeof(float), cudaMemcpyDeviceToHost));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.l.data(), l.p, out.l.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

// Rank r of the DCP run: local attention on GPU r, then the device combine.
Status dcp_rank(Communicator& comm, const Case& c, const Host& h, Out& out) {
  const int r = comm.rank(), P = comm.size();
  const int device = comm.device().index;
  MLAKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream;
  MLAKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int64_t B = static_cast<int64_t>(kSeqlens.size());
  DeviceMem cache_mem, op, lp, o, l, ws;
  MLAKV_ASSIGN_OR_RETURN(CacheLayerView v, to_device(*h.ranks[static_cast<std::size_t>(r)], device, cache_mem));
  const auto& tab = h.rank_tables[static_cast<std::size_t>(r)];
  MLAKV_ASSIGN_OR_RETURN(DcpLocalMetadata m,
                         dcp_local_metadata(r, P, TensorView::contiguous(tab.data(), DType::kI32, {B, h.rank_max_blocks[static_cast<std::size_t>(r)]}),
                                            TensorView::contiguous(h.global_seqlens.data(), DType::kI32, {B}), c.s_q, c.causal));
  const int64_t rows = B * c.s_q * kHeads;
  const int64_t Hl = c.mode == DcpCombine::kAllGather ? kHeads : kHeads / P;
  MLAKV_RETURN_IF_ERROR(op.alloc(static_cast<std::size_t>(rows * kLatentDim) * sizeof(float)));
  MLAKV_RETURN_IF_ERROR(lp.alloc(static_cast<std::size_t>(rows) * sizeof(float)));
  MLAKV_RETURN_IF_ERROR(o.alloc(static_cast<std::size_t>(B * c.s_q * Hl * kLatentDim) * sizeof(float)));
  MLAKV_RETURN_IF_ERROR(l.alloc(static_cast<std::size_t>(B * c.s_q * Hl) * sizeof(float)));
  // The local call: [m.rows, m.s_q] (each query row its own request when causal, s_q > 1).
  MlaAttentionParams p;
  p.q = TensorView::contiguous(nullptr, DType::kF32, {m.rows, m.s_q, kHeads, kQkDim});
  p.block_table = TensorView::contiguous(nullptr, DType::kI32, {m.rows, m.max_blocks});
  p.seqlens = TensorView::contiguous(nullptr, DType::kI32, {m.rows});
  p.out = TensorView::contiguous(nullptr, DType::kF32, {m.rows, m.s_q, kHeads, kLatentDim});
  p.lse = TensorView::contiguous(nullptr, DType::kF32, {m.rows, m.s_q, kHeads});
  p.softmax_scale = kScale;
  p.causal = m.causal;
  std::vector<DeviceMem> keep;
  MLAKV_RETURN_IF_ERROR(attention_on_device(p, v, device, m.block_table, m.seqlens, h.q.data(), static_cast<float*>(op.p),
                                            static_cast<float*>(lp.p), stream, keep));
  const std::size_t wsb = cuda::dcp_combine_workspace_bytes(P, rows, c.mode);
  MLAKV_RETURN_IF_ERROR(ws.alloc(wsb));
  MLAKV_RETURN_IF_ERROR(comm.set_stream(stream));
  const Device dev = comm.device();
  MLAKV_RETURN_IF_ERROR(cuda::dcp_combine(comm, TensorView::contiguous(op.p, DType::kF32, {B, c.s_q, kHeads, kLatentDim}, dev),
                                          TensorView::contiguous(lp.p, DType::kF32, {B, c.s_q, kHeads}, dev), c.mode,
                                          TensorView::contiguous(o.p, DType::kF32, {B, c.s_q, Hl, kLatentDim}, dev),
                                          TensorView::contiguous(l.p, DType::kF32, {B, c.s_q, Hl}, dev), ws.p, wsb));
  MLAKV_RETURN_IF_ERROR(comm.synchronize());
  MLAKV_RETURN_IF_ERROR(comm.set_stream(nullptr));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
  out.o.resize(static_cast<std::size_t>(B * c.s_q * Hl * kLatentDim));
  out.l.resize(static_cast<std::size_t>(B * c.s_q * Hl));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.o.data(), o.p, out.o.size() * sizeof(float), cudaMemcpyDeviceToHost));
  MLAKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.l.data(), l.p, out.l.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

// |rank result - single-GPU result| within the header's bound; returns a failure message.
Status compare(const Case& c, const Host& h, int P, int r, const Out& one, const Out& got) {
  const int Hl = c.mode == DcpCombine::kAllGather ? kHeads : kHeads / P;
  const int h0 = c.mode == DcpCombine::kAllGather ? 0 : r * Hl;
  const CacheLayerView sv = *h.single->layer(0);
  for (std::size_t b = 0; b < kSeqlens.size(); ++b) {
    const int len = kSeqlens[b];
    std::vector<std::vector<float>> keys;
    double vmax = 0;
    for (int p = 0; p < len; ++p) {
      const int64_t slot = int64_t{h.table[b * static_cast<std::size_t>(h.max_blocks) + static_cast<std::size_t>(p / sv.block_size)]} * sv.block_size + p % sv.block_size;
      std::vector<float> k(kQkDim);
      codec::decode_record(sv.format, sv.record(slot), sv.outer_scale, k.data(), k.data() + kLatentDim);
      for (int d = 0; d < kLatentDim; ++d) vmax = std::max(vmax, std::fabs(double{k[static_cast<std::size_t>(d)]}));
      keys.push_back(std::move(k));
    }
    for (int i = 0; i < c.s_q; ++i) {
      const int vis = c.causal ? std::clamp(len - c.s_q + i + 1, 0, len) : len;
      for (int hh = 0; hh < Hl; ++hh) {
        const std::size_t row = (b * static_cast<std::size_t>(c.s_q) + static_cast<std::size_t>(i)) * kHeads + static_cast<std::size_t>(h0 + hh);
        const std::size_t grow = (b * static_cast<std::size_t>(c.s_q) + static_cast<std::size_t>(i)) * static_cast<std::size_t>(Hl) + static_cast<std::size_t>(hh);
        const float* q = h.q.data() + row * kQkDim;
        const float gl = got.l[grow], ol = one.l[row];
        if (std::isnan(gl)) return internal_error(fmt::format("lse NaN at request {} query {} head {}", b, i, h0 + hh));
        if (vis == 0) {
          if (gl != -INFINITY || ol != -INFINITY) return internal_error(fmt::format("empty row {}: lse {} / {}", row, gl, ol));
          for (int d = 0; d < kLatentDim; ++d) {
            if (got.o[grow * kLatentDim + static_cast<std::size_t>(d)] != 0.0f) return internal_error("empty row: out not 0");
          }
          continue;
        }
        double dmax = 0, smax = -INFINITY;
        std::vector<double> s;
        for (int t = 0; t < vis; ++t) {
          double dot = 0, sabs = 0;
          for (int k = 0; k < kQkDim; ++k) {
            dot += double{q[k]} * keys[static_cast<std::size_t>(t)][static_cast<std::size_t>(k)];
            sabs += std::fabs(double{q[k]} * keys[static_cast<std::size_t>(t)][static_cast<std::size_t>(k)]);
          }
          s.push_back(dot * kScale);
          smax = std::max(smax, s.back());
          dmax = std::max(dmax, sabs * kScale);
        }
        double wsum = 0, mav = 0;
        for (double x : s) wsum += std::exp(x - smax);
        for (int t = 0; t < vis; ++t) {
          const double w = std::exp(s[static_cast<std::size_t>(t)] - smax) / wsum;
          double row_abs = 0;
          for (int d = 0; d < kLatentDim; ++d) row_abs = std::max(row_abs, std::fabs(double{keys[static_cast<std::size_t>(t)][static_cast<std::size_t>(d)]}));
          mav += w * row_abs;  // sum_t w_t max_d |v_td| bounds sum_t w_t |v_td| for every d
        }
        const double d = 576 * kU * dmax, db = std::ldexp(1.0, -8) * dmax;
        const double es = std::expm1(2 * d);
        const double mavb = std::exp(2 * db) * mav;
        const double n = vis, S = 64.0 * P;  // S: at most 64 splits per rank (suggest_num_splits)
        const double E = es * 2 * mavb / (1 - es) + std::ldexp(1.0, -8) * (1 + es) * mavb + (2 * n + 8 + 4 * S) * kU * vmax;
        const double el = d + (n + 8 + 4 * S) * kU + 4 * kU * std::fabs(ol);
        const double tol_o = 2 * E + 2 * std::expm1(2 * el) * vmax;
        const double tol_l = 2 * el + (P + 2) * kU * (std::fabs(ol) + 1);
        if (std::fabs(double{gl} - ol) > tol_l) {
          return internal_error(fmt::format("lse request {} query {} head {}: {} vs single-GPU {} (tol {})", b, i, h0 + hh, gl, ol, tol_l));
        }
        for (int k = 0; k < kLatentDim; ++k) {
          const double go = got.o[grow * kLatentDim + static_cast<std::size_t>(k)], oo = one.o[row * kLatentDim + static_cast<std::size_t>(k)];
          if (!std::isfinite(go) || std::fabs(go - oo) > tol_o) {
            return internal_error(fmt::format("out request {} query {} head {} dim {}: {} vs single-GPU {} (tol {})", b, i,
                                              h0 + hh, k, go, oo, tol_o));
          }
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace
}  // namespace mlakv

int main(int argc, char** argv) {
  using namespace mlakv;
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible < 1) {
    std::fprintf(stderr, "nccl_test: no CUDA device visible\n");
    return 2;
  }
  int ranks = std::min(4, visible);
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--ranks" && i + 1 < argc) ranks = std::atoi(argv[++i]);
  }
  if (ranks < 1 || ranks > visible) {
    std::fprintf(stderr, "nccl_test: --ranks %d but %d GPU(s) visible\n", ranks, visible);
    return 2;
  }
  const KvFormat formats[] = {KvFormat::kBf16, KvFormat::kFp8DsMla, KvFormat::kNvfp4DsMla, KvFormat::kNvfp4DsMlaFp8Rope,
                              KvFormat::kNvfp4DsMlaInt8Rope};
  int failures = 0, cases = 0;
  for (int dcp : {1, 2, 4}) {
    if (dcp > ranks) continue;
    auto id = nccl_unique_id();
    if (!id.ok()) {
      std::fprintf(stderr, "nccl_unique_id: %s\n", id.status().to_string().c_str());
      return 1;
    }
    std::vector<std::unique_ptr<Communicator>> comms(static_cast<std::size_t>(dcp));
    std::vector<Status> made(static_cast<std::size_t>(dcp));
    {
      std::vector<std::thread> ts;
      for (int r = 0; r < dcp; ++r) {
        ts.emplace_back([&, r] {
          auto c = make_nccl_communicator(*id, r, dcp, r);
          made[static_cast<std::size_t>(r)] = c.status();
          if (c.ok()) comms[static_cast<std::size_t>(r)] = std::move(c).value();
        });
      }
      for (auto& t : ts) t.join();
    }
    for (int r = 0; r < dcp; ++r) {
      if (!made[static_cast<std::size_t>(r)].ok()) {
        std::fprintf(stderr, "make_nccl_communicator rank %d: %s\n", r, made[static_cast<std::size_t>(r)].to_string().c_str());
        return 1;
      }
    }
    for (KvFormat f : formats) {
      for (auto [s_q, causal] : {std::pair{1, true}, std::pair{2, true}, std::pair{2, false}}) {
        for (DcpCombine mode : {DcpCombine::kAllGather, DcpCombine::kReduceScatterHeads}) {
          const Case c{f, s_q, causal, mode};
          ++cases;
          Host h;
          Out one;
          Status st = make_host(c, dcp, 64, h);
          if (st.ok()) st = single_gpu(c, h, one);
          std::vector<Out> outs(static_cast<std::size_t>(dcp));
          if (st.ok()) {
            st = run_ranks(comms, [&](Communicator& comm) { return dcp_rank(comm, c, h, outs[static_cast<std::size_t>(comm.rank())]); });
          }
          for (int r = 0; st.ok() && r < dcp; ++r) {
            st = compare(c, h, dcp, r, one, outs[static_cast<std::size_t>(r)]).with_context(fmt::format("rank {}", r));
          }
          std::printf("%s %s%s%s\n", st.ok() ? "PASS" : "FAIL", c.name(dcp).c_str(), st.ok() ? "" : ": ",
                      st.ok() ? "" : st.to_string().c_str());
          failures += !st.ok();
        }
      }
    }
    // Destroy each communicator on its own thread, concurrently (NCCL may synchronise
    // the ranks while tearing down).
    std::vector<std::thread> ts;
    for (auto& c : comms) ts.emplace_back([&c] { c.reset(); });
    for (auto& t : ts) t.join();
  }
  std::printf("%d of %d cases passed\n", cases - failures, cases);
  return failures == 0 ? 0 : 1;
}
