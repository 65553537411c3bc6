// safetensors reader (mmap), sharded checkpoints and writer. See mlakv/safetensors.h
// for the layout and the contracts. Every byte of a file is untrusted: all header
// fields are type-checked, every size and offset computation is overflow-checked,
// and no view is handed out before the whole header has been validated.
#include "mlakv/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>

#include "core/untrusted_json.h"
#include "mlakv/file_io.h"
#include "mlakv/untrusted.h"

namespace mlakv {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct DTypeName {
  std::string_view name;
  DType dtype;
};
constexpr std::array<DTypeName, 11> kDTypeNames = {{
    {"F64", DType::kF64},
    {"F32", DType::kF32},
    {"F16", DType::kF16},
    {"BF16", DType::kBF16},
    {"F8_E4M3", DType::kF8E4M3},
    {"F8_E8M0", DType::kF8E8M0},
    {"U8", DType::kU8},
    {"I8", DType::kI8},
    {"I16", DType::kI16},
    {"I32", DType::kI32},
    {"I64", DType::kI64},
}};
// Valid safetensors dtypes that have no mlakv DType: reported as unsupported rather
// than as corruption.
constexpr std::array<std::string_view, 9> kUnsupportedDTypes = {"BOOL",    "U16",     "U32", "U64", "F8_E5M2",
                                                                "F6_E2M3", "F6_E3M2", "F4",  "C64"};

// Names come from untrusted files: bounded, control characters escaped.
std::string shown(std::string_view s) { return escape_untrusted(s); }

// Parses an untrusted JSON text (core/untrusted_json.h); corruption is kDataLoss.
StatusOr<json> parse_json(std::string_view text, std::string_view source, std::string* duplicate_key) {
  json_util::ParseOptions o;
  o.code = StatusCode::kDataLoss;
  o.duplicate_key = duplicate_key;
  return json_util::parse(text, source, o);
}

// A non-negative JSON integer (nlohmann stores those as number_unsigned).
bool as_u64(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return true;
}

// Validates one header entry. `data_size` is the size of the data region.
Status parse_entry(std::string_view path, const std::string& name, const json& e, uint64_t data_size,
                   SafetensorsTensorInfo& out) {
  const std::string where = fmt::format("{}: tensor '{}'", path, shown(name));
  if (!e.is_object()) return data_loss(fmt::format("{}: entry must be a JSON object, got {}", where, e.type_name()));
  out.name = name;

  const auto dt = e.find("dtype");
  if (dt == e.end()) return data_loss(fmt::format("{}: missing 'dtype'", where));
  if (!dt->is_string()) return data_loss(fmt::format("{}: 'dtype' must be a string, got {}", where, dt->type_name()));
  const std::string& dtype_str = dt->get_ref<const std::string&>();
  const std::optional<DType> dtype = dtype_from_safetensors(dtype_str);
  if (!dtype) {
    const bool known = std::find(kUnsupportedDTypes.begin(), kUnsupportedDTypes.end(), dtype_str) !=
                       kUnsupportedDTypes.end();
    const std::string msg = fmt::format(
        "{}: {} dtype '{}' (supported: F64 F32 F16 BF16 F8_E4M3 F8_E8M0 U8 I8 I16 I32 I64)", where,
        known ? "unsupported" : "unknown", shown(dtype_str));
    return known ? unimplemented(msg) : data_loss(msg);
  }
  out.dtype = *dtype;

  const auto sh = e.find("shape");
  if (sh == e.end()) return data_loss(fmt::format("{}: missing 'shape'", where));
  if (!sh->is_array()) return data_loss(fmt::format("{}: 'shape' must be an array, got {}", where, sh->type_name()));
  if (sh->size() > static_cast<std::size_t>(kMaxTensorDims)) {
    return data_loss(fmt::format("{}: {} dimensions, at most {} supported", where, sh->size(), kMaxTensorDims));
  }
  // numel, and the product with zero extents counted as 1 (the largest stride a view
  // can have): both must fit int64_t so TensorView arithmetic cannot overflow.
  int64_t numel = 1;
  int64_t span = 1;
  out.shape.clear();
  for (std::size_t d = 0; d < sh->size(); ++d) {
    uint64_t extent = 0;
    if (!as_u64((*sh)[d], extent) || extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return data_loss(fmt::format("{}: shape entry {} is {} (must be a non-negative integer)", where, d,
                                   json_util::shown((*sh)[d])));
    }
    const auto x = static_cast<int64_t>(extent);
    if (__builtin_mul_overflow(numel, x, &numel) || __builtin_mul_overflow(span, std::max<int64_t>(x, 1), &span)) {
      return data_loss(fmt::format("{}: shape {} overflows 64-bit element counts", where, json_util::shown(*sh)));
    }
    out.shape.push_back(x);
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(dtype_size(out.dtype)), &nbytes)) {
    return data_loss(fmt::format("{}: shape {} x {} bytes overflows 64 bits", where, json_util::shown(*sh),
                                 dtype_size(out.dtype)));
  }

