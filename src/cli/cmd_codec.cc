// mlakv codec encode|decode: raw float32 rows <-> KV records.
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "cli/cli.h"
#include "mlakv/file_io.h"
#include "mlakv/codec.h"

namespace mlakv::cli {
namespace {

struct CodecArgs {
  std::string format;
  float outer_scale = 1.0f;
  std::string fp8_scales = "pow2";
  std::string in, out;
  bool json = false;
};

StatusOr<CodecParams> to_params(const CodecArgs& a) {
  CodecParams p;
  auto f = parse_format(a.format);
  if (!f) return invalid_argument(fmt::format("--format: unknown format '{}' (see 'mlakv formats')", a.format));
  p.format = *f;
  p.outer_scale = a.outer_scale;
  if (a.fp8_scales == "pow2") {
    p.fp8_scales = Fp8ScaleMode::kPow2;
  } else if (a.fp8_scales == "exact") {
    p.fp8_scales = Fp8ScaleMode::kExact;
  } else {
    return invalid_argument(fmt::format("--fp8-scales: expected pow2 or exact, got '{}'", a.fp8_scales));
  }
  MLAKV_RETURN_IF_ERROR(codec_record_bytes(p).status().with_context("--format/--outer-scale"));
  return p;
}

Status run_encode(const CodecArgs& a) {
  MLAKV_ASSIGN_OR_RETURN(CodecParams p, to_params(a));
  MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.out, "--out", a.in, "--in"));
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> in, io::read_file(a.in, io::kMaxRawInputBytes));
  constexpr std::size_t kRowBytes = 4 * kQkDim;
  if (in.size() % kRowBytes != 0) {
    return invalid_argument(fmt::format(
        "{}: size {} B is not a whole number of rows of {} float32 ({} B); {} B left over", a.in, in.size(),
        kQkDim, kRowBytes, in.size() % kRowBytes));
  }
  const int64_t n = static_cast<int64_t>(in.size() / kRowBytes);
  std::vector<float> rows(static_cast<std::size_t>(n) * kQkDim);
  if (!in.empty()) std::memcpy(rows.data(), in.data(), in.size());
  const int rb = record_bytes(p.format);
  std::vector<uint8_t> out(static_cast<std::size_t>(n) * rb);
  TensorView latent = TensorView::contiguous(rows.data(), DType::kF32, {n, kLatentDim});
  latent.strides[0] = kQkDim;
  TensorView rope = TensorView::contiguous(rows.data() + kLatentDim, DType::kF32, {n, kRopeDim});
  rope.strides[0] = kQkDim;
  const TensorView recs = TensorView::contiguous(out.data(), DType::kU8, {n, rb});
  MLAKV_RETURN_IF_ERROR(encode_records(p, latent, rope, recs).with_context(a.in));
  MLAKV_RETURN_IF_ERROR(io::write_file(a.out, out.data(), out.size()));
  if (a.json) {
    print_json({{"format", a.format}, {"tokens", n}, {"record_bytes", rb}, {"in_bytes", in.size()},
                {"out_bytes", out.size()}, {"out", a.out}});
  } else {
    fmt::print("encoded {} tokens: {} B float32 -> {} B {} ({} B per record)\n", n, in.size(), out.size(),
               a.format, rb);
  }
  return Status::Ok();
}

Status run_decode(const CodecArgs& a) {
  MLAKV_ASSIGN_OR_RETURN(CodecParams p, to_params(a));
  MLAKV_RETURN_IF_ERROR(io::check_not_same_file(a.out, "--out", a.in, "--in"));
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> in, io::read_file(a.in, io::kMaxRawInputBytes));
  const std::size_t rb = static_cast<std::size_t>(record_bytes(p.format));
  if (in.size() % rb != 0) {
    return invalid_argument(fmt::format("{}: size {} B is not a whole number of {} records ({} B); {} B left over",
                                        a.in, in.size(), a.format, rb, in.size() % rb));
  }
  const int64_t n = static_cast<int64_t>(in.size() / rb);
  std::vector<float> rows(static_cast<std::size_t>(n) * kQkDim);
  TensorView latent = TensorView::contiguous(rows.data(), DType::kF32, {n, kLatentDim});
  latent.strides[0] = kQkDim;
  TensorView rope = TensorView::contiguous(rows.data() + kLatentDim, DType::kF32, {n, kRopeDim});
  rope.strides[0] = kQkDim;
  const TensorView recs = TensorView::contiguous(in.data(), DType::kU8, {n, static_cast<int64_t>(rb)});
  MLAKV_RETURN_IF_ERROR(decode_records(p, recs, latent, rope).with_context(a.in));
  MLAKV_RETURN_IF_ERROR(io::write_file(a.out, rows.data(), rows.size() * sizeof(float)));
  if (a.json) {
    print_json({{"format", a.format}, {"tokens", n}, {"record_bytes", rb}, {"in_bytes", in.size()},
                {"out_bytes", rows.size() * sizeof(float)}, {"out", a.out}});
  } else {
    fmt::print("decoded {} {} records -> {} B float32 [{}, {}]\n", n, a.format, rows.size() * sizeof(float), n,
               kQkDim);
  }
  return Status::Ok();
}

void add_common(CLI::App* c, CodecArgs& a, bool encode) {
  c->add_option("--format", a.format, "Record format (see 'mlakv formats')")->required();
  c->add_option("--outer-scale", a.outer_scale, "Layer outer scale s_l (nvfp4 formats)");
  if (encode) c->add_option("--fp8-scales", a.fp8_scales, "fp8_ds_mla tile scales: pow2 (default) or exact");
  c->add_option("--in", a.in, encode ? "Raw little-endian float32 [n, 576] (512 latent, then 64 rope)"
                                     : "Records file")
      ->required();
  c->add_option("--out", a.out, encode ? "Records file to write" : "Raw float32 [n, 576] file to write")->required();
  c->add_flag("--json", a.json, "Print a JSON summary");
}

}  // namespace

void add_codec_command(Cli& cli) {
  auto* cmd = cli.app.add_subcommand("codec", "Encode float32 latents into KV records, or decode them back");
  cmd->require_subcommand(1);
  auto enc_args = std::make_shared<CodecArgs>();
  auto dec_args = std::make_shared<CodecArgs>();
  auto* enc = cmd->add_subcommand("encode", "float32 [n, 576] -> n records");
  auto* dec = cmd->add_subcommand("decode", "n records -> float32 [n, 576]");
  add_common(enc, *enc_args, true);
  add_common(dec, *dec_args, false);
  enc->callback([&cli, enc_args] { cli.action = [enc_args] { return run_encode(*enc_args); }; });
  dec->callback([&cli, dec_args] { cli.action = [dec_args] { return run_decode(*dec_args); }; });
}

}  // namespace mlakv::cli
