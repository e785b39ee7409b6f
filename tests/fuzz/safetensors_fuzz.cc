// libFuzzer: a .safetensors file (initial weights, a fetched model) decoded,
// and its tensors flattened when it decodes.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto tensors = tally::DecodeSafetensors(bytes);
  (void)tensors;
  return 0;
}