  const auto off = e.find("data_offsets");
  if (off == e.end()) return data_loss(fmt::format("{}: missing 'data_offsets'", where));
  if (!off->is_array() || off->size() != 2 || !as_u64((*off)[0], out.begin) || !as_u64((*off)[1], out.end)) {
    return data_loss(fmt::format("{}: 'data_offsets' must be [begin, end] with non-negative integers, got {}", where,
                                 json_util::shown(*off)));
  }
  if (out.begin > out.end) {
    return data_loss(fmt::format("{}: data_offsets [{}, {}] has begin > end", where, out.begin, out.end));
  }
  if (out.end > data_size) {
    return data_loss(fmt::format("{}: data_offsets [{}, {}] run past the {}-byte data region", where, out.begin,
                                 out.end, data_size));
  }
  if (out.end - out.begin != nbytes) {
    return data_loss(fmt::format("{}: data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", where, out.begin,
                                 out.end, out.end - out.begin, dtype_str, json_util::shown(*sh), nbytes));
  }
  return Status::Ok();
}

// Rejects byte ranges shared by two non-empty tensors (zero-sized tensors own no bytes).
Status check_overlaps(std::string_view path, const std::vector<SafetensorsTensorInfo>& tensors) {
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(tensors[a].begin, tensors[a].end) < std::pair(tensors[b].begin, tensors[b].end);
  });
  const SafetensorsTensorInfo* reach = nullptr;  // the non-empty tensor ending furthest so far
  for (std::size_t i : order) {
    const SafetensorsTensorInfo& t = tensors[i];
    if (t.nbytes() == 0) continue;
    if (reach != nullptr && t.begin < reach->end) {
      return data_loss(fmt::format("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path, shown(reach->name),
                                   reach->begin, reach->end, shown(t.name), t.begin, t.end));
    }
    if (reach == nullptr || t.end > reach->end) reach = &t;
  }
  return Status::Ok();
}

// The whole file mapped read-only.
struct Mapping {
  void* addr = nullptr;
  uint64_t size = 0;
};

StatusOr<Mapping> map_file(const std::string& path) {
  // Non-blocking open + fstat first: a FIFO or device is refused, never waited on.
  MLAKV_ASSIGN_OR_RETURN(io::OpenedFile f, io::open_regular_file(path));
  const uint64_t size = f.size;
  if (size < 8) {
    ::close(f.fd);
    return data_loss(fmt::format("{}: {} bytes is too short for a safetensors file (an 8-byte header length comes first)",
                                 shown(path), size));
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f.fd, 0);
  const int err = errno;
  ::close(f.fd);  // the mapping keeps the file alive
  if (addr == MAP_FAILED) {
    return io_error(fmt::format("{}: cannot map {} bytes: {}", shown(path), size, std::strerror(err)));
  }
  return Mapping{addr, size};
}

uint64_t load_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

TensorView view_of(const SafetensorsTensorInfo& info, const void* data) {
  TensorView t;
  t.data = const_cast<void*>(data);  // TensorView has no const flavour; the mapping is PROT_READ
  t.dtype = info.dtype;
  t.device = Device::cpu();
  t.ndim = static_cast<int>(info.shape.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    const auto k = static_cast<std::size_t>(d);
    t.shape[k] = info.shape[k];
    t.strides[k] = stride;
    stride *= std::max<int64_t>(info.shape[k], 1);  // bounded by the validated span
  }
  return t;
}

}  // namespace

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  return {};
}

