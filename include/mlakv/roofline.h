// Machine ceilings measured in-process, the yardsticks every CPU figure is quoted
// against: a large memcpy (memory bandwidth) and an FMA-bound loop (arithmetic peak).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlakv::cpu {

// Sustained single-thread float32 FMA throughput in GFLOP/s (2 FLOP per lane per FMA)
// of the instruction set the attention kernel dispatches to, over ~`seconds`.
double measure_fma_gflops(double seconds = 0.3);
// memcpy bandwidth in GB/s counting bytes read + written, over `bytes`-sized buffers.
double measure_memcpy_gbps(std::size_t bytes = std::size_t{256} << 20, int reps = 5);

}  // namespace mlakv::cpu
