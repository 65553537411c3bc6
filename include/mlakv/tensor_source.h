// A named collection of CPU tensors: a safetensors checkpoint (sharded or not), or
// tensors held in memory (tests, synthetic weights). Weight loaders read through this
// interface so they do not care where the bytes live.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/tensor.h"

namespace mlakv {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // A read-only CPU view of the tensor, or nullopt when there is no such name.
  // Views stay valid as long as the source lives.
  virtual std::optional<TensorView> find(std::string_view name) const = 0;
  // All tensor names, sorted.
  virtual std::vector<std::string> names() const = 0;
  // For error messages: "checkpoint /models/x (3 shards)".
  virtual std::string describe() const = 0;
};

// Owns its tensors; each is stored contiguously.
class TensorMap final : public TensorSource {
 public:
  // Adds (or replaces) a tensor with a copy of `bytes` (size must equal numel*itemsize).
  // kInvalidArgument for a negative extent, more than kMaxTensorDims dimensions, a size
  // that overflows or does not match; kResourceExhausted when the copy cannot be allocated.
  Status add(std::string name, DType dtype, std::vector<int64_t> shape, const void* bytes, std::size_t nbytes);
  // Adds a zero-filled tensor and returns a writable view of it; an empty view (data
  // null, ndim 0) and nothing added when the shape is invalid, overflows or cannot be
  // allocated.
  TensorView add_zeros(std::string name, DType dtype, std::vector<int64_t> shape);

  std::optional<TensorView> find(std::string_view name) const override;
  std::vector<std::string> names() const override;
  std::string describe() const override { return "in-memory tensors"; }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::unique_ptr<uint8_t[]> data;
    std::size_t nbytes;
  };
  std::map<std::string, Entry, std::less<>> tensors_;
};

}  // namespace mlakv
