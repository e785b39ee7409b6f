// PNG and JPEG decoding, fitting to a sample's shape, and image folders:
// classes and files in torchvision's order, pixels read back exactly,
// augmentations drawn per sample, bad files named or stood in for.
// (tests/arrays_test.py trains on an image folder against the same samples
// as .npy arrays.)
#include "common/data/image_folder.h"

// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

namespace fs = std::filesystem;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

// A test pattern: every pixel of every channel differs.
Image Pattern(int w, int h, int c) {
  Image im{w, h, c, {}};
  for (int i = 0; i < w * h * c; ++i)
    im.pixels.push_back(static_cast<uint8_t>((i * 37 + i / 7) % 256));
  return im;
}

std::string EncodePng(const Image& im) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = im.width;
  png.height = im.height;
  png.format = im.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&png, nullptr, &size, 0, im.pixels.data(), 0,
                            nullptr);
  std::string out(size, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&png, out.data(), &size, 0,
                                        im.pixels.data(), 0, nullptr))
      << png.message;
  out.resize(size);
  return out;
}

std::string EncodeJpeg(const Image& im, int quality = 95) {
  jpeg_compress_struct info;
  jpeg_error_mgr err;
  info.err = jpeg_std_error(&err);
  jpeg_create_compress(&info);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buf, &size);
  info.image_width = im.width;
  info.image_height = im.height;
  info.input_components = im.channels;
  info.in_color_space = im.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(im.pixels.data()) +
                   info.next_scanline * im.width * im.channels;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::string out(reinterpret_cast<char*>(buf), size);
  free(buf);
  return out;
}

TEST(ImageTest, PngDecodesExactlyGrayAndRgb) {
  for (int c : {1, 3}) {
    const Image im = Pattern(7, 5, c);
    Image got;
    ASSERT_TRUE(DecodeImage(EncodePng(im), c, "p.png", &got).ok());
    EXPECT_EQ(got.width, 7);
    EXPECT_EQ(got.height, 5);
    EXPECT_EQ(got.pixels, im.pixels);
  }
  // Gray read as RGB repeats the value.
  const Image gray = Pattern(3, 2, 1);
  Image rgb;
  ASSERT_TRUE(DecodeImage(EncodePng(gray), 3, "p.png", &rgb).ok());
  EXPECT_EQ(rgb.pixels[3 * 4 + 2], gray.pixels[4]);
}

TEST(ImageTest, JpegDecodesCloseToItsPixelsAndShrinksByDctScaling) {
  Image flat{16, 16, 3, std::vector<uint8_t>(16 * 16 * 3, 0)};
  for (int i = 0; i < 16 * 16; ++i) {
    flat.pixels[i * 3] = 200;
    flat.pixels[i * 3 + 1] = 100;
    flat.pixels[i * 3 + 2] = 50;
  }
  const std::string jpg = EncodeJpeg(flat);
  Image got;
  ASSERT_TRUE(DecodeImage(jpg, 3, "f.jpg", &got).ok());
  ASSERT_EQ(got.pixels.size(), flat.pixels.size());
  for (size_t i = 0; i < got.pixels.size(); ++i)
    EXPECT_NEAR(got.pixels[i], flat.pixels[i], 3) << i;
  ASSERT_TRUE(DecodeImage(jpg, 3, "f.jpg", &got, 4, 4).ok());
  EXPECT_EQ(got.width, 4);  // 1/4 of 16 still covers 4x4
  ASSERT_TRUE(DecodeImage(jpg, 1, "f.jpg", &got, 5, 5).ok());
  EXPECT_EQ(got.width, 8);
  EXPECT_EQ(got.channels, 1);
  int w = 0, h = 0;
  ASSERT_TRUE(ReadImageSize(jpg, "f.jpg", &w, &h).ok());
  EXPECT_EQ(w * 100 + h, 1616);
}

