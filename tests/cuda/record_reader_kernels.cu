// The sm80 record reader on its own (record_reader_kernels.h): one CTA of 128 threads
// per 32 records, thread = (record tid / 4, quarter tid % 4), as in the attention kernel.
#include <cuda_runtime.h>

#include "cuda/common/dispatch_format.h"
#include "cuda/common/record_part.cuh"
#include "cuda/sm80/attention/reader.cuh"
#include "record_reader_kernels.h"

namespace mlakv::test {
namespace {

constexpr int kRecordsPerCta = 32;
constexpr int kThreads = kRecordsPerCta * cuda::record::kQuarters;

template <KvFormat F>
__global__ void __launch_bounds__(kThreads) read_records_kernel(const uint8_t* records, int64_t n, float outer,
                                                                 uint16_t* rows, bool token_scale) {
  __shared__ float lut[cuda::sm80::kLutEntries];
  const int tid = threadIdx.x;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRecordsPerCta + tid / cuda::record::kQuarters;
  const int q = tid % cuda::record::kQuarters;
  constexpr int rb = cuda::record::Parts<F>::kRecordBytes;
  if constexpr (F == KvFormat::kBf16) {
    if (r >= n) return;
    // The kernel's bf16 path: the record's 16-byte chunks land in the K row as they are.
    const uint4* src = reinterpret_cast<const uint4*>(records + r * rb);
    uint4* dst = reinterpret_cast<uint4*>(rows + r * kQkDim);
    for (int k = q; k < rb / 16; k += cuda::record::kQuarters) dst[k] = src[k];
  } else {
    if constexpr (cuda::sm80::uses_lut(F)) cuda::sm80::fill_lut(lut, tid);
    __syncthreads();
    if (r >= n) return;
    cuda::sm80::dequant_part<F>(lut, records + r * rb, true, outer, q, rows + r * kQkDim, token_scale);
  }
}

}  // namespace

int dequantize_records_sm80(KvFormat format, const uint8_t* records, int64_t n, float outer_scale, uint16_t* rows,
                            void* stream, bool token_scale) {
  if (n == 0) return 0;
  const unsigned grid = static_cast<unsigned>((n + kRecordsPerCta - 1) / kRecordsPerCta);
  return cuda::dispatch_format<cuda::KernelSet::kAll>(format, int{cudaErrorInvalidValue}, [&](auto tag) {
    read_records_kernel<decltype(tag)::value>
        <<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(records, n, outer_scale, rows, token_scale);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace mlakv::test
