// Tensor descriptors: every mlakv operation takes its arrays as TensorView, a
// non-owning (pointer, dtype, device, shape, strides) record, the same shape of
// description DLPack and torch use, so bindings can pass their tensors through.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "mlakv/status.h"

namespace mlakv {

enum class DType : uint8_t {
  kF64, kF32, kF16, kBF16,
  kF8E4M3,  // fp8 e4m3fn
  kF8E8M0,  // ue8m0 scale bytes
  kU8, kI8, kI16, kI32, kI64,
};

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", "i32", ...

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::kCuda, i}; }
  bool operator==(const Device&) const = default;
};
std::string device_name(Device d);  // "cpu", "cuda:0"

inline constexpr int kMaxTensorDims = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device;
  int ndim = 0;
  std::array<int64_t, kMaxTensorDims> shape{};
  std::array<int64_t, kMaxTensorDims> strides{};  // in elements, not bytes

  // A contiguous row-major view.
  static TensorView contiguous(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());

  int64_t size(int d) const { return shape[static_cast<std::size_t>(d)]; }
  int64_t stride(int d) const { return strides[static_cast<std::size_t>(d)]; }
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  bool is_contiguous() const;
  std::string shape_string() const;  // "[2, 1, 16, 576]"

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

// What check_tensor requires of the strides (a negative stride always fails).
enum class Strides : uint8_t {
  kInnerContiguous,  // the last dimension has stride 1; rows may have gaps (the default)
  kContiguous,       // the whole tensor row-major without gaps (TensorView::is_contiguous)
};

// Argument validation shared by the API layers. `shape` entries of -1 accept any
// extent. On failure the Status names `name` and what was expected versus given.
struct TensorSpec {
  std::initializer_list<DType> dtypes;
  std::initializer_list<int64_t> shape;
  Strides strides = Strides::kInnerContiguous;
};
Status check_tensor(const TensorView& t, std::string_view name, const TensorSpec& spec, Device device);

}  // namespace mlakv
