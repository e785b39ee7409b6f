// libFuzzer: an image folder's file (PNG or JPEG by its first bytes): its
// header read, and when it is small enough to decode quickly, decoded in
// gray and RGB (a JPEG also at a reduced DCT scale) and fitted to a sample.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/data/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  int width = 0, height = 0;
  if (!tally::ReadImageSize(bytes, "fuzz.img", &width, &height).ok()) return 0;
  if (static_cast<int64_t>(width) * height > (1 << 20)) return 0;
  std::vector<float> out(3 * 6 * 5);
  for (int channels : {1, 3}) {
    tally::Image image;
    if (!tally::DecodeImage(bytes, channels, "fuzz.img", &image,
                            channels == 1 ? 5 : 0, channels == 1 ? 6 : 0)
             .ok()) {
      continue;
    }
    for (tally::ImageFit fit : {tally::ImageFit::kCrop, tally::ImageFit::kStretch})
      (void)tally::FitImage(image, fit, 6, 5, "fuzz.img", out.data());
  }
  return 0;
}
