// Host entry of record_reader_kernels.cu: the sm80 attention's record reader
// (src/cuda/sm80/attention/reader.cuh) run on its own, for the harness's code-by-code
// check against the scalar codec.
#pragma once

#include <cstdint>

#include "mlakv/formats.h"

namespace mlakv::test {

// records [n, record_bytes(format)] u8 on the device -> rows [n, 576] bf16 on the
// device, as the attention kernel's K tile rows: compressed formats through
// sm80::dequant_part (four threads per record, the nvfp4 table in shared memory),
// bf16 records copied in 16-byte chunks as the kernel's cp.async does. Returns the
// launch's cudaError_t as int. token_scale: the nvfp4 per-token scale mode (s_t read
// from each record instead of outer_scale).
int dequantize_records_sm80(KvFormat format, const uint8_t* records, int64_t n, float outer_scale, uint16_t* rows,
                            void* stream, bool token_scale = false);

}  // namespace mlakv::test
