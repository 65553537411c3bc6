// mlakv codec encode|decode|stats: float rows <-> KV records in a self-describing record
// file (docs/formats.md "Record files"), and each format's round-trip error per part.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <span>

#include "cli/cli.h"
#include "mlakv/file_io.h"
#include "mlakv/codec.h"
#include "mlakv/safetensors.h"

namespace mlakv::cli {
namespace {

struct CodecArgs {
  std::string format;
  std::optional<float> outer_scale;
  std::optional<std::string> fp8_scales;
  bool token_scale = false;  // nvfp4 per-token scale mode
  std::string nvfp4_scales = "rn";  // encode / stats: the nvfp4 group-scale choice
  std::string in, out;
  std::string in_dtype = "f32";  // raw input files
  std::string tensor;            // safetensors input
  bool raw = false;
  bool json = false;
};

StatusOr<Fp8ScaleMode> parse_fp8_scales(const std::string& s) {
  if (s == "pow2") return Fp8ScaleMode::kPow2;
  if (s == "exact") return Fp8ScaleMode::kExact;
  return invalid_argument(fmt::format("--fp8-scales: expected pow2 or exact, got '{}'", s));
}

StatusOr<CodecParams> to_params(const std::string& format, const CodecArgs& a) {
  CodecParams p;
  auto f = parse_format(format);
  if (!f) return invalid_argument(fmt::format("--format: unknown format '{}' (see 'mlakv formats')", format));
  p.format = *f;
  p.outer_scale = a.outer_scale.value_or(1.0f);
  if (a.fp8_scales) {
    MLAKV_ASSIGN_OR_RETURN(p.fp8_scales, parse_fp8_scales(*a.fp8_scales));
    if (p.format != KvFormat::kFp8DsMla) {
      return invalid_argument(fmt::format("--fp8-scales applies to fp8_ds_mla's tile scales only; {} has none",
                                          format_name(p.format)));
    }
  }
  p.token_scale = a.token_scale;
  MLAKV_ASSIGN_OR_RETURN(p.nvfp4_scales, parse_nvfp4_scale_mode(a.nvfp4_scales, "--nvfp4-scales"));
  MLAKV_RETURN_IF_ERROR(
      codec_record_bytes(p).status().with_context("--format/--outer-scale/--token-scale/--nvfp4-scales"));
  return p;
}

// ---- input rows: raw f32/bf16, .npy, .safetensors ---------------------------------------

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// [n, 576] (or [1, n, 576]) shape check shared by the container readers.
StatusOr<int64_t> rows_of(const std::vector<int64_t>& shape, const std::string& what) {
  const bool ok = (shape.size() == 2 && shape[1] == kQkDim) || (shape.size() == 3 && shape[0] == 1 && shape[2] == kQkDim);
  if (!ok) {
    std::string s;
    for (int64_t d : shape) s += fmt::format("{}{}", s.empty() ? "" : ", ", d);
    return invalid_argument(fmt::format("{}: shape [{}] must be [n, {}] or [1, n, {}] (512 latent, then 64 rope)",
                                        what, s, kQkDim, kQkDim));
  }
  return shape[shape.size() - 2];
}

void widen(const uint8_t* src, DType dt, std::size_t count, float* dst) {
  for (std::size_t i = 0; i < count; ++i) {
    if (dt == DType::kF32) {
      std::memcpy(dst + i, src + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = dt == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
}

// NumPy .npy (format 1.0-3.0): little-endian <f4 or <f2, C order.
StatusOr<std::vector<float>> read_npy(const std::string& path, const std::vector<uint8_t>& b) {
  static constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (b.size() < 10 || std::memcmp(b.data(), kMagic, 6) != 0) {
    return invalid_argument(fmt::format("{}: not a .npy file (no \\x93NUMPY magic)", path));
  }
  const int major = b[6];
  std::size_t hlen = 0, start = 0;
  if (major == 1) {
    hlen = static_cast<std::size_t>(b[8]) | (static_cast<std::size_t>(b[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) return invalid_argument(fmt::format("{}: truncated .npy header", path));
    hlen = static_cast<std::size_t>(b[8]) | (static_cast<std::size_t>(b[9]) << 8) |
           (static_cast<std::size_t>(b[10]) << 16) | (static_cast<std::size_t>(b[11]) << 24);
    start = 12;
  } else {
    return invalid_argument(fmt::format("{}: .npy version {} is not 1, 2 or 3", path, major));
  }
  if (start + hlen > b.size()) return invalid_argument(fmt::format("{}: truncated .npy header", path));
  const std::string h(reinterpret_cast<const char*>(b.data() + start), hlen);
  auto value_of = [&](const std::string& key) -> std::string {
    const std::size_t k = h.find("'" + key + "'");
    if (k == std::string::npos) return {};
    std::size_t v = h.find(':', k);
    if (v == std::string::npos) return {};
    ++v;
    while (v < h.size() && h[v] == ' ') ++v;
    std::size_t e = v;
    if (v < h.size() && h[v] == '(') {
      e = h.find(')', v);
      return e == std::string::npos ? std::string() : h.substr(v, e - v + 1);
    }
    while (e < h.size() && h[e] != ',' && h[e] != '}') ++e;
    return h.substr(v, e - v);
  };
  const std::string descr = value_of("descr"), order = value_of("fortran_order"), shape_s = value_of("shape");
  DType dt;
  if (descr == "'<f4'") {
    dt = DType::kF32;
  } else if (descr == "'<f2'") {
    dt = DType::kF16;
  } else {
    return invalid_argument(fmt::format("{}: .npy dtype {} (want '<f4' float32 or '<f2' float16)", path,
                                        descr.empty() ? "missing" : descr));
  }
  if (order != "False") return invalid_argument(fmt::format("{}: .npy must be C order (fortran_order False)", path));
  std::vector<int64_t> shape;
  for (std::size_t i = 0; i < shape_s.size();) {
    if (shape_s[i] >= '0' && shape_s[i] <= '9') {
      std::size_t j = i;
      while (j < shape_s.size() && shape_s[j] >= '0' && shape_s[j] <= '9') ++j;
      if (j - i > 15) return invalid_argument(fmt::format("{}: .npy shape {} is too large", path, shape_s));
      shape.push_back(std::stoll(shape_s.substr(i, j - i)));
      i = j;
    } else {
      ++i;
    }
  }
  MLAKV_ASSIGN_OR_RETURN(const int64_t n, rows_of(shape, path));
  const std::size_t es = dt == DType::kF32 ? 4 : 2, count = static_cast<std::size_t>(n) * kQkDim;
  const std::size_t data = start + hlen;
  if (b.size() - data != count * es) {
    return invalid_argument(fmt::format("{}: .npy holds {} B of data, its shape needs {} B", path, b.size() - data,
                                        count * es));
  }
  std::vector<float> rows(count);
  widen(b.data() + data, dt, count, rows.data());
  return rows;
}

StatusOr<std::vector<float>> read_rows(const CodecArgs& a) {
  if (ends_with(a.in, ".safetensors")) {
    MLAKV_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(a.in));
    std::string name = a.tensor;
    if (name.empty()) {
      if (f->tensors().size() != 1) {
        return invalid_argument(fmt::format("{}: holds {} tensors; name the [n, 576] one with --tensor", a.in,
                                            f->tensors().size()));
      }
      name = f->tensors()[0].name;
    }
    const std::optional<TensorView> t = f->find(name);
    if (!t) return not_found(fmt::format("{}: no tensor '{}'", a.in, name));
    if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
      return invalid_argument(fmt::format("{}: tensor '{}' is {} (want f32, bf16 or f16)", a.in, name,
                                          dtype_name(t->dtype)));
    }
    const std::vector<int64_t> shape(t->shape.begin(), t->shape.begin() + t->ndim);
    MLAKV_ASSIGN_OR_RETURN(const int64_t n, rows_of(shape, a.in + ": tensor '" + name + "'"));
    std::vector<float> rows(static_cast<std::size_t>(n) * kQkDim);
    widen(static_cast<const uint8_t*>(t->data), t->dtype, rows.size(), rows.data());
    return rows;
  }
  if (!a.tensor.empty()) return invalid_argument("--tensor: only for a .safetensors --in");
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> in, io::read_file(a.in, io::kMaxRawInputBytes));
  if (ends_with(a.in, ".npy")) return read_npy(a.in, in);
  DType dt;
  if (a.in_dtype == "f32") {
    dt = DType::kF32;
  } else if (a.in_dtype == "bf16") {
    dt = DType::kBF16;
  } else if (a.in_dtype == "f16") {
    dt = DType::kF16;
  } else {
    return invalid_argument(fmt::format("--in-dtype: expected f32, bf16 or f16, got '{}'", a.in_dtype));
  }
  const std::size_t es = dt == DType::kF32 ? 4 : 2, row_bytes = es * kQkDim;
  if (in.size() % row_bytes != 0) {
    return invalid_argument(fmt::format("{}: size {} B is not a whole number of rows of {} {} ({} B); {} B left over",
                                        a.in, in.size(), kQkDim, a.in_dtype, row_bytes, in.size() % row_bytes));
  }
  std::vector<float> rows(in.size() / es);
  widen(in.data(), dt, rows.size(), rows.data());
  return rows;
}

struct RowViews {
  TensorView latent, rope;
};
RowViews views(float* rows, int64_t n) {
  RowViews v{TensorView::contiguous(rows, DType::kF32, {n, kLatentDim}),
             TensorView::contiguous(rows + kLatentDim, DType::kF32, {n, kRopeDim})};
  v.latent.strides[0] = kQkDim;
  v.rope.strides[0] = kQkDim;
  return v;
}

// Encodes rows, warning (stderr) when nvfp4 group scales fall into subnormals.
StatusOr<std::vector<uint8_t>> encode(const CodecParams& p, std::vector<float>& rows, const std::string& what,
                                      bool warn) {
  const int64_t n = static_cast<int64_t>(rows.size() / kQkDim);
  const int rb = record_bytes(p.format);
  std::vector<uint8_t> out(static_cast<std::size_t>(n) * rb);
  const RowViews v = views(rows.data(), n);
  MLAKV_RETURN_IF_ERROR(
      encode_records(p, v.latent, v.rope, TensorView::contiguous(out.data(), DType::kU8, {n, rb})).with_context(what));
  if (warn && format_info(p.format).has_outer_scale && !p.token_scale && n > 0) {
    MLAKV_ASSIGN_OR_RETURN(Nvfp4ScaleCheck c, nvfp4_scale_check(v.latent, p.outer_scale));
    const std::string w = nvfp4_scale_warning(p.format, c, p.outer_scale);
    if (!w.empty()) std::fprintf(stderr, "warning: %s: %s\n", what.c_str(), w.c_str());
  }
  return out;
}

Status write_rows(const std::string& path, const std::vector<float>& rows, int64_t n) {
  if (!ends_with(path, ".npy")) return io::write_file(path, rows.data(), rows.size() * sizeof(float));
  std::string h = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", n, kQkDim);
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(h.size() & 0xFF),
                            static_cast<uint8_t>(h.size() >> 8)};
  b.insert(b.end(), h.begin(), h.end());
  const auto* d = reinterpret_cast<const uint8_t*>(rows.data());
  b.insert(b.end(), d, d + rows.size() * sizeof(float));
  return io::write_file(path, b.data(), b.size());
}

Status run_encode(const CodecArgs& a) {
  MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.out, "--out", a.in, "--in"));
  MLAKV_ASSIGN_OR_RETURN(CodecParams p, to_params(a.format, a));
  MLAKV_ASSIGN_OR_RETURN(std::vector<float> rows, read_rows(a));
  const int64_t n = static_cast<int64_t>(rows.size() / kQkDim);
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> recs, encode(p, rows, a.in, true));
  std::vector<uint8_t> out;
  if (!a.raw) {
    MLAKV_ASSIGN_OR_RETURN(out, record_file_header(p, n));
  }
  out.insert(out.end(), recs.begin(), recs.end());
  MLAKV_RETURN_IF_ERROR(io::write_file(a.out, out.data(), out.size()));
  const int rb = record_bytes(p.format);
  if (a.json) {
    print_json({{"format", a.format}, {"outer_scale", p.outer_scale}, {"token_scale", p.token_scale},
                {"nvfp4_scales", std::string(nvfp4_scale_mode_name(p.nvfp4_scales))}, {"tokens", n},
                {"record_bytes", rb}, {"in_bytes", rows.size() * sizeof(float)}, {"out_bytes", out.size()}, {"raw", a.raw}, {"out", a.out}});
  } else {
    fmt::print("encoded {} tokens -> {} B {}{}{} ({} B per record{})\n", n, out.size(), a.format,
               p.token_scale ? " (token-scale mode)" : "",
               p.nvfp4_scales == Nvfp4ScaleMode::kSearch ? " (nvfp4 scale search)" : "", rb,
               a.raw ? ", raw: no header" : ", 64 B header");
  }
  return Status::Ok();
}