// ---- SafetensorsFile -------------------------------------------------------------

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  if (path.empty()) return invalid_argument("safetensors path is empty");
  try {
    MLAKV_ASSIGN_OR_RETURN(Mapping m, map_file(path));
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = path;
    f->map_ = m.addr;  // owned from here: the destructor unmaps on every error path
    f->map_size_ = m.size;
    MLAKV_RETURN_IF_ERROR(f->parse(static_cast<const uint8_t*>(m.addr)));
    return f;
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("{}: out of memory while reading the header", shown(path)));
  } catch (const std::exception& e) {  // a library invariant: never across the API
    return internal_error(fmt::format("{}: reading the file failed: {}", shown(path), e.what()));
  }
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open_memory(const void* data, std::size_t size,
                                                                         std::string name) {
  if (data == nullptr && size != 0) return invalid_argument(fmt::format("{}: null data", shown(name)));
  if (size < 8) {
    return data_loss(fmt::format(
        "{}: {} bytes is too short for a safetensors file (an 8-byte header length comes first)", shown(name), size));
  }
  try {
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = std::move(name);
    f->owned_ = std::make_unique<uint8_t[]>(size);  // operator new aligns to >= 16
    std::memcpy(f->owned_.get(), data, size);
    f->map_size_ = size;
    MLAKV_RETURN_IF_ERROR(f->parse(f->owned_.get()));
    return f;
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("{}: cannot allocate {} bytes for the file", shown(name), size));
  } catch (const std::exception& e) {
    return internal_error(fmt::format("{}: reading the buffer failed: {}", shown(name), e.what()));
  }
}

Status SafetensorsFile::parse(const uint8_t* bytes) {
  const std::string path = shown(path_);
  const uint64_t map_size = map_size_;
  SafetensorsFile* f = this;
  const uint64_t n = load_u64_le(bytes);
  if (n > kMaxSafetensorsHeaderBytes) {
    return data_loss(fmt::format("{}: header length {} exceeds the {}-byte limit", path, n,
                                 kMaxSafetensorsHeaderBytes));
  }
  if (n > map_size - 8) {
    return data_loss(fmt::format("{}: header length {} exceeds the {} bytes that follow it", path, n, map_size - 8));
  }
  f->data_offset_ = 8 + n;
  const uint64_t data_size = map_size - f->data_offset_;

  std::string duplicate;
  MLAKV_ASSIGN_OR_RETURN(
      json header, parse_json(std::string_view(reinterpret_cast<const char*>(bytes + 8), n), path, &duplicate));
  if (!duplicate.empty()) {
    return data_loss(fmt::format("{}: header names '{}' twice", path, shown(duplicate)));
  }

  // nlohmann objects iterate in key order, so tensors_ comes out sorted by name.
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object()) {
        return data_loss(fmt::format("{}: '__metadata__' must be an object, got {}", path, value.type_name()));
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return data_loss(fmt::format("{}: __metadata__ value of '{}' must be a string, got {}", path, shown(mk),
                                       mv.type_name()));
        }
        f->metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    SafetensorsTensorInfo info;
    MLAKV_RETURN_IF_ERROR(parse_entry(path, key, value, data_size, info));
    f->tensors_.push_back(std::move(info));
  }
  MLAKV_RETURN_IF_ERROR(check_overlaps(path, f->tensors_));

  // Views must be aligned to their element size; a file may place an f32 tensor at an
  // odd offset (after a u8 tensor of odd length), so such tensors get an aligned copy.
  f->data_.reserve(f->tensors_.size());
  for (const SafetensorsTensorInfo& t : f->tensors_) {
    const uint8_t* p = bytes + f->data_offset_ + t.begin;
    if (t.nbytes() != 0 && reinterpret_cast<std::uintptr_t>(p) % dtype_size(t.dtype) != 0) {
      auto copy = std::make_unique<uint8_t[]>(t.nbytes());  // operator new aligns to >= 16
      std::memcpy(copy.get(), p, t.nbytes());
      p = copy.get();
      f->copies_.push_back(std::move(copy));
    }
    f->data_.push_back(p);
  }
  return Status::Ok();
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);  // open_memory() files own `owned_` instead
}

