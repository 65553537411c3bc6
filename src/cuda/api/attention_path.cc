// The table of attention kernel paths (attention_path.h).
#include "cuda/api/attention_path.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "cuda/sm80/attention/launch.h"
#ifdef MLAKV_CUDA_HAVE_ARCH_90a
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/attention/launch_nat.h"
#include "cuda/sm90/attention/launch_rows.h"
#endif

namespace mlakv::cuda {
namespace {

bool sm80_serves(const MlaAttentionParams& /*p*/) { return true; }  // every supported GPU and shape

constexpr AttentionKernels kSm80Kernels{"sm80",
                                        sm80::kAttentionRows,
                                        &sm80_serves,
                                        &sm80::configure_attention,
                                        &sm80::attention_ctas_per_sm,
                                        &sm80::launch_attention};

#ifdef MLAKV_CUDA_HAVE_ARCH_90a
// Interim (issue 14): the sm90 kernel does not read the per-token scale s_t, so token-scale
// layers run on the sm80 path on Hopper too.
bool sm90_format_ready(const MlaAttentionParams& p) { return !p.cache.token_scale; }

bool sm90_serves(const MlaAttentionParams& p) {
  return sm90_format_ready(p) && sm90::supports(p.cache.format, p.cache.record_bytes, p.cache.data) &&
         sm90::available(p.cache.device.index);
}
constexpr AttentionKernels kSm90Kernels{"sm90",
                                        sm90::kAttentionRows,
                                        &sm90_serves,
                                        &sm90::configure_attention,
                                        &sm90::attention_ctas_per_sm,
                                        &sm90::launch_attention,
                                        &sm90::split_granule_of,
                                        /*programmatic_combine=*/true};

// The many-row kernel: the sm90 kernel's devices and formats, requests of >= 64 rows
// (dense: the s_q * H rows of a request share its KV; sparse: the H rows of one query).
bool sm90_rows_serves(const MlaAttentionParams& p) {
  if (p.q.ndim != 4) return false;
  const int64_t rows = p.sparse() ? p.q.size(2) : p.q.size(1) * p.q.size(2);
  return rows >= sm90::kRowsMinRows && sm90_serves(p);
}
int rows_split_granule(KvFormat /*format*/) { return sm90::kRowsTokenTile; }
constexpr AttentionKernels kSm90RowsKernels{"sm90_rows",
                                            sm90::kRowsPerCta,
                                            &sm90_rows_serves,
                                            &sm90::configure_attention_rows,
                                            &sm90::attention_rows_ctas_per_sm,
                                            &sm90::launch_attention_rows,
                                            &rows_split_granule};

// The natural-arrangement kernel: bf16, fp8_ds_mla or nvfp4 records, dense token sets of
// >= 64 rows per request at block sizes its TMA boxes tile, or sparse sets of >= 64 heads
// for the quantized formats (launch_nat.h), the sm90
// kernel's devices (not the token-scale mode: sm90_rows_serves). The plan picks it by
// itself where nat_is_default holds, else only when MLAKV_CUDA_ATTENTION=sm90_nat forces it.
bool sm90_nat_serves(const MlaAttentionParams& p) {
  return p.q.ndim == 4 && sm90::nat_supports(p.cache.format, p.cache.block_size, p.cache.num_slots(), p.sparse()) &&
         sm90_rows_serves(p);
}
bool nat_by_default(KvFormat format, bool sparse) { return sm90::nat_is_default(format, sparse); }
int nat_split_granule(KvFormat /*format*/) { return sm90::kNatTokenTile; }
constexpr AttentionKernels kSm90NatKernels{"sm90_nat",
                                           sm90::kNatRowsPerCta,
                                           &sm90_nat_serves,
                                           &sm90::configure_attention_nat,
                                           &sm90::attention_nat_ctas_per_sm,
                                           &sm90::launch_attention_nat,
                                           &nat_split_granule};
#else
// A binary built without 90a: the kSm90 entry serves nothing.
bool never_serves(const MlaAttentionParams& /*p*/) { return false; }
bool nat_by_default(KvFormat /*format*/, bool /*sparse*/) { return false; }
int no_configure(KvFormat /*format*/, int /*record_bytes*/) { return static_cast<int>(cudaErrorInvalidValue); }
int no_ctas(KvFormat /*format*/, int /*record_bytes*/) { return 0; }
int no_launch(KvFormat /*format*/, const kernels::AttentionParams& /*p*/, int /*row_blocks*/, void* /*stream*/) {
  return static_cast<int>(cudaErrorInvalidValue);
}
constexpr AttentionKernels kSm90Kernels{"sm90", 16, &never_serves, &no_configure, &no_ctas, &no_launch};
constexpr AttentionKernels kSm90RowsKernels{"sm90_rows", 64, &never_serves, &no_configure, &no_ctas, &no_launch};
constexpr AttentionKernels kSm90NatKernels{"sm90_nat", 64, &never_serves, &no_configure, &no_ctas, &no_launch};
#endif

}  // namespace

const char* attention_path_name(AttentionPath path) { return attention_kernels(path).name; }

StatusOr<AttentionPath> select_attention_path(const MlaAttentionParams& p) {
  const char* env = std::getenv("MLAKV_CUDA_ATTENTION");
  const bool force_sm80 = env != nullptr && std::strcmp(env, "sm80") == 0;
  const bool require_sm90 = env != nullptr && std::strcmp(env, "sm90") == 0;
  const bool require_rows = env != nullptr && std::strcmp(env, "sm90_rows") == 0;
  const bool require_nat = env != nullptr && std::strcmp(env, "sm90_nat") == 0;
  if (env != nullptr && *env != '\0' && !force_sm80 && !require_sm90 && !require_rows && !require_nat &&
      std::strcmp(env, "auto") != 0) {
    return invalid_argument(fmt::format("MLAKV_CUDA_ATTENTION='{}': expected sm80, sm90, sm90_rows, sm90_nat or auto", env));
  }
  if (force_sm80) return AttentionPath::kSm80;
  const bool sm90 = attention_kernels(AttentionPath::kSm90).serves(p);
  const bool rows = sm90 && attention_kernels(AttentionPath::kSm90Rows).serves(p);
  const bool nat = rows && attention_kernels(AttentionPath::kSm90Nat).serves(p);
  if ((require_sm90 && !sm90) || (require_rows && !rows) || (require_nat && !nat)) {
    return invalid_argument(fmt::format(
        "MLAKV_CUDA_ATTENTION={}: the Hopper kernel cannot run here (needs a compute capability 9.0 device, a "
        "binary built with 90a in MLAKV_CUDA_ARCHS, one of bf16, fp8_ds_mla, nvfp4_ds_mla, nvfp4_ds_mla_fp8rope, "
        "nvfp4_ds_mla_int8rope at L=512 R=64 without the token-scale mode (token-scale layers run on sm80 for now) "
        "and a 16-byte aligned cache{}; got {}, {}, {} B records{}, {} rows per request{})",
        env,
        require_rows  ? ", and for sm90_rows at least 64 rows per request (dense s_q * H, sparse H)"
        : require_nat ? ", and for sm90_nat bf16, fp8_ds_mla or nvfp4 records with a dense token set of at least 64 "
                        "rows per request (s_q * H) and a block size of 8, 16, 32 or a multiple of 64, or fp8_ds_mla or "
                        "nvfp4 records with a sparse set of at least 64 heads"
                      : "",
        device_name(p.cache.device), format_name(p.cache.format), p.cache.record_bytes,
        p.cache.token_scale ? ", token-scale mode" : "",
        p.q.ndim == 4 ? (p.sparse() ? p.q.size(2) : p.q.size(1) * p.q.size(2)) : 0,
        require_nat ? fmt::format(", {}, block size {}", p.sparse() ? "sparse" : "dense", p.cache.block_size) : ""));
  }
  if (require_sm90) return AttentionPath::kSm90;
  if (require_rows) return AttentionPath::kSm90Rows;
  if (require_nat || (nat && nat_by_default(p.cache.format, p.sparse()))) return AttentionPath::kSm90Nat;
  if (rows) return AttentionPath::kSm90Rows;
  return sm90 ? AttentionPath::kSm90 : AttentionPath::kSm80;
}

const AttentionKernels& attention_kernels(AttentionPath path) {
  switch (path) {
    case AttentionPath::kSm80: return kSm80Kernels;
    case AttentionPath::kSm90: return kSm90Kernels;
    case AttentionPath::kSm90Rows: return kSm90RowsKernels;
    case AttentionPath::kSm90Nat: return kSm90NatKernels;
  }
  return kSm80Kernels;
}

}  // namespace mlakv::cuda
