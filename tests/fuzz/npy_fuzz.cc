// libFuzzer: an arrays dataset's file. The input is parsed as a .npy header
// and, when it parses, its values checked against the bytes there; then it
// is written to a file and opened as a .npz archive (the zip directory, a
// member's local header, zip64 fields) and as a .safetensors file (its JSON
// header), asking for the array "x".
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include "absl/strings/string_view.h"
#include "common/data/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto h = tally::ParseNpyHeader(bytes, "fuzz.npy");
  if (h.ok()) {
    // What the checks before any value is read need: it must not overflow.
    (void)h->values();
  }
  static const std::string base = "/tmp/tally-fuzz-" + std::to_string(getpid());
  for (const char* ext : {".npz", ".safetensors"}) {
    const std::string path = base + ext;
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    auto a = tally::OpenArray(path, "x");
    if (a.ok()) {
      // A value at each end of the array must be readable.
      const int64_t n = a->header.values() * a->header.width;
      if (n > 0) {
        volatile char first = a->file->data()[a->header.data_offset];
        volatile char last = a->file->data()[a->header.data_offset + n - 1];
        (void)first;
        (void)last;
      }
    }
    unlink(path.c_str());
  }
  return 0;
}
