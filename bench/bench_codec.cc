// Record codec throughput per format, beside a plain memcpy measured in the same binary.
// bytes_per_second counts float32 input + record output for encode, records + float32
// output for decode.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "mlakv/codec.h"

namespace {

constexpr int64_t kTokens = 4096;

struct Data {
  std::vector<float> lat, rope;
  Data() : lat(kTokens * mlakv::kLatentDim), rope(kTokens * mlakv::kRopeDim) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (float& x : lat) x = nd(rng);
    for (float& x : rope) x = nd(rng);
  }
};
const Data& data() {
  static Data d;
  return d;
}

void BM_Memcpy(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(2 * bytes));
}
BENCHMARK(BM_Memcpy)->Arg(kTokens * 576 * 4)->Arg(256 << 20);

void BM_Encode(benchmark::State& state) {
  const auto f = static_cast<mlakv::KvFormat>(state.range(0));
  const int rb = mlakv::record_bytes(f);
  std::vector<uint8_t> out(static_cast<std::size_t>(kTokens) * rb);
  mlakv::CodecParams p{f};
  const auto lat = mlakv::TensorView::contiguous(data().lat.data(), mlakv::DType::kF32, {kTokens, mlakv::kLatentDim});
  const auto rope = mlakv::TensorView::contiguous(data().rope.data(), mlakv::DType::kF32, {kTokens, mlakv::kRopeDim});
  const auto rec = mlakv::TensorView::contiguous(out.data(), mlakv::DType::kU8, {kTokens, rb});
  for (auto _ : state) {
    if (!mlakv::encode_records(p, lat, rope, rec).ok()) state.SkipWithError("encode failed");
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(mlakv::format_name(f)));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kTokens * (576 * 4 + rb));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kTokens), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Encode)->DenseRange(0, 3)->Arg(5);  // every format but f32 (4)

void BM_Decode(benchmark::State& state) {
  const auto f = static_cast<mlakv::KvFormat>(state.range(0));
  const int rb = mlakv::record_bytes(f);
  std::vector<uint8_t> recs(static_cast<std::size_t>(kTokens) * rb);
  mlakv::CodecParams p{f};
  const auto lat = mlakv::TensorView::contiguous(data().lat.data(), mlakv::DType::kF32, {kTokens, mlakv::kLatentDim});
  const auto rope = mlakv::TensorView::contiguous(data().rope.data(), mlakv::DType::kF32, {kTokens, mlakv::kRopeDim});
  const auto rec = mlakv::TensorView::contiguous(recs.data(), mlakv::DType::kU8, {kTokens, rb});
  if (!mlakv::encode_records(p, lat, rope, rec).ok()) state.SkipWithError("encode failed");
  std::vector<float> ol(kTokens * mlakv::kLatentDim), orp(kTokens * mlakv::kRopeDim);
  const auto olv = mlakv::TensorView::contiguous(ol.data(), mlakv::DType::kF32, {kTokens, mlakv::kLatentDim});
  const auto orv = mlakv::TensorView::contiguous(orp.data(), mlakv::DType::kF32, {kTokens, mlakv::kRopeDim});
  for (auto _ : state) {
    if (!mlakv::decode_records(p, rec, olv, orv).ok()) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(ol.data());
  }
  state.SetLabel(std::string(mlakv::format_name(f)));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kTokens * (576 * 4 + rb));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kTokens), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Decode)->DenseRange(0, 3)->Arg(5);

}  // namespace

BENCHMARK_MAIN();
