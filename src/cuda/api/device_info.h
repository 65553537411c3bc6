#pragma once

namespace mlakv::cuda {

// Number of visible CUDA devices; 0 when there is no driver or device.
int device_count();
// Launches a one-thread kernel and reads its result back: true when a device works.
bool launch_probe();

}  // namespace mlakv::cuda
