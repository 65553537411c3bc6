// safetensors from a file (mmap path), plus the round trip: every accepted file,
// rewritten by write_safetensors, reopens with the same names, dtypes, shapes, bytes
// and metadata.
#define MLAKV_FUZZ_NO_MAIN
#include "fuzz_safetensors_memory.cc"
#undef MLAKV_FUZZ_NO_MAIN

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string in = fuzz::scratch_dir() + "/in.safetensors";
  const std::string out = fuzz::scratch_dir() + "/out.safetensors";
  fuzz::write_bytes(in, data, size);
  auto f = SafetensorsFile::open(in);
  if (!f.ok()) {
    fuzz::check_not_internal(f.status());
    return 0;
  }
  fuzz::check_file(**f, data, size);
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& n : (*f)->names()) tensors.emplace_back(n, *(*f)->find(n));
  const Status w = write_safetensors(out, tensors, (*f)->metadata());
  if (!w.ok()) {  // names that are not valid UTF-8 cannot be written back as JSON
    MLAKV_FUZZ_CHECK(w.code() == StatusCode::kInvalidArgument, w.to_string());
    return 0;
  }
  auto g = SafetensorsFile::open(out);
  MLAKV_FUZZ_CHECK(g.ok(), g.status().to_string());
  MLAKV_FUZZ_CHECK((*g)->names() == (*f)->names() && (*g)->metadata() == (*f)->metadata(), "");
  for (const SafetensorsTensorInfo& t : (*f)->tensors()) {
    const SafetensorsTensorInfo* u = (*g)->info(t.name);
    MLAKV_FUZZ_CHECK(u != nullptr && u->dtype == t.dtype && u->shape == t.shape && u->nbytes() == t.nbytes(), t.name);
    if (t.nbytes() != 0) {
      MLAKV_FUZZ_CHECK(std::memcmp((*g)->find(t.name)->data, (*f)->find(t.name)->data, t.nbytes()) == 0, t.name);
    }
  }
  return 0;
}
