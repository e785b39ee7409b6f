// PNG and JPEG decoding (libpng's simplified API, libjpeg-turbo) and the
// resampling an image folder's samples go through (common/data/image_folder.h).
//
// Errors name the image (`name`) and say what the decoder found:
// kInvalidArgument for bytes that are neither format or do not decode
// (truncated, corrupt, a colour space the decoder cannot convert), and for
// images over kMaxImagePixels. Thread-safe: no state is shared.
#ifndef TALLY_COMMON_DATA_IMAGE_H_
#define TALLY_COMMON_DATA_IMAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tally {

// A decompression bomb's bound: 64 megapixels.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

// 8-bit pixels, rows top to bottom, channels interleaved (gray, or R G B).
struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels
};

enum class ImageFormat { kUnknown, kPng, kJpeg };

// By the bytes' signature, not the file's name.
ImageFormat SniffImage(absl::string_view bytes);

// Width and height from the header alone.
absl::Status ReadImageSize(absl::string_view bytes, const std::string& name,
                           int* width, int* height);

// Decodes `bytes` to `channels` (1: gray, 3: RGB; alpha is dropped, colour
// converted by the decoder). A JPEG may be decoded at 1/2, 1/4 or 1/8 of its
// size (libjpeg's DCT scaling) while that still leaves at least
// min_width x min_height pixels; 0 asks for the full size.
absl::Status DecodeImage(absl::string_view bytes, int channels,
                         const std::string& name, Image* out,
                         int min_width = 0, int min_height = 0);

// How an image meets the sample's height x width.
enum class ImageFit {
  kCrop,     // scale the shorter side to fit, cut the rest off the centre
  kStretch,  // scale each side to fit
  kExact,    // no resampling: an image of another size is an error
};

// Resamples `in` to height x width as `fit` says (an antialiased bilinear
// filter, PIL's, when shrinking), writing floats in [0, 1] as [C, H, W] to
// `out`. An image already height x width is copied exactly. kExact with
// another size is kInvalidArgument naming `name`.
absl::Status FitImage(const Image& in, ImageFit fit, int height, int width,
                      const std::string& name, float* out);

}  // namespace tally

#endif  // TALLY_COMMON_DATA_IMAGE_H_
