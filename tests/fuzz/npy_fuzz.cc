// libFuzzer: a .npy file's header parsed (an arrays dataset's inputs or
// labels), and, when it parses, its values checked against the bytes there.
#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "common/data/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto h = tally::ParseNpyHeader(bytes, "fuzz.npy");
  if (h.ok()) {
    // What HeaderOf checks before any value is read: it must not overflow.
    (void)h->values();
  }
  return 0;
}
