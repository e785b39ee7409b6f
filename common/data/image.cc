#include "common/data/image.h"

// clang-format off: jpeglib.h needs stdio's FILE and size_t first.
#include <cstdio>
#include <jpeglib.h>
// clang-format on
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tally {

namespace {

absl::Status Undecodable(const std::string& name, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": does not decode: ", why));
}

absl::Status CheckPixels(const std::string& name, int64_t w, int64_t h) {
  if (w <= 0 || h <= 0) return Undecodable(name, "an empty image");
  if (w * h > kMaxImagePixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", w, "x", h, " pixels, more than the ", kMaxImagePixels,
        " an image may have"));
  }
  return absl::OkStatus();
}

// libjpeg reports errors through a callback that must not return: it jumps
// back to the decode with the message.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegFail(j_common_ptr info) {
  auto* e = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (a file cut short is one: libjpeg pads it with grey) are kept to
// be returned as errors; nothing is printed.
void JpegWarn(j_common_ptr info, int level) {
  auto* e = reinterpret_cast<JpegError*>(info->err);
  if (level < 0 && e->message[0] == '\0') {
    (*info->err->format_message)(info, e->message);
  }
}

// Everything between setjmp and a longjmp is plain data: no destructor may
// be skipped. `out` lives in the caller.
absl::Status DecodeJpeg(absl::string_view bytes, int channels,
                        const std::string& name, Image* out, int min_width,
                        int min_height, bool header_only) {
  jpeg_decompress_struct info;
  JpegError err;
  err.message[0] = '\0';
  info.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = JpegFail;
  err.mgr.emit_message = JpegWarn;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&info);
    return Undecodable(name, err.message);
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  out->width = static_cast<int>(info.image_width);
  out->height = static_cast<int>(info.image_height);
  if (header_only || static_cast<int64_t>(out->width) * out->height >
                         kMaxImagePixels) {
    jpeg_destroy_decompress(&info);  // nothing can jump from here on
    return CheckPixels(name, out->width, out->height);
  }
  info.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  info.scale_num = 1;
  info.scale_denom = 1;
  for (unsigned d = 8; d > 1 && min_width > 0 && min_height > 0; d /= 2) {
    if (static_cast<int>(info.image_width / d) >= min_width &&
        static_cast<int>(info.image_height / d) >= min_height) {
      info.scale_denom = d;
      break;
    }
  }
  jpeg_start_decompress(&info);
  out->width = static_cast<int>(info.output_width);
  out->height = static_cast<int>(info.output_height);
  out->channels = channels;
  const size_t row = static_cast<size_t>(out->width) * channels;
  out->pixels.resize(row * out->height);
  while (info.output_scanline < info.output_height) {
    JSAMPROW p = out->pixels.data() + info.output_scanline * row;
    jpeg_read_scanlines(&info, &p, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  if (err.message[0] != '\0') return Undecodable(name, err.message);
  return absl::OkStatus();
}

absl::Status DecodePng(absl::string_view bytes, int channels,
                       const std::string& name, Image* out, bool header_only) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    const std::string why = png.message;
    png_image_free(&png);
    return Undecodable(name, why);
  }
  out->width = static_cast<int>(png.width);
  out->height = static_cast<int>(png.height);
  absl::Status size = CheckPixels(name, out->width, out->height);
  if (!size.ok() || header_only) {
    png_image_free(&png);
    return size;
  }
  png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  out->channels = channels;
  out->pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, out->pixels.data(), 0, nullptr)) {
    const std::string why = png.message;
    png_image_free(&png);
    return Undecodable(name, why);
  }
  return absl::OkStatus();
}

absl::Status Decode(absl::string_view bytes, int channels,
                    const std::string& name, Image* out, int min_width,
                    int min_height, bool header_only) {
  switch (SniffImage(bytes)) {
    case ImageFormat::kPng:
      return DecodePng(bytes, channels, name, out, header_only);
    case ImageFormat::kJpeg:
      return DecodeJpeg(bytes, channels, name, out, min_width, min_height,
                        header_only);
    case ImageFormat::kUnknown:
      break;
  }
  return Undecodable(name, "neither PNG nor JPEG (by its first bytes)");
}

// One axis of a resampling: for output i, the inputs [first[i], first[i] +
// count[i]) and their weights (summing to 1), at weight[i * taps ...].
struct Taps {
  int taps = 0;
  std::vector<int> first, count;
  std::vector<float> weight;
};

// PIL's antialiased bilinear filter: `outputs` pixels from `inputs`, the
// image scaled to `scaled` pixels along this axis and cut from `offset`.
Taps MakeTaps(int inputs, double scaled, int offset, int outputs) {
  const double scale = inputs / scaled;
  const double spread = std::max(scale, 1.0);  // the filter's width
  Taps t;
  t.taps = static_cast<int>(std::ceil(spread)) * 2 + 1;
  t.first.resize(outputs);
  t.count.resize(outputs);
  t.weight.assign(static_cast<size_t>(outputs) * t.taps, 0.0f);
  std::vector<double> w(static_cast<size_t>(t.taps));
  for (int i = 0; i < outputs; ++i) {
    const double center = (i + offset + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(center - spread + 0.5));
    const int hi = std::min(inputs, static_cast<int>(center + spread + 0.5));
    double sum = 0;
    int n = 0;
    for (int k = lo; k < hi && n < t.taps; ++k, ++n) {
      const double x = std::abs((k + 0.5 - center) / spread);
      w[n] = x < 1.0 ? 1.0 - x : 0.0;
      sum += w[n];
    }
    t.first[i] = lo;
    t.count[i] = n;
    for (int k = 0; k < n; ++k) {
      t.weight[static_cast<size_t>(i) * t.taps + k] =
          static_cast<float>(sum > 0 ? w[k] / sum : 0);
    }
  }
  return t;
}

