#include "mlakv/tensor_source.h"

#include <fmt/format.h>

#include <cstring>
#include <new>
#include <optional>

#include "mlakv/untrusted.h"

namespace mlakv {
namespace {

TensorView view_of(const std::vector<int64_t>& shape, DType dtype, void* data) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[static_cast<std::size_t>(d)] = shape[static_cast<std::size_t>(d)];
    t.strides[static_cast<std::size_t>(d)] = stride;
    stride *= shape[static_cast<std::size_t>(d)];
  }
  return t;
}

// Element count, or nullopt when a dimension is negative or the product overflows.
std::optional<int64_t> numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0 || __builtin_mul_overflow(n, s, &n)) return std::nullopt;
  }
  return n;
}

// numel * itemsize in bytes, or nullopt on overflow.
std::optional<std::size_t> nbytes_of(const std::vector<int64_t>& shape, DType dtype) {
  const std::optional<int64_t> n = numel_of(shape);
  std::size_t b = 0;
  if (!n || __builtin_mul_overflow(static_cast<std::size_t>(*n), dtype_size(dtype), &b)) return std::nullopt;
  return b;
}

}  // namespace

Status TensorMap::add(std::string name, DType dtype, std::vector<int64_t> shape, const void* bytes,
                      std::size_t nbytes) {
  if (shape.size() > static_cast<std::size_t>(kMaxTensorDims)) {
    return invalid_argument(fmt::format("tensor {}: {} dimensions, at most {} supported", name, shape.size(),
                                        kMaxTensorDims));
  }
  for (int64_t s : shape) {
    if (s < 0) return invalid_argument(fmt::format("tensor {}: negative extent {}", quote_untrusted(name), s));
  }
  // Checked: a wrapped count of 0 would hand out a view promising 2^62 rows over 1 byte.
  const std::optional<std::size_t> want = nbytes_of(shape, dtype);
  if (!want) {
    return invalid_argument(
        fmt::format("tensor {}: shape x {} bytes overflows 64 bits", quote_untrusted(name), dtype_size(dtype)));
  }
  if (*want != nbytes) {
    return invalid_argument(fmt::format("tensor {}: {} bytes given, shape and dtype {} need {}", quote_untrusted(name),
                                        nbytes, dtype_name(dtype), *want));
  }
  if (nbytes != 0 && bytes == nullptr) {
    return invalid_argument(fmt::format("tensor {}: null data for {} bytes", quote_untrusted(name), nbytes));
  }
  try {
    Entry e{dtype, std::move(shape), std::make_unique<uint8_t[]>(nbytes == 0 ? 1 : nbytes), nbytes};
    if (nbytes != 0) std::memcpy(e.data.get(), bytes, nbytes);
    tensors_.insert_or_assign(std::move(name), std::move(e));
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("tensor {}: cannot allocate {} bytes", quote_untrusted(name), nbytes));
  }
  return Status::Ok();
}

TensorView TensorMap::add_zeros(std::string name, DType dtype, std::vector<int64_t> shape) {
  const std::optional<std::size_t> nbytes = nbytes_of(shape, dtype);
  if (!nbytes || shape.size() > static_cast<std::size_t>(kMaxTensorDims)) return TensorView{};
  try {
    Entry e{dtype, shape, std::make_unique<uint8_t[]>(*nbytes == 0 ? 1 : *nbytes), *nbytes};
    std::memset(e.data.get(), 0, *nbytes == 0 ? 1 : *nbytes);
    TensorView v = view_of(e.shape, dtype, e.data.get());
    tensors_.insert_or_assign(std::move(name), std::move(e));
    return v;
  } catch (const std::bad_alloc&) {
    return TensorView{};
  }
}

std::optional<TensorView> TensorMap::find(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  return view_of(it->second.shape, it->second.dtype, it->second.data.get());
}

std::vector<std::string> TensorMap::names() const {
  std::vector<std::string> out;
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

}  // namespace mlakv