Status run_decode(const CodecArgs& a) {
  MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.out, "--out", a.in, "--in"));
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> in, io::read_file(a.in, io::kMaxRawInputBytes));
  CodecParams p;
  std::size_t offset = 0;
  int64_t n = 0;
  if (a.raw) {
    if (a.format.empty()) return invalid_argument("--raw: give --format (and --outer-scale for nvfp4 records)");
    MLAKV_ASSIGN_OR_RETURN(p, to_params(a.format, a));
    const std::size_t rb = static_cast<std::size_t>(record_bytes(p.format));
    if (in.size() % rb != 0) {
      return invalid_argument(fmt::format("{}: size {} B is not a whole number of {} records ({} B); {} B left over",
                                          a.in, in.size(), a.format, rb, in.size() % rb));
    }
    n = static_cast<int64_t>(in.size() / rb);
  } else {
    if (!is_record_file(in)) {
      return invalid_argument(fmt::format(
          "{}: not an mlakv record file (no MLAKVREC header); raw records need --raw --format F [--outer-scale s]",
          a.in));
    }
    MLAKV_ASSIGN_OR_RETURN(RecordFileInfo info, parse_record_file(in, a.in));
    p = info.params;
    n = info.tokens;
    offset = static_cast<std::size_t>(info.data_offset);
    // The header is the truth; options that contradict it are refused, not obeyed.
    if (!a.format.empty() && parse_format(a.format) != p.format) {
      return invalid_argument(fmt::format("--format {}: {} holds {} records", a.format, a.in, format_name(p.format)));
    }
    if (a.outer_scale && *a.outer_scale != p.outer_scale) {
      return invalid_argument(fmt::format("--outer-scale {}: {} was written with outer scale {}", *a.outer_scale, a.in,
                                          p.outer_scale));
    }
    if (a.token_scale && !p.token_scale) {
      return invalid_argument(fmt::format("--token-scale: {} was written without the token-scale mode", a.in));
    }
  }
  const int rb = record_bytes(p.format);
  std::vector<float> rows(static_cast<std::size_t>(n) * kQkDim);
  const RowViews v = views(rows.data(), n);
  const TensorView recs = TensorView::contiguous(in.data() + offset, DType::kU8, {n, rb});
  MLAKV_RETURN_IF_ERROR(decode_records(p, recs, v.latent, v.rope).with_context(a.in));
  MLAKV_RETURN_IF_ERROR(write_rows(a.out, rows, n));
  const std::string fname(format_name(p.format));
  if (a.json) {
    print_json({{"format", fname}, {"outer_scale", p.outer_scale}, {"token_scale", p.token_scale}, {"tokens", n},
                {"record_bytes", rb}, {"in_bytes", in.size()}, {"out_bytes", rows.size() * sizeof(float)}, {"out", a.out}});
  } else {
    fmt::print("decoded {} {} records ({}) -> float32 [{}, {}]\n", n, fname,
               p.token_scale ? std::string("token-scale mode") : fmt::format("outer scale {}", p.outer_scale), n, kQkDim);
  }
  return Status::Ok();
}