// The last taps made, kept: a folder's images mostly share a size.
struct TapCache {
  int inputs = -1, offset = 0, outputs = 0;
  double scaled = 0;
  Taps taps;
  const Taps& Get(int in, double sc, int off, int out) {
    if (in != inputs || sc != scaled || off != offset || out != outputs) {
      taps = MakeTaps(in, sc, off, out);
      inputs = in;
      scaled = sc;
      offset = off;
      outputs = out;
    }
    return taps;
  }
};

// Across every row the vertical pass reads (C channels interleaved), then
// down whole rows at a time (contiguous: vectorised), then into [C, H, W]
// scaled to [0, 1].
template <int C>
void Resample(const Image& in, const Taps& across, const Taps& down,
              int height, int width, float* out) {
  const int row0 = down.first.front();
  const int rows = down.first.back() + down.count.back() - row0;
  const int64_t stride = static_cast<int64_t>(width) * C;
  thread_local std::vector<float> mid, row;
  mid.resize(static_cast<size_t>(rows) * stride);
  row.resize(static_cast<size_t>(stride));
  for (int r = 0; r < rows; ++r) {
    const uint8_t* src =
        in.pixels.data() + static_cast<int64_t>(row0 + r) * in.width * C;
    float* dst = mid.data() + r * stride;
    for (int j = 0; j < width; ++j) {
      const float* w = across.weight.data() + static_cast<size_t>(j) * across.taps;
      const uint8_t* p = src + static_cast<int64_t>(across.first[j]) * C;
      float acc[C] = {};
      for (int t = 0; t < across.count[j]; ++t) {
        for (int k = 0; k < C; ++k) acc[k] += w[t] * p[t * C + k];
      }
      for (int k = 0; k < C; ++k) dst[j * C + k] = acc[k];
    }
  }
  const int64_t plane = static_cast<int64_t>(height) * width;
  for (int i = 0; i < height; ++i) {
    const float* w = down.weight.data() + static_cast<size_t>(i) * down.taps;
    float* acc = row.data();
    std::fill(acc, acc + stride, 0.0f);
    for (int t = 0; t < down.count[i]; ++t) {
      const float* src = mid.data() + (down.first[i] - row0 + t) * stride;
      const float wt = w[t];
      for (int64_t q = 0; q < stride; ++q) acc[q] += wt * src[q];
    }
    float* o = out + static_cast<int64_t>(i) * width;
    for (int j = 0; j < width; ++j) {
      for (int k = 0; k < C; ++k) {
        o[k * plane + j] = std::clamp(acc[j * C + k] * (1.0f / 255.0f), 0.0f, 1.0f);
      }
    }
  }
}

}  // namespace

ImageFormat SniffImage(absl::string_view bytes) {
  if (bytes.size() >= 8 && bytes.substr(0, 8) == "\x89PNG\r\n\x1a\n") {
    return ImageFormat::kPng;
  }
  if (bytes.size() >= 3 && bytes.substr(0, 3) == "\xff\xd8\xff") {
    return ImageFormat::kJpeg;
  }
  return ImageFormat::kUnknown;
}

absl::Status ReadImageSize(absl::string_view bytes, const std::string& name,
                           int* width, int* height) {
  Image header;
  absl::Status s = Decode(bytes, 3, name, &header, 0, 0, true);
  *width = header.width;
  *height = header.height;
  return s;
}

absl::Status DecodeImage(absl::string_view bytes, int channels,
                         const std::string& name, Image* out, int min_width,
                         int min_height) {
  return Decode(bytes, channels, name, out, min_width, min_height, false);
}

absl::Status FitImage(const Image& in, ImageFit fit, int height, int width,
                      const std::string& name, float* out) {
  const int c = in.channels;
  const int64_t plane = static_cast<int64_t>(height) * width;
  if (in.height == height && in.width == width) {
    for (int64_t p = 0; p < plane; ++p) {
      for (int k = 0; k < c; ++k) out[k * plane + p] = in.pixels[p * c + k] / 255.0f;
    }
    return absl::OkStatus();
  }
  if (fit == ImageFit::kExact) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", in.width, "x", in.height, " pixels; the samples are ",
        width, "x", height, " (dataset.resize: none)"));
  }
  double sh = height, sw = width;  // the scaled image's size
  int top = 0, left = 0;
  if (fit == ImageFit::kCrop) {
    const double s = std::max(static_cast<double>(height) / in.height,
                              static_cast<double>(width) / in.width);
    sh = std::max<double>(height, std::round(in.height * s));
    sw = std::max<double>(width, std::round(in.width * s));
    top = static_cast<int>(std::round((sh - height) / 2.0));
    left = static_cast<int>(std::round((sw - width) / 2.0));
  }
  thread_local TapCache across_cache, down_cache;
  const Taps& across = across_cache.Get(in.width, sw, left, width);
  const Taps& down = down_cache.Get(in.height, sh, top, height);
  if (c == 1) {
    Resample<1>(in, across, down, height, width, out);
  } else {
    Resample<3>(in, across, down, height, width, out);
  }
  return absl::OkStatus();
}

}  // namespace tally
