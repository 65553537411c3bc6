// Uses the installed public API only: encodes a token into fp8_ds_mla and decodes it.
#include <cmath>
#include <cstdio>
#include <vector>

#include "mlakv/codec.h"
#include "mlakv/formats.h"

int main() {
  using namespace mlakv;
  std::vector<float> lat(kLatentDim), rope(kRopeDim), lat2(kLatentDim), rope2(kRopeDim);
  for (int i = 0; i < kLatentDim; ++i) lat[i] = std::sin(0.1f * i);
  for (int i = 0; i < kRopeDim; ++i) rope[i] = std::cos(0.2f * i);
  const KvFormat f = KvFormat::kFp8DsMla;
  const CodecParams p{.format = f};
  std::vector<uint8_t> rec(record_bytes(f));
  Status s = encode_records(p, TensorView::contiguous(lat.data(), DType::kF32, {1, kLatentDim}),
                            TensorView::contiguous(rope.data(), DType::kF32, {1, kRopeDim}),
                            TensorView::contiguous(rec.data(), DType::kU8, {1, record_bytes(f)}));
  if (!s.ok()) { std::printf("encode: %s\n", s.message().c_str()); return 1; }
  s = decode_records(p, TensorView::contiguous(rec.data(), DType::kU8, {1, record_bytes(f)}),
                     TensorView::contiguous(lat2.data(), DType::kF32, {1, kLatentDim}),
                     TensorView::contiguous(rope2.data(), DType::kF32, {1, kRopeDim}));
  if (!s.ok()) { std::printf("decode: %s\n", s.message().c_str()); return 1; }
  double err = 0;
  for (int i = 0; i < kLatentDim; ++i) err = std::fmax(err, std::fabs(lat2[i] - lat[i]));
  std::printf("mlakv consumer: %s record %d B, max latent error %.4f\n", format_name(f).data(), record_bytes(f), err);
  return err < 0.1 ? 0 : 1;
}