// ---- stats: round-trip error per part ------------------------------------------------------

struct PartError {
  double rel_l2 = 0, max_abs = 0;
};
struct ScaleError {
  std::string what;  // "32 e4m3 group scales", ...
  int64_t count = 0;
  int64_t groups = 0, subnormal = 0;  // nvfp4 group scales, and those below e4m3's 2^-6
  double mean_rel = 0, max_rel = 0;  // |stored - exact| / exact
};
struct FormatStats {
  KvFormat format;
  PartError latent, rope;
  ScaleError scales;
};

PartError part_error(const std::vector<float>& ref, const std::vector<float>& got, int begin, int width) {
  double num = 0, den = 0, mx = 0;
  for (std::size_t t = 0; t < ref.size() / kQkDim; ++t) {
    for (int d = begin; d < begin + width; ++d) {
      const std::size_t i = t * kQkDim + static_cast<std::size_t>(d);
      const double e = static_cast<double>(got[i]) - ref[i];
      num += e * e;
      den += static_cast<double>(ref[i]) * ref[i];
      mx = std::max(mx, std::fabs(e));
    }
  }
  return {den > 0 ? std::sqrt(num / den) : std::sqrt(num), mx};
}

ScaleError scale_error(const CodecParams& p, const std::vector<float>& rows, const std::vector<uint8_t>& recs) {
  ScaleError s;
  const int rb = record_bytes(p.format);
  const int64_t n = static_cast<int64_t>(rows.size() / kQkDim);
  double sum = 0;
  auto add = [&](double exact, double stored) {
    if (exact <= 0) return;
    const double r = std::fabs(stored - exact) / exact;
    ++s.count;
    sum += r;
    s.max_rel = std::max(s.max_rel, r);
  };
  auto amax = [&](int64_t t, int begin, int width, double div) {
    double m = 0;
    for (int d = begin; d < begin + width; ++d) m = std::max(m, std::fabs(static_cast<double>(rows[static_cast<std::size_t>(t * kQkDim + d)])));
    return m / div;
  };
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* r = recs.data() + t * rb;
    switch (p.format) {
      case KvFormat::kBf16:
      case KvFormat::kF32: break;
      case KvFormat::kFp8DsMla: {
        namespace F = layout::fp8_ds_mla;
        s.what = fmt::format("{} fp32 tile scales vs amax/448", F::kNumTiles);
        for (int k = 0; k < F::kNumTiles; ++k) {
          float v;
          std::memcpy(&v, r + F::kScaleOffset + 4 * k, 4);
          add(amax(t, k * F::kTileDim, F::kTileDim, kE4m3Max), v);
        }
        break;
      }
      case KvFormat::kNvfp4DsMla:
      case KvFormat::kNvfp4DsMlaFp8Rope:
      case KvFormat::kNvfp4DsMlaInt8Rope: {
        namespace N = layout::nvfp4_ds_mla;
        // The divisor of latent: s_l, or the record's own s_t in token-scale mode.
        float st = 0.0f;
        if (p.token_scale) std::memcpy(&st, r + layout::nvfp4_token_scale::kOffset, 4);
        const double lat_scale = p.token_scale ? static_cast<double>(st) : p.outer_scale;
        s.what = fmt::format("{} e4m3 group scales vs amax(latent/{})/6", N::kNumGroups, p.token_scale ? "s_t" : "s_l");
        for (int g = 0; g < N::kNumGroups; ++g) {
          if (lat_scale == 0) continue;  // token-scale mode, all-zero token: no scales
          const double exact = amax(t, g * N::kGroupDim, N::kGroupDim, 6.0 * lat_scale);
          if (exact > 0) ++s.groups;
          if (exact > 0 && exact < 0.015625) ++s.subnormal;
          add(exact, e4m3_to_f32(r[N::kScaleOffset + g]));
        }
        if (p.format == KvFormat::kNvfp4DsMlaFp8Rope) {
          namespace R = layout::nvfp4_ds_mla_fp8rope;
          s.what += ", fp32 rope scale vs amax/448";
          float v;
          std::memcpy(&v, r + R::kRopeScaleOffset, 4);
          add(amax(t, kLatentDim, kRopeDim, kE4m3Max), v);
        } else if (p.format == KvFormat::kNvfp4DsMlaInt8Rope) {
          namespace R = layout::nvfp4_ds_mla_int8rope;
          s.what += ", fp32 rope scale vs amax/127";
          float v;
          std::memcpy(&v, r + R::kRopeScaleOffset, 4);
          add(amax(t, kLatentDim, kRopeDim, R::kInt8Max), v);
        }
        break;
      }
    }
  }
  s.mean_rel = s.count > 0 ? sum / static_cast<double>(s.count) : 0;
  if (s.what.empty()) s.what = fmt::format("none ({} stores values)", format_name(p.format));
  return s;
}