std::size_t SafetensorsFile::index_of(std::string_view name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                   [](const SafetensorsTensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return tensors_.size();
  return static_cast<std::size_t>(it - tensors_.begin());
}

const SafetensorsTensorInfo* SafetensorsFile::info(std::string_view name) const {
  const std::size_t i = index_of(name);
  return i < tensors_.size() ? &tensors_[i] : nullptr;
}

std::optional<TensorView> SafetensorsFile::find(std::string_view name) const {
  const std::size_t i = index_of(name);
  if (i >= tensors_.size()) return std::nullopt;
  return view_of(tensors_[i], data_[i]);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const SafetensorsTensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

// ---- Checkpoint --------------------------------------------------------------------

namespace {

// Shard names must be plain file names inside the checkpoint directory.
Status check_shard_name(std::string_view index, std::string_view tensor, std::string_view shard) {
  const bool bad = shard.empty() || shard == "." || shard.find('/') != std::string_view::npos ||
                   shard.find('\\') != std::string_view::npos || shard.find("..") != std::string_view::npos ||
                   shard.find('\0') != std::string_view::npos;
  if (bad) {
    return data_loss(fmt::format(
        "{}: tensor '{}' maps to shard '{}': shard names must be plain file names (no '/', '\\' or '..')", index,
        shown(tensor), shown(shard)));
  }
  return Status::Ok();
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

}  // namespace

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir_or_file) {
  try {
    return open_unguarded(dir_or_file);
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("{}: out of memory while opening the checkpoint", shown(dir_or_file)));
  } catch (const std::exception& e) {  // a library invariant: never across the API
    return internal_error(fmt::format("{}: opening the checkpoint failed: {}", shown(dir_or_file), e.what()));
  }
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::open_unguarded(const std::string& dir_or_file) {
  if (dir_or_file.empty()) return invalid_argument("checkpoint path is empty");
  const fs::path root(dir_or_file);
  std::error_code ec;
  const fs::file_status st = fs::status(root, ec);
  if (ec || !fs::exists(st)) return not_found(fmt::format("{}: no such file or directory", dir_or_file));

  fs::path index_path;
  fs::path single_path;
  fs::path dir;
  if (fs::is_directory(st)) {
    dir = root;
    if (path_exists(root / "model.safetensors.index.json")) {
      index_path = root / "model.safetensors.index.json";
    } else if (path_exists(root / "model.safetensors")) {
      single_path = root / "model.safetensors";
    } else {
      return not_found(fmt::format("{}: holds neither model.safetensors.index.json nor model.safetensors", dir_or_file));
    }
  } else if (std::string_view(dir_or_file).ends_with(".index.json")) {
    index_path = root;
    dir = root.parent_path();
  } else {
    single_path = root;
  }

  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->root_ = dir_or_file;
  if (!single_path.empty()) {
    MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::open(single_path.string()));
    c->metadata_ = f->metadata();
    for (const SafetensorsTensorInfo& t : f->tensors()) c->where_.emplace(t.name, f.get());
    c->shards_.push_back(std::move(f));
    return c;
  }

  c->indexed_ = true;
  const std::string index = index_path.string();
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> text, io::read_file(index, io::kMaxIndexBytes));
  MLAKV_ASSIGN_OR_RETURN(
      json j, parse_json(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()), index, nullptr));

  if (const auto meta = j.find("metadata"); meta != j.end() && !meta->is_null()) {
    if (!meta->is_object()) {
      return data_loss(fmt::format("{}: 'metadata' must be an object, got {}", index, meta->type_name()));
    }
    for (const auto& [k, v] : meta->items()) c->metadata_.emplace(k, v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  const auto wm = j.find("weight_map");
  if (wm == j.end()) return data_loss(fmt::format("{}: missing 'weight_map'", index));
  if (!wm->is_object()) {
    return data_loss(fmt::format("{}: 'weight_map' must be an object, got {}", index, wm->type_name()));
  }

  // Shard file -> the first tensor the index maps to it (named when the shard is missing).
  std::map<std::string, std::string> shard_example;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      return data_loss(fmt::format("{}: weight_map value of '{}' must be a shard file name, got {}", index,
                                   shown(tensor), shard.type_name()));
    }
    const std::string& name = shard.get_ref<const std::string&>();
    MLAKV_RETURN_IF_ERROR(check_shard_name(index, tensor, name));
    shard_example.emplace(name, tensor);
  }

  std::map<std::string, const SafetensorsFile*> by_name;
  for (const auto& [shard, example] : shard_example) {
    const std::string shard_path = (dir / shard).string();
    StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::open(shard_path);
    if (!f.ok()) {
      if (f.status().code() == StatusCode::kNotFound) {
        return not_found(fmt::format("{}: shard '{}' (holding tensor '{}') is missing: {}", index, shown(shard),
                                     shown(example), shown(shard_path)));
      }
      return f.status().with_context(fmt::format("{}: shard '{}'", index, shown(shard)));
    }
    by_name.emplace(shard, f->get());
    c->shards_.push_back(std::move(f).value());
  }
  for (const auto& [tensor, shard] : wm->items()) {
    const SafetensorsFile* f = by_name.at(shard.get_ref<const std::string&>());
    if (f->info(tensor) == nullptr) {
      return data_loss(fmt::format("{}: tensor '{}' is mapped to shard '{}', which does not contain it", index,
                                   shown(tensor), shown(shard.get_ref<const std::string&>())));
    }
    c->where_.emplace(tensor, f);
  }
  return c;
}

