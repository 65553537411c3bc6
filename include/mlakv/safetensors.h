// safetensors checkpoints: a memory-mapped reader for one file, a sharded checkpoint
// (model.safetensors.index.json + shards), and a crash-safe writer.
//
// File layout (https://github.com/huggingface/safetensors, docs/formats.md):
//   [0, 8)        u64 little-endian N, the header length
//   [8, 8+N)      UTF-8 JSON object: name -> {"dtype": "F32", "shape": [..],
//                 "data_offsets": [begin, end]}, plus an optional
//                 "__metadata__": {string: string}
//   [8+N, size)   the data region; offsets are relative to its start, tensors are
//                 row-major and little-endian.
//
// Files are untrusted: every open validates the whole header before any view is
// handed out, and a malformed file yields a Status naming the file and tensor.
// Nothing throws across this API and nothing aborts. Gaps between tensors and bytes
// after the last one are tolerated (the reference Rust reader requires dense packing);
// overlaps are not. A file truncated by someone else while mapped can still fault
// (SIGBUS) on access: mmap cannot guard against that.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mlakv/file_io.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"
#include "mlakv/tensor_source.h"

namespace mlakv {

// Largest JSON header accepted (real checkpoints use well under 1 MiB per shard).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// "F32" <-> DType::kF32, ... for F64 F32 F16 BF16 F8_E4M3 F8_E8M0 U8 I8 I16 I32 I64.
// nullopt for any other string (including valid safetensors dtypes mlakv cannot hold,
// such as BOOL or F8_E5M2).
std::optional<DType> dtype_from_safetensors(std::string_view name);
std::string_view safetensors_dtype_name(DType dtype);

// One header entry after validation.
struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // at most kMaxTensorDims entries, each >= 0
  uint64_t begin = 0;          // byte offsets relative to the data region, begin <= end
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

// One .safetensors file, mapped read-only for the lifetime of the object.
class SafetensorsFile final : public TensorSource {
 public:
  // Maps and validates `path`. Errors: kNotFound (no such file), kIoError (the OS
  // refused to open/map it), kDataLoss (malformed header or offsets), kUnimplemented
  // (a tensor's dtype has no mlakv DType). Zero-sized tensors are accepted.
  // A FIFO, device or directory is refused (kInvalidArgument) without blocking.
  static StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // The same validation over `size` bytes in memory (copied; `name` stands for the
  // path in messages). For bytes that did not come from a file (tests, fuzzing,
  // bindings).
  static StatusOr<std::unique_ptr<SafetensorsFile>> open_memory(const void* data, std::size_t size, std::string name);

  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // A contiguous CPU view of the tensor (read-only data: never write through it).
  // The pointer is aligned to the dtype's size: tensors whose file offset is not
  // aligned are copied once at open(). Views live as long as this object.
  std::optional<TensorView> find(std::string_view name) const override;
  std::vector<std::string> names() const override;  // sorted
  std::string describe() const override { return path_; }

  const std::string& path() const { return path_; }
  // The header's "__metadata__" (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // All entries, sorted by name.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // The entry for `name`, or nullptr.
  const SafetensorsTensorInfo* info(std::string_view name) const;
  uint64_t file_size() const { return map_size_; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + N

 private:
  SafetensorsFile() = default;
  Status parse(const uint8_t* bytes);  // bytes = the whole file, map_size_ long
  std::size_t index_of(std::string_view name) const;  // tensors_.size() when absent

  std::string path_;
  void* map_ = nullptr;  // the whole file, PROT_READ
  std::unique_ptr<uint8_t[]> owned_;  // or, from open_memory(), a copy of the bytes
  uint64_t map_size_ = 0;
  uint64_t data_offset_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsTensorInfo> tensors_;         // sorted by name
  std::vector<const uint8_t*> data_;                   // parallel to tensors_
  std::vector<std::unique_ptr<uint8_t[]>> copies_;     // aligned copies of misaligned tensors
};

// A checkpoint directory: several shards behind model.safetensors.index.json, a
// single model.safetensors, or one .safetensors file given directly. A weight and its
// scales may sit in different shards; find() hides that.
class Checkpoint final : public TensorSource {
 public:
  // `dir_or_file` is (in order of preference) a directory holding
  // model.safetensors.index.json, a directory holding model.safetensors, an
  // *.index.json file, or a .safetensors file. Index errors (kDataLoss unless noted):
  // invalid JSON, no "weight_map" object, a non-string shard name, a shard name with
  // '/', '\\' or ".." (path traversal), a missing shard (kNotFound, naming the shard
  // and a tensor mapped to it), a tensor the index maps to a shard that lacks it.
  // The index is authoritative: tensors a shard holds but the index does not list are
  // not visible.
  static StatusOr<std::unique_ptr<Checkpoint>> open(const std::string& dir_or_file);

  std::optional<TensorView> find(std::string_view name) const override;
  std::vector<std::string> names() const override;  // sorted
  // "checkpoint /models/x (3 shards)" or "checkpoint /models/x/model.safetensors".
  std::string describe() const override;

  // The index's "metadata" object: string values verbatim, other values as their
  // JSON text (e.g. total_size "1234"). For a single file, that file's __metadata__.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  // The shard that holds `name`, or nullptr.
  const SafetensorsFile* shard_of(std::string_view name) const;

 private:
  Checkpoint() = default;
  static StatusOr<std::unique_ptr<Checkpoint>> open_unguarded(const std::string& dir_or_file);

  std::string root_;  // directory, or the single file
  bool indexed_ = false;
  std::map<std::string, std::string> metadata_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsFile*, std::less<>> where_;
};

// Writes `tensors` to `path` as one safetensors file: the header (keys sorted, padded
// with spaces to a multiple of 8 bytes), then each tensor's bytes in the given order
// with no gaps. Every tensor must be on the CPU, contiguous, with a non-empty unique
// name other than "__metadata__" and a non-null pointer unless it is empty; on any
// violation nothing is written (kInvalidArgument naming the tensor). The file appears
// atomically (temporary + rename); an I/O failure leaves no partial file (kIoError).
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});
// The same file written into `out` without committing it: a caller that writes several
// outputs commits them only once all were written (both or neither).
Status write_safetensors(io::AtomicFile& out, const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace mlakv