Status run_stats(const CodecArgs& a) {
  std::vector<std::string> formats;
  if (a.format == "all") {
    for (const FormatInfo& f : all_formats()) formats.emplace_back(f.name);
  } else {
    formats.push_back(a.format);
  }
  MLAKV_ASSIGN_OR_RETURN(std::vector<float> rows, read_rows(a));
  const int64_t n = static_cast<int64_t>(rows.size() / kQkDim);
  if (n == 0) return invalid_argument(fmt::format("{}: no rows", a.in));
  std::vector<FormatStats> out;
  for (const std::string& name : formats) {
    CodecArgs fa = a;
    if (a.format == "all") {
      // --outer-scale / --fp8-scales apply to the formats that have them.
      const KvFormat f = *parse_format(name);
      if (!format_info(f).has_outer_scale) fa.outer_scale.reset();
      if (!is_nvfp4_format(f)) fa.token_scale = false, fa.nvfp4_scales = "rn";
      if (f != KvFormat::kFp8DsMla) fa.fp8_scales.reset();
    }
    MLAKV_ASSIGN_OR_RETURN(CodecParams p, to_params(name, fa));
    MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> recs, encode(p, rows, a.in + " as " + name, true));
    std::vector<float> back(rows.size());
    const RowViews v = views(back.data(), n);
    const TensorView rv = TensorView::contiguous(recs.data(), DType::kU8, {n, record_bytes(p.format)});
    MLAKV_RETURN_IF_ERROR(decode_records(p, rv, v.latent, v.rope));
    out.push_back({p.format, part_error(rows, back, 0, kLatentDim), part_error(rows, back, kLatentDim, kRopeDim),
                   scale_error(p, rows, recs)});
  }
  if (a.json) {
    nlohmann::json j = {{"in", a.in}, {"tokens", n}, {"formats", nlohmann::json::array()}};
    for (const FormatStats& s : out) {
      j["formats"].push_back({{"format", std::string(format_name(s.format))},
                              {"latent", {{"rel_l2", s.latent.rel_l2}, {"max_abs_err", s.latent.max_abs}}},
                              {"rope", {{"rel_l2", s.rope.rel_l2}, {"max_abs_err", s.rope.max_abs}}},
                              {"scales",
                               {{"what", s.scales.what},
                                {"count", s.scales.count},
                                {"group_scales", s.scales.groups},
                                {"subnormal_group_scales", s.scales.subnormal},
                                {"mean_rel_err", s.scales.mean_rel},
                                {"max_rel_err", s.scales.max_rel}}}});
    }
    print_json(j);
    return Status::Ok();
  }
  fmt::print("{} tokens from {}: round-trip error per part (rel L2 = ||decoded - input|| / ||input||)\n", n, a.in);
  fmt::print("{:<22}{:>13}{:>13}{:>13}{:>13}   {}\n", "format", "latent relL2", "latent max", "rope relL2", "rope max",
             "scales: mean / max rel err");
  for (const FormatStats& s : out) {
    fmt::print("{:<22}{:>13.3e}{:>13.3e}{:>13.3e}{:>13.3e}   ", format_name(s.format), s.latent.rel_l2,
               s.latent.max_abs, s.rope.rel_l2, s.rope.max_abs);
    if (s.scales.count == 0) {
      fmt::print("{}\n", s.scales.what);
    } else {
      fmt::print("{:.3e} / {:.3e} over {}{}\n", s.scales.mean_rel, s.scales.max_rel, s.scales.what,
                 s.scales.groups > 0 ? fmt::format("; {} of {} group scales subnormal", s.scales.subnormal,
                                                   s.scales.groups)
                                     : std::string());
    }
  }
  return Status::Ok();
}

