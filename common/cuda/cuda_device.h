// The CUDA backend of Device (internal to common/: reach it through
// ParseDevices, OpenDevice and CreateCollective in common/device.h).
#ifndef TALLY_COMMON_CUDA_CUDA_DEVICE_H_
#define TALLY_COMMON_CUDA_CUDA_DEVICE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device.h"

namespace tally::cuda {

// What cudaGetDeviceCount reports; its error (no driver, ...) as a Status.
absl::StatusOr<int> DeviceCount();

// One GPU: its own stream, cuBLAS handle and scratch memory.
absl::StatusOr<std::unique_ptr<Device>> OpenDevice(int index);

// Whether NCCL can be used here: libnccl.so.2 is loaded at run time, not
// linked. kUnimplemented, saying why, when the build had no nccl.h or the
// library (or one of its entry points) cannot be loaded.
absl::Status LoadNccl();

// An NCCL all-reduce group over CUDA devices opened by OpenDevice;
// kUnimplemented where LoadNccl fails.
absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(
    const std::vector<Device*>& devices);

}  // namespace tally::cuda

#endif  // TALLY_COMMON_CUDA_CUDA_DEVICE_H_
