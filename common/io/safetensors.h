// The .safetensors format (8-byte little-endian header length, a JSON header
// of {name: {dtype, shape, data_offsets}}, then raw little-endian data),
// float32 only. Tally's flat parameter vector maps to it with the PyTorch
// state_dict names of its ModelLayout, so
//   model.load_state_dict(safetensors.torch.load_file(path))
// works for a torch.nn.Sequential of the same layers.
//
// All functions are thread-safe (no shared state).
#ifndef TALLY_COMMON_IO_SAFETENSORS_H_
#define TALLY_COMMON_IO_SAFETENSORS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/nn/layer_config.h"
#include "common/tensor.h"

namespace tally {

struct HostTensor {
  Shape shape;
  std::vector<float> data;
};

using TensorMap = std::map<std::string, HostTensor>;

// A tensor kept as it came (a Python model's buffers): its safetensors
// dtype ("F32", "I64", ...), shape and little-endian bytes.
struct RawTensor {
  std::string name;
  std::string dtype;
  Shape shape;
  std::string bytes;
};

// A tensor whose bytes the caller writes after the encoded file (one too
// large to hold at once: a job's embedding tables): its header entry.
struct LaterTensor {
  std::string name;
  std::string dtype;
  Shape shape;
  int64_t bytes = 0;
};

// Encodes the flat vector `params` (layout.num_params floats) as named
// tensors, then `extra` as they are. `metadata` goes to the header's
// "__metadata__" (string values). The header also lists `later`, after
// the rest, whose bytes are not in the result: the file is whole once the
// caller has appended them, in order.
std::string EncodeSafetensors(
    const std::vector<ParamInfo>& layout, const float* params,
    const std::map<std::string, std::string>& metadata = {},
    const std::vector<RawTensor>& extra = {},
    const std::vector<LaterTensor>& later = {});

// Decodes any float32 safetensors document. kInvalidArgument (with what is
// wrong) for malformed input; other dtypes are rejected by name.
absl::StatusOr<TensorMap> DecodeSafetensors(absl::string_view bytes);

// Gathers `tensors` into a flat vector laid out as `layout`; every name must
// be present with the same shape (extra tensors are an error too).
absl::StatusOr<std::vector<float>> FlattenTensors(
    const TensorMap& tensors, const std::vector<ParamInfo>& layout);

// Atomically replaces `path`: write a temporary file, fsync, rename, fsync
// the directory. A crash leaves either the old file or the new one.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view bytes);
// The same for a file made of `pieces` back to back (no joined copy).
absl::Status WriteFileAtomic(const std::string& path,
                             const std::vector<absl::string_view>& pieces);
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Convenience: encode + atomic write, and read + decode + flatten.
absl::Status SaveSafetensors(
    const std::string& path, const std::vector<ParamInfo>& layout,
    const float* params,
    const std::map<std::string, std::string>& metadata = {});
absl::StatusOr<std::vector<float>> LoadSafetensors(
    const std::string& path, const std::vector<ParamInfo>& layout);

}  // namespace tally

#endif  // TALLY_COMMON_IO_SAFETENSORS_H_