std::optional<TensorView> Checkpoint::find(std::string_view name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) return std::nullopt;
  return it->second->find(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

std::string Checkpoint::describe() const {
  if (!indexed_) return fmt::format("checkpoint {}", shards_.empty() ? root_ : shards_.front()->path());
  return fmt::format("checkpoint {} ({} shard{})", root_, shards_.size(), shards_.size() == 1 ? "" : "s");
}

const SafetensorsFile* Checkpoint::shard_of(std::string_view name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second;
}

// ---- writer --------------------------------------------------------------------------

Status write_safetensors(io::AtomicFile& out, const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  const std::string path = shown(out.path());
  json header = json::object();
  std::vector<uint64_t> sizes;
  sizes.reserve(tensors.size());
  uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    const std::string where = fmt::format("write_safetensors {}: tensor {} '{}'", path, i, shown(name));
    if (name.empty()) return invalid_argument(fmt::format("{}: empty name", where));
    if (name == "__metadata__") return invalid_argument(fmt::format("{}: the name is reserved", where));
    if (header.contains(name)) return invalid_argument(fmt::format("{}: duplicate name", where));
    if (t.device.type != DeviceType::kCpu) {
      return invalid_argument(fmt::format("{}: must be on the cpu, got {}", where, device_name(t.device)));
    }
    if (t.ndim < 0 || t.ndim > kMaxTensorDims) {
      return invalid_argument(fmt::format("{}: ndim {} outside [0, {}]", where, t.ndim, kMaxTensorDims));
    }
    const std::string_view dtype = safetensors_dtype_name(t.dtype);
    if (dtype.empty()) return invalid_argument(fmt::format("{}: dtype id {} has no safetensors name", where,
                                                           static_cast<int>(t.dtype)));
    uint64_t numel = 1;
    std::vector<int64_t> shape;
    for (int d = 0; d < t.ndim; ++d) {
      if (t.size(d) < 0) return invalid_argument(fmt::format("{}: negative extent in shape {}", where, t.shape_string()));
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(t.size(d)), &numel)) {
        return invalid_argument(fmt::format("{}: shape {} overflows", where, t.shape_string()));
      }
      shape.push_back(t.size(d));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &nbytes) ||
        __builtin_add_overflow(offset, nbytes, &offset)) {
      return invalid_argument(fmt::format("{}: shape {} overflows the file size", where, t.shape_string()));
    }
    if (nbytes != 0 && !t.is_contiguous()) {
      return invalid_argument(fmt::format("{}: must be contiguous (shape {})", where, t.shape_string()));
    }
    if (nbytes != 0 && t.data == nullptr) return invalid_argument(fmt::format("{}: null data pointer", where));
    header[name] = json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset - nbytes, offset}}};
    sizes.push_back(nbytes);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string text;
  try {
    text = header.dump();  // throws on names that are not valid UTF-8
  } catch (const std::exception& e) {
    return invalid_argument(fmt::format("write_safetensors {}: cannot encode the header: {}", path, e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  if (text.size() > kMaxSafetensorsHeaderBytes) {
    return invalid_argument(fmt::format("write_safetensors {}: header of {} bytes exceeds the {}-byte limit", path,
                                        text.size(), kMaxSafetensorsHeaderBytes));
  }

  // Streamed (no second copy of the tensors in memory) into the caller's temporary.
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  MLAKV_RETURN_IF_ERROR(out.write(len, 8));
  MLAKV_RETURN_IF_ERROR(out.write(text.data(), text.size()));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (sizes[i] != 0) MLAKV_RETURN_IF_ERROR(out.write(tensors[i].second.data, sizes[i]));
  }
  return Status::Ok();
}

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  if (path.empty()) return invalid_argument("write_safetensors: path is empty");
  try {
    MLAKV_ASSIGN_OR_RETURN(io::AtomicFile f, io::AtomicFile::create(path));
    MLAKV_RETURN_IF_ERROR(write_safetensors(f, tensors, metadata));
    return f.commit();
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("write_safetensors {}: out of memory building the header", shown(path)));
  }
}

}  // namespace mlakv
