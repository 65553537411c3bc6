// model.safetensors.index.json (Checkpoint::open) over two fixed, valid shards.
// Invariants: every visible name resolves to a view in the shard that holds it, and the
// index never reaches a file outside the directory (shard names are plain file names).
#include <filesystem>
#include <vector>

#include "fuzz_common.h"
#include "mlakv/safetensors.h"

using namespace mlakv;

namespace {
const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/ckpt";
    std::filesystem::create_directories(d);
    const float a[2] = {1.0f, 2.0f};
    const int32_t b = 7;
    const uint16_t c[3] = {1, 2, 3};
    if (!write_safetensors(d + "/a.safetensors", {{"x", TensorView::contiguous(a, DType::kF32, {2})},
                                                  {"y", TensorView::contiguous(&b, DType::kI32, {})}})
             .ok() ||
        !write_safetensors(d + "/b.safetensors", {{"z", TensorView::contiguous(c, DType::kBF16, {3})}}).ok()) {
      fuzz::violated("cannot write the fixed shards");
    }
    // A shard outside the directory that a traversal would reach.
    (void)write_safetensors(fuzz::scratch_dir() + "/outside.safetensors",
                            {{"secret", TensorView::contiguous(a, DType::kF32, {2})}});
    return d;
  }();
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string dir = checkpoint_dir();
  fuzz::write_bytes(dir + "/model.safetensors.index.json", data, size);
  auto c = Checkpoint::open(dir);
  if (!c.ok()) {
    fuzz::check_not_internal(c.status());
    return 0;
  }
  MLAKV_FUZZ_CHECK((*c)->num_shards() <= 2, "");
  for (const std::string& n : (*c)->names()) {
    MLAKV_FUZZ_CHECK(n != "secret", "a shard outside the checkpoint directory was read");
    const SafetensorsFile* s = (*c)->shard_of(n);
    MLAKV_FUZZ_CHECK(s != nullptr && s->info(n) != nullptr, n);
    MLAKV_FUZZ_CHECK(std::filesystem::path(s->path()).parent_path() == std::filesystem::path(dir), s->path());
    const std::optional<TensorView> v = (*c)->find(n);
    MLAKV_FUZZ_CHECK(v.has_value() && v->dtype == s->info(n)->dtype, n);
  }
  return 0;
}
