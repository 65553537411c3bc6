#include "mlakv/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

namespace mlakv {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kU8: case DType::kI8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF64: return "f64";
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "f8_e4m3";
    case DType::kF8E8M0: return "f8_e8m0";
    case DType::kU8: return "u8";
    case DType::kI8: return "i8";
    case DType::kI16: return "i16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
  }
  return "?";
}

std::string device_name(Device d) {
  return d.type == DeviceType::kCpu ? std::string("cpu") : fmt::format("cuda:{}", d.index);
}

TensorView TensorView::contiguous(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int>(std::min<std::size_t>(shape.size(), kMaxTensorDims));
  int i = 0;
  for (int64_t s : shape) {
    if (i >= kMaxTensorDims) break;
    t.shape[static_cast<std::size_t>(i++)] = s;
  }
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[static_cast<std::size_t>(d)] = stride;
    stride *= t.shape[static_cast<std::size_t>(d)];
  }
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= size(d);
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (size(d) != 1 && stride(d) != expect) return false;
    expect *= size(d);
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::vector<int64_t> s(shape.begin(), shape.begin() + ndim);
  return fmt::format("[{}]", fmt::join(s, ", "));
}

Status check_tensor(const TensorView& t, std::string_view name, const TensorSpec& spec, Device device) {
  if (t.data == nullptr && t.numel() != 0) {
    return invalid_argument(fmt::format("{}: null data pointer for a non-empty tensor", name));
  }
  if (spec.dtypes.size() != 0 &&
      std::find(spec.dtypes.begin(), spec.dtypes.end(), t.dtype) == spec.dtypes.end()) {
    std::vector<std::string_view> names;
    for (DType d : spec.dtypes) names.push_back(dtype_name(d));
    return invalid_argument(fmt::format("{}: expected dtype {}, got {}", name, fmt::join(names, " or "),
                                        dtype_name(t.dtype)));
  }
  if (!(t.device == device)) {
    return invalid_argument(
        fmt::format("{}: expected a tensor on {}, got {}", name, device_name(device), device_name(t.device)));
  }
  std::vector<std::string> want;
  for (int64_t s : spec.shape) want.push_back(s < 0 ? std::string("*") : std::to_string(s));
  if (t.ndim != static_cast<int>(spec.shape.size())) {
    return invalid_argument(fmt::format("{}: expected {} dimensions [{}], got shape {}", name, spec.shape.size(),
                                        fmt::join(want, ", "), t.shape_string()));
  }
  int d = 0;
  for (int64_t s : spec.shape) {
    if (t.size(d) < 0 || (s >= 0 && t.size(d) != s)) {
      return invalid_argument(fmt::format("{}: expected shape [{}], got {} (dimension {})", name,
                                          fmt::join(want, ", "), t.shape_string(), d));
    }
    ++d;
  }
  if (t.ndim > 0 && t.size(t.ndim - 1) > 1 && t.stride(t.ndim - 1) != 1) {
    return invalid_argument(fmt::format("{}: the last dimension must be contiguous (stride 1), got stride {}",
                                        name, t.stride(t.ndim - 1)));
  }
  for (int k = 0; k < t.ndim; ++k) {
    if (t.stride(k) < 0) {
      return invalid_argument(fmt::format("{}: negative stride {} in dimension {}", name, t.stride(k), k));
    }
  }
  if (spec.strides == Strides::kContiguous && !t.is_contiguous()) {
    return invalid_argument(fmt::format("{}: must be contiguous (row-major, no gaps), got shape {} with strides [{}]",
                                        name, t.shape_string(),
                                        fmt::join(t.strides.begin(), t.strides.begin() + t.ndim, ", ")));
  }
  return Status::Ok();
}

}  // namespace mlakv