void add_input(CLI::App* c, CodecArgs& a) {
  c->add_option("--in", a.in,
                "Rows [n, 576] (512 latent, then 64 rope): raw little-endian (--in-dtype), .npy (<f4/<f2) or "
                ".safetensors (f32/bf16/f16, --tensor)")
      ->required();
  c->add_option("--in-dtype", a.in_dtype, "Raw input element type: f32, bf16 or f16")->capture_default_str();
  c->add_option("--tensor", a.tensor, "The .safetensors tensor holding the rows (default: its only tensor)");
}

void add_encoder_params(CLI::App* c, CodecArgs& a) {
  c->add_option("--nvfp4-scales", a.nvfp4_scales,
                "nvfp4 formats: group scales rounded to nearest (rn, the fork's encoder) or each chosen among RN-1, "
                "RN, RN+1 by the group's squared error (search; not with --token-scale; docs/formats.md)")
      ->capture_default_str();
}

void add_params(CLI::App* c, CodecArgs& a) {
  c->add_option("--outer-scale", a.outer_scale, "Layer outer scale s_l (nvfp4 formats; default 1)");
  c->add_option("--fp8-scales", a.fp8_scales, "fp8_ds_mla tile scales: pow2 (default) or exact");
  c->add_flag("--token-scale", a.token_scale,
              "nvfp4 formats: the per-token scale mode (fp32 s_t = token_amax/2688 at bytes [292, 296), group scales "
              "relative to it; the fork's VLLM_NVFP4_MLA_DYNAMIC_SCALE=1); replaces --outer-scale");
}

}  // namespace

