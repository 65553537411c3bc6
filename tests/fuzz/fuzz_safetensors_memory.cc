// safetensors from memory (SafetensorsFile::open_memory). Invariants: every accepted
// entry lies inside the data region with exactly numel * itemsize bytes, entries do not
// overlap, and every view reads exactly the file's bytes (ASan flags any read outside).
#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "mlakv/safetensors.h"

using namespace mlakv;

namespace mlakv::fuzz {
void check_file(const SafetensorsFile& f, const uint8_t* data, std::size_t size) {
  const uint64_t region = size - f.data_offset();
  MLAKV_FUZZ_CHECK(f.data_offset() >= 8 && f.data_offset() <= size, "");
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const SafetensorsTensorInfo& t : f.tensors()) {
    MLAKV_FUZZ_CHECK(t.begin <= t.end && t.end <= region, t.name);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      MLAKV_FUZZ_CHECK(d >= 0, t.name);
      numel *= static_cast<uint64_t>(d);
    }
    MLAKV_FUZZ_CHECK(numel * dtype_size(t.dtype) == t.nbytes(), t.name);
    const std::optional<TensorView> v = f.find(t.name);
    MLAKV_FUZZ_CHECK(v.has_value() && v->dtype == t.dtype && v->ndim == static_cast<int>(t.shape.size()), t.name);
    MLAKV_FUZZ_CHECK(t.nbytes() == 0 || v->is_contiguous(), t.name);
    if (t.nbytes() != 0) {
      MLAKV_FUZZ_CHECK(reinterpret_cast<std::uintptr_t>(v->data) % dtype_size(t.dtype) == 0, t.name);
      MLAKV_FUZZ_CHECK(std::memcmp(v->data, data + f.data_offset() + t.begin, t.nbytes()) == 0, t.name);
      spans.emplace_back(t.begin, t.end);
    }
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) MLAKV_FUZZ_CHECK(spans[i].first >= spans[i - 1].second, "overlap");
  const std::vector<std::string> names = f.names();
  MLAKV_FUZZ_CHECK(std::is_sorted(names.begin(), names.end()) && names.size() == f.tensors().size(), "");
}
}  // namespace mlakv::fuzz

#ifndef MLAKV_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  auto f = SafetensorsFile::open_memory(data, size, "fuzz");
  if (!f.ok()) {
    fuzz::check_not_internal(f.status());
    return 0;
  }
  fuzz::check_file(**f, data, size);
  return 0;
}
#endif
