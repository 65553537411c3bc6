// One float32 element of a little-endian f32 / bf16 / f16 buffer (weights, norms,
// scales, activations read from checkpoints or callers). Host only; loads are memcpy so
// data need not be aligned (safetensors offsets are not).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "mlakv/numerics.h"
#include "mlakv/tensor.h"

namespace mlakv {

// Element i (counted in elements of `dtype` from `data`) as float32, exactly. Any dtype
// other than kF32 / kBF16 / kF16 gives NaN (callers check the dtype first).
inline float load_as_f32(const void* data, DType dtype, int64_t i) {
  const auto* b = static_cast<const uint8_t*>(data);
  switch (dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, b + 4 * i, 4);
      return v;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      return dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    default: return std::nanf("");
  }
}

}  // namespace mlakv