void add_codec_command(Cli& cli) {
  auto* cmd = cli.app.add_subcommand(
      "codec", "Encode float rows into a KV record file, decode one back, or measure a format's round-trip error");
  cmd->require_subcommand(1);
  auto enc_args = std::make_shared<CodecArgs>();
  auto dec_args = std::make_shared<CodecArgs>();
  auto stat_args = std::make_shared<CodecArgs>();
  auto* enc = cmd->add_subcommand("encode", "rows [n, 576] -> a record file (64 B header + n records)");
  enc->add_option("--format", enc_args->format, "Record format (see 'mlakv formats')")->required();
  add_params(enc, *enc_args);
  add_encoder_params(enc, *enc_args);
  add_input(enc, *enc_args);
  enc->add_option("--out", enc_args->out, "Record file to write")->required();
  enc->add_flag("--raw", enc_args->raw, "Write bare records without the header");
  enc->add_flag("--json", enc_args->json, "Print a JSON summary");

  auto* dec = cmd->add_subcommand("decode", "a record file -> float32 rows [n, 576]");
  dec->add_option("--format", dec_args->format,
                  "Record format: read from the file's header (must match it if given); required with --raw");
  add_params(dec, *dec_args);
  dec->add_option("--in", dec_args->in, "Record file (or bare records with --raw)")->required();
  dec->add_option("--out", dec_args->out, "Rows to write: raw float32, or .npy")->required();
  dec->add_flag("--raw", dec_args->raw, "The input is bare records without a header (give --format, --outer-scale)");
  dec->add_flag("--json", dec_args->json, "Print a JSON summary");

  auto* st = cmd->add_subcommand("stats", "Round-trip error per part (latent, rope, scales) of rows in a format");
  st->add_option("--format", stat_args->format, "Record format, or all")->required();
  add_params(st, *stat_args);
  add_encoder_params(st, *stat_args);
  add_input(st, *stat_args);
  st->add_flag("--json", stat_args->json, "Print JSON");

  enc->callback([&cli, enc_args] { cli.action = [enc_args] { return run_encode(*enc_args); }; });
  dec->callback([&cli, dec_args] { cli.action = [dec_args] { return run_decode(*dec_args); }; });
  st->callback([&cli, stat_args] { cli.action = [stat_args] { return run_stats(*stat_args); }; });
}

}  // namespace mlakv::cli
