// The one runtime-to-compile-time switch over record formats of the CUDA backend:
// dispatch_format(f, fallback, fn) calls fn(FormatTag<F>{}) for the KvFormat f, so
// a kernel template is instantiated once per format and picked at run time without a
// switch at every call site. `fallback` is returned for a value outside the enum
// (the API layer validates formats first, so that means memory corruption or a new
// enumerator without a case here: the static_assert below catches the latter).
//
//   return dispatch_format(format, int{cudaErrorInvalidValue},
//                          [&](auto tag) { return launch<decltype(tag)::value>(p, stream); });
//
// Plain C++ (no CUDA headers): host API files and .cu files both include it.
#pragma once

#include <utility>

#include "mlakv/formats.h"

namespace mlakv::cuda {

template <KvFormat F>
struct FormatTag {
  static constexpr KvFormat value = F;
};

static_assert(kNumKvFormats == 6, "dispatch_format: add a case for the new KvFormat");

// Which formats a kernel family has instantiations for. kAll: every CUDA format (the
// cache writer, the sm80 and sm90 attention paths pass it). kNoInt8Rope: all but
// nvfp4_ds_mla_int8rope, the default, for a kernel family without that record.
enum class KernelSet { kAll, kNoInt8Rope };

template <KernelSet S = KernelSet::kNoInt8Rope, class R, class Fn>
R dispatch_format(KvFormat f, R fallback, Fn&& fn) {
  switch (f) {
    case KvFormat::kBf16: return std::forward<Fn>(fn)(FormatTag<KvFormat::kBf16>{});
    case KvFormat::kFp8DsMla: return std::forward<Fn>(fn)(FormatTag<KvFormat::kFp8DsMla>{});
    case KvFormat::kNvfp4DsMla: return std::forward<Fn>(fn)(FormatTag<KvFormat::kNvfp4DsMla>{});
    case KvFormat::kNvfp4DsMlaFp8Rope: return std::forward<Fn>(fn)(FormatTag<KvFormat::kNvfp4DsMlaFp8Rope>{});
    // f32 (2304 B, parity checks) has no CUDA kernels: the API layer refuses it with
    // kUnimplemented (check_cache_view), so no kernel is instantiated for it.
    case KvFormat::kF32: return fallback;
    case KvFormat::kNvfp4DsMlaInt8Rope:
      if constexpr (S == KernelSet::kAll) {
        return std::forward<Fn>(fn)(FormatTag<KvFormat::kNvfp4DsMlaInt8Rope>{});
      } else {
        return fallback;  // a kernel set without it (see KernelSet)
      }
  }
  return fallback;
}

}  // namespace mlakv::cuda
