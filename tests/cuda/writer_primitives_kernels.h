// Host entry of writer_primitives_kernels.cu: the CUDA writers' fast element primitives
// (format/record_codec.h) checked against the scalar codec on the device.
#pragma once

namespace mlakv::test {

// Mismatch counters (and the first mismatch's bits) of check_writer_primitives.
enum PrimitiveCheck : int {
  kE4m3 = 0,        // e4m3x2_satfinite vs f32_to_e4m3_satfinite, non-NaN inputs
  kE4m3NaN,         // the same where an input is NaN (not specified on the device)
  kBf16,            // bf16x2_rn vs f32_to_bf16, non-NaN inputs
  kBf16NaN,         // the same where an input is NaN
  kE2m1,            // e2m1_code vs f32_to_e2m1_satfinite, non-NaN inputs
  kDivGroupScale,   // div_rn_by_e4m3 and div_rn_by_reciprocal vs IEEE, every e4m3 divisor, dividends [1, 4)
  kDivScale,        // the same for random divisors on the reciprocal path
  kNvfp4ScaleCode,  // nvfp4_group_scale_code_fast vs nvfp4_group_scale_code, every float >= 0 and +Inf
  kE4m3Decode,      // e4m3_to_f32_fast vs e4m3_to_f32, every non-NaN code
  kE2m1Below7,      // e2m1_code_below7_f vs f32_to_e2m1_satfinite, every float in [0, 7)
  kNumPrimitiveChecks
};

// counts[kNumPrimitiveChecks]; first[k]: (input bits << 32) | result of the first
// mismatch of check k, or all ones. Returns the cudaError_t as int.
int check_writer_primitives(unsigned long long* counts, unsigned long long* first);

}  // namespace mlakv::test
