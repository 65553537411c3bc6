#include "mlakv/reparam.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "mlakv/hf_config.h"
#include "mlakv/numerics.h"
#include "mlakv/safetensors.h"

namespace mlakv {
namespace {

namespace fs = std::filesystem;

bool power_of_two(double a) {
  int e = 0;
  return std::frexp(a, &e) == 0.5;
}

float load(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.ptr<const float>()[i];
    case DType::kBF16: return bf16_to_f32(t.ptr<const uint16_t>()[i]);
    default: return NAN;
  }
}

}  // namespace

Status reparametrize_latent_scale(const std::string& src_dir, const std::string& dst_dir, std::span<const double> a) {
  std::error_code ec;
  if (fs::exists(dst_dir, ec)) return invalid_argument(fmt::format("{}: exists (reparam writes a new directory)", dst_dir));
  MLAKV_ASSIGN_OR_RETURN(ModelConfig cfg, load_hf_config((fs::path(src_dir) / "config.json").string()));
  if (static_cast<int>(a.size()) != cfg.num_layers) {
    return invalid_argument(fmt::format("{} latent factors for {} decoder layers", a.size(), cfg.num_layers));
  }
  bool exact = true;
  for (std::size_t l = 0; l < a.size(); ++l) {
    if (!std::isfinite(a[l]) || !(a[l] > 0)) {
      return invalid_argument(fmt::format("latent factor of layer {} must be finite and > 0, got {}", l, a[l]));
    }
    exact &= power_of_two(a[l]);
  }
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ck, Checkpoint::open(src_dir));
  // Owned buffers for the rewritten tensors; the others are written from the mapping.
  std::vector<std::vector<uint16_t>> u16;
  std::vector<std::vector<float>> f32;
  std::vector<std::pair<std::string, TensorView>> out;
  int rewritten = 0;
  for (const std::string& name : ck->names()) {
    const TensorView t = *ck->find(name);
    int layer = -1;
    std::string which;
    for (int l = 0; l < cfg.num_layers && layer < 0; ++l) {
      const std::string p = fmt::format("model.layers.{}.self_attn.", l);
      if (name == p + "kv_a_layernorm.weight") layer = l, which = "norm";
      else if (name == p + "kv_b_proj.weight") layer = l, which = "kv_b";
      else if (name.rfind(p + "kv_b_proj.", 0) == 0 && name != p + "kv_b_proj.bias") {
        return unimplemented(fmt::format("{}: a quantized kv_b_proj cannot be reparametrized (dense weights only)",
                                         name));
      }
    }
    if (layer < 0) {
      out.emplace_back(name, t);
      continue;
    }
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
      return unimplemented(fmt::format("{}: dtype {} (f32 or bf16 expected)", name, dtype_name(t.dtype)));
    }
    const double f = which == "norm" ? a[static_cast<std::size_t>(layer)] : 1.0 / a[static_cast<std::size_t>(layer)];
    const int64_t n = t.numel();
    TensorView v = t;
    if (exact && t.dtype == DType::kBF16) {
      u16.emplace_back(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) u16.back()[static_cast<std::size_t>(i)] = f32_to_bf16(static_cast<float>(load(t, i) * f));
      v.data = u16.back().data();
    } else {
      f32.emplace_back(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) f32.back()[static_cast<std::size_t>(i)] = static_cast<float>(load(t, i) * f);
      v.data = f32.back().data();
      v.dtype = DType::kF32;
    }
    for (int d = v.ndim - 1, s = 1; d >= 0; --d) {
      v.strides[static_cast<std::size_t>(d)] = s;
      s *= static_cast<int>(v.shape[static_cast<std::size_t>(d)]);
    }
    out.emplace_back(name, v);
    ++rewritten;
  }
  if (rewritten != 2 * cfg.num_layers) {
    return not_found(fmt::format("{}: found {} of the {} kv_a_layernorm / kv_b_proj weights to rewrite", src_dir,
                                 rewritten, 2 * cfg.num_layers));
  }
  // Build in a sibling temporary directory, then rename: no partial output directory.
  std::random_device rd;
  const fs::path tmp = fs::path(dst_dir).parent_path() /
                       fmt::format(".{}.tmp-{:x}", fs::path(dst_dir).filename().string(), rd());
  fs::create_directories(tmp, ec);
  if (ec) return io_error(fmt::format("{}: {}", tmp.string(), ec.message()));
  auto fail = [&](Status s) {
    fs::remove_all(tmp, ec);
    return s;
  };
  std::map<std::string, std::string> meta = {{"mlakv_reparam", "kv_a_layernorm.weight *= a_l, kv_b_proj.weight /= a_l"}};
  std::string factors;
  for (double x : a) factors += fmt::format("{}{}", factors.empty() ? "" : ",", x);
  meta["mlakv_reparam_factors"] = factors;
  if (Status s = write_safetensors((tmp / "model.safetensors").string(), out, meta); !s.ok()) return fail(s);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    const fs::path p = fs::path(src_dir) / f;
    if (!fs::exists(p)) continue;
    fs::copy_file(p, tmp / f, ec);
    if (ec) return fail(io_error(fmt::format("copying {}: {}", p.string(), ec.message())));
  }
  fs::rename(tmp, dst_dir, ec);
  if (ec) return fail(io_error(fmt::format("{}: {}", dst_dir, ec.message())));
  return Status::Ok();
}

}  // namespace mlakv