TEST(ImageTest, BadBytesAreNamedErrors) {
  Image got;
  const std::string png = EncodePng(Pattern(8, 8, 3));
  const std::string jpg = EncodeJpeg(Pattern(32, 32, 3));
  EXPECT_THAT(DecodeImage("GIF89a....", 3, "a.png", &got),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a.png: does not decode: neither PNG nor JPEG")));
  EXPECT_THAT(DecodeImage(png.substr(0, png.size() / 2), 3, "cut.png", &got),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cut.png: does not decode")));
  EXPECT_THAT(DecodeImage(jpg.substr(0, jpg.size() / 2), 3, "cut.jpg", &got),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cut.jpg: does not decode")));
  EXPECT_THAT(DecodeImage(jpg.substr(0, 20), 3, "head.jpg", &got),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("head.jpg: does not decode")));
}

TEST(ImageTest, FitCopiesCropsTheCentreAndStretches) {
  const Image im = Pattern(4, 2, 1);
  float out[8];
  ASSERT_TRUE(FitImage(im, ImageFit::kExact, 2, 4, "x", out).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], im.pixels[i] / 255.0f);
  // 4x2 cropped to 2x2: the middle two columns, no resampling.
  ASSERT_TRUE(FitImage(im, ImageFit::kCrop, 2, 2, "x", out).ok());
  EXPECT_FLOAT_EQ(out[0], im.pixels[1] / 255.0f);
  EXPECT_FLOAT_EQ(out[3], im.pixels[6] / 255.0f);
  // A flat image stays flat whatever the scale.
  const Image flat{9, 5, 3, std::vector<uint8_t>(9 * 5 * 3, 51)};
  std::vector<float> big(3 * 7 * 13);
  ASSERT_TRUE(FitImage(flat, ImageFit::kStretch, 7, 13, "x", big.data()).ok());
  for (float v : big) EXPECT_NEAR(v, 0.2f, 1e-6);
  ASSERT_TRUE(FitImage(flat, ImageFit::kCrop, 2, 3, "x", big.data()).ok());
  for (int i = 0; i < 18; ++i) EXPECT_NEAR(big[i], 0.2f, 1e-6);
  EXPECT_THAT(FitImage(im, ImageFit::kExact, 3, 3, "odd.png", out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("odd.png: 4x2 pixels; the samples are 3x3")));
}

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A directory of the test's own: ctest runs these tests as processes
    // side by side, and one's SetUp would empty another's folder.
    root_ = fs::path(::testing::TempDir()) /
            (std::string("image_folder_test_") +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() +
             "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Put(const std::string& rel, const std::string& bytes) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }

  fs::path root_;
};

TEST_F(ImageFolderTest, ListsClassesSortedAndFilesByPathAtAnyDepth) {
  Put("train/dog/b.png", EncodePng(Pattern(2, 2, 1)));
  Put("train/dog/a/z.JPG", EncodeJpeg(Pattern(8, 8, 1)));
  Put("train/dog/notes.txt", "not an image");
  Put("train/cat/c.jpeg", EncodeJpeg(Pattern(8, 8, 1)));
  auto l = ListImageFolder((root_ / "train").string());
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->classes, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(l->files.size(), 3u);
  EXPECT_THAT(l->files[1], HasSubstr("dog/a/z.JPG"));
  EXPECT_THAT(l->files[2], HasSubstr("dog/b.png"));
  EXPECT_EQ(l->labels, (std::vector<int32_t>{0, 1, 1}));
  // A test split's classes take the training split's labels.
  Put("test/dog/d.png", EncodePng(Pattern(2, 2, 1)));
  const std::vector<std::string> classes = l->classes;
  auto t = ListImageFolder((root_ / "test").string(), &classes);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->labels, (std::vector<int32_t>{1}));
  Put("test/cow/e.png", EncodePng(Pattern(2, 2, 1)));
  EXPECT_THAT(ListImageFolder((root_ / "test").string(), &classes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("class 'cow' is not one of the training")));
  Put("empty/none/readme.txt", "x");
  EXPECT_THAT(ListImageFolder((root_ / "empty").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("class 'none' holds no .png")));
  EXPECT_THAT(ListImageFolder((root_ / "missing").string()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
}

TEST_F(ImageFolderTest, GathersPixelsNormalisedAndSubstitutesBadFiles) {
  const Image a = Pattern(3, 2, 3);
  Put("tr/0/a.png", EncodePng(a));
  Put("tr/1/b.png", "broken");
  Put("tr/1/c.png", EncodePng(Pattern(3, 2, 3)));
  ImageFolderOptions o;
  o.shape = {3, 2, 3};
  o.fit = ImageFit::kExact;
  o.mean = {0.5f, 0.25f, 0.0f};
  o.std = {0.5f, 0.5f, 1.0f};
  auto l = ListImageFolder((root_ / "tr").string());
  ASSERT_TRUE(l.ok()) << l.status();
  auto f = ImageFolder::Open(*l, o, true);
  ASSERT_TRUE(f.ok()) << f.status();
  float x[18];
  int32_t y[1];
  const int64_t first[] = {0};
  ASSERT_TRUE((*f)->Gather(first, {}, x, y).ok());
  EXPECT_EQ(y[0], 0);
  // [C, H, W]: channel 1 of pixel (row 1, col 2) is byte (1 * 3 + 2) * 3 + 1.
  EXPECT_FLOAT_EQ(x[6 + 5], (a.pixels[16] / 255.0f - 0.25f) / 0.5f);
  const int64_t bad[] = {1};
  EXPECT_THAT((*f)->Gather(bad, {}, x, y),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b.png: does not decode")));
  o.skip_bad = true;
  auto skip = ImageFolder::Open(*l, o, true);
  ASSERT_TRUE(skip.ok());
  ASSERT_TRUE((*skip)->Gather(bad, {}, x, y).ok());
  EXPECT_EQ(y[0], 1);  // c.png, the next, stood in
  EXPECT_EQ((*skip)->substituted(), 1);
  EXPECT_GT((*skip)->bytes_read(), 0);
}

TEST_F(ImageFolderTest, AugmentationsAreDrawnPerSampleAndEpoch) {
  for (int i = 0; i < 8; ++i) {
    Put("tr/0/" + std::to_string(i) + ".png", EncodePng(Pattern(6, 6, 1)));
  }
  ImageFolderOptions o;
  o.shape = {1, 6, 6};
  o.crop_padding = 2;
  o.hflip = true;
  auto l = ListImageFolder((root_ / "tr").string());
  ASSERT_TRUE(l.ok());
  auto train = ImageFolder::Open(*l, o, true);
  auto test = ImageFolder::Open(*l, o, false);
  ASSERT_TRUE(train.ok() && test.ok());
  const int64_t all[] = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> plain(8 * 36), e0(8 * 36), again(8 * 36), e1(8 * 36);
  int32_t y[8];
  ASSERT_TRUE((*test)->Gather(all, {3, 0}, plain.data(), y).ok());
  ASSERT_TRUE((*train)->Gather(all, {3, 0}, e0.data(), y).ok());
  ASSERT_TRUE((*train)->Gather(all, {3, 0}, again.data(), y).ok());
  ASSERT_TRUE((*train)->Gather(all, {3, 1}, e1.data(), y).ok());
  EXPECT_EQ(e0, again);  // a rerun sees the same
  EXPECT_NE(e0, e1);     // another epoch, other draws
  EXPECT_NE(e0, plain);  // the test split is never augmented
  const std::vector<float> one(plain.begin(), plain.begin() + 36);
  for (int s = 0; s < 8; ++s) {
    EXPECT_EQ(std::vector<float>(plain.begin() + s * 36,
                                 plain.begin() + (s + 1) * 36),
              one);
  }
  // Each augmented sample is the image shifted by at most 2 and maybe
  // flipped, black (0) where the shift uncovers the padding.
  for (int s = 0; s < 8; ++s) {
    const float* got = e0.data() + s * 36;
    bool found = false;
    for (int flip = 0; flip < 2 && !found; ++flip) {
      for (int dy = -2; dy <= 2 && !found; ++dy) {
        for (int dx = -2; dx <= 2 && !found; ++dx) {
          bool same = true;
          for (int r = 0; r < 6 && same; ++r) {
            for (int c = 0; c < 6 && same; ++c) {
              const int sr = r + dy, sc = (flip ? 5 - c : c) + dx;
              const float want = sr >= 0 && sr < 6 && sc >= 0 && sc < 6
                                     ? one[sr * 6 + sc]
                                     : 0.0f;
              same = got[r * 6 + c] == want;
            }
          }
          found = same;
        }
      }
    }
    EXPECT_TRUE(found) << "sample " << s;
  }
}

}  // namespace
}  // namespace tally
