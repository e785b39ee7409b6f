#include "common/data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

std::string Be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
          static_cast<char>(v >> 8), static_cast<char>(v)};
}

void WriteGz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()),
            static_cast<int>(bytes.size()));
  gzclose(f);
}

void WritePlain(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Images(uint32_t n, uint32_t r, uint32_t c, uint32_t magic = 0x803) {
  std::string s = Be32(magic) + Be32(n) + Be32(r) + Be32(c);
  for (uint32_t i = 0; i < n * r * c; ++i)
    s.push_back(static_cast<char>(i * 51 % 256));
  return s;
}

std::string Labels(std::vector<uint8_t> labels) {
  std::string s = Be32(0x801) + Be32(labels.size());
  for (uint8_t l : labels) s.push_back(static_cast<char>(l));
  return s;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::TempDir("idx"); }
  std::string Path(const std::string& name) { return dir_ + "/" + name; }
  std::string dir_;
};

TEST_F(IdxTest, ReadsGzipAndPlainFilesScaledToUnitRange) {
  WriteGz(Path("img.gz"), Images(3, 2, 2));
  WriteGz(Path("lab.gz"), Labels({0, 9, 4}));
  auto d = LoadIdx(Path("img.gz"), Path("lab.gz"), 10);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 3);
  EXPECT_EQ(d->sample_shape, (Shape{1, 2, 2}));
  EXPECT_EQ(d->labels, (std::vector<int32_t>{0, 9, 4}));
  EXPECT_FLOAT_EQ(d->features[1], 51.0f / 255.0f);
  EXPECT_FLOAT_EQ(d->features[5], (5 * 51 % 256) / 255.0f);

  WritePlain(Path("img"), Images(3, 2, 2));
  WritePlain(Path("lab"), Labels({0, 9, 4}));
  auto plain = LoadIdx(Path("img"), Path("lab"), 10);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->features, d->features);
}

TEST_F(IdxTest, TruncatedGzipNamesTheFile) {
  std::string whole = Images(50, 8, 8);
  WriteGz(Path("full.gz"), whole);
  std::string gz;
  {
    std::ifstream in(Path("full.gz"), std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), {});
  }
  WritePlain(Path("cut.gz"), gz.substr(0, gz.size() / 2));
  WriteGz(Path("lab.gz"), Labels(std::vector<uint8_t>(50, 1)));
  EXPECT_THAT(LoadIdx(Path("cut.gz"), Path("lab.gz"), 10),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(Path("cut.gz"))));
}

TEST_F(IdxTest, TruncatedPayloadIsDataLoss) {
  std::string img = Images(4, 3, 3);
  WriteGz(Path("img.gz"), img.substr(0, img.size() - 5));
  WriteGz(Path("lab.gz"), Labels({1, 2, 3, 4}));
  EXPECT_THAT(
      LoadIdx(Path("img.gz"), Path("lab.gz"), 10),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("img.gz: truncated: header promises 36 bytes")));
}

TEST_F(IdxTest, WrongMagicIsInvalidArgument) {
  WriteGz(Path("img.gz"), Images(2, 2, 2, 0x801));
  WriteGz(Path("lab.gz"), Labels({1, 2}));
  EXPECT_THAT(LoadIdx(Path("img.gz"), Path("lab.gz"), 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("img.gz: wrong magic number (expected 0x00000803)")));
}

TEST_F(IdxTest, MismatchedCountsAndBadLabelsAreReported) {
  WriteGz(Path("img.gz"), Images(2, 2, 2));
  WriteGz(Path("lab.gz"), Labels({1, 2, 3}));
  EXPECT_THAT(LoadIdx(Path("img.gz"), Path("lab.gz"), 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds 2 images")));
  WriteGz(Path("lab2.gz"), Labels({1, 12}));
  EXPECT_THAT(LoadIdx(Path("img.gz"), Path("lab2.gz"), 10),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("label 12")));
  EXPECT_THAT(LoadIdx(Path("missing.gz"), Path("lab.gz"), 10),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.gz")));
}

TEST(FashionMnistTest, LoadsDebianCopy) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(root + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  auto tt = LoadFashionMnist(root, /*normalize=*/true);
  ASSERT_TRUE(tt.ok()) << tt.status();
  EXPECT_EQ(tt->train.size(), 60000);
  EXPECT_EQ(tt->test.size(), 10000);
  EXPECT_EQ(tt->train.sample_shape, (Shape{1, 28, 28}));
  double mean = 0;
  for (float v : tt->train.features) mean += v;
  mean /= tt->train.features.size();
  EXPECT_NEAR(mean, 0.0, 0.01);  // standardised with the training mean
}

TEST(SyntheticTest, DeterministicBySeedAndLabelsUseAllClasses) {
  SyntheticOptions o;
  o.train_size = 2000;
  o.test_size = 100;
  o.features = 16;
  o.num_classes = 4;
  auto a = MakeSynthetic(o);
  auto b = MakeSynthetic(o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->train.features, b->train.features);
  EXPECT_EQ(a->train.labels, b->train.labels);
  o.seed = 2;
  auto c = MakeSynthetic(o);
  EXPECT_NE(a->train.labels, c->train.labels);
  std::vector<int> counts(4);
  for (int32_t l : a->train.labels) counts[l]++;
  for (int k = 0; k < 4; ++k) EXPECT_GT(counts[k], 100) << "class " << k;
  o.num_classes = 1;
  EXPECT_THAT(MakeSynthetic(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("classes")));
}

TEST(EpochOrderTest, EverySampleOncePerEpochAcrossTheWorld) {
  for (int world : {1, 2, 3, 7}) {
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> all;
      size_t min_size = 1000, max_size = 0;
      for (int rank = 0; rank < world; ++rank) {
        auto mine = EpochOrder(100, 5, epoch, rank, world);
        min_size = std::min(min_size, mine.size());
        max_size = std::max(max_size, mine.size());
        all.insert(all.end(), mine.begin(), mine.end());
      }
      std::sort(all.begin(), all.end());
      ASSERT_EQ(all.size(), 100u);
      for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(all[i], i);
      EXPECT_LE(max_size - min_size, 1u);
    }
  }
  EXPECT_EQ(EpochOrder(100, 5, 1, 0, 2), EpochOrder(100, 5, 1, 0, 2));
  EXPECT_NE(EpochOrder(100, 5, 1, 0, 2), EpochOrder(100, 5, 2, 0, 2));
  EXPECT_NE(EpochOrder(100, 5, 1), EpochOrder(100, 6, 1));
}

TEST(GatherTest, CopiesRowsAndLabels) {
  Dataset d;
  d.sample_shape = {2};
  d.num_classes = 3;
  d.features = {0, 1, 10, 11, 20, 21};
  d.labels = {0, 1, 2};
  std::vector<int64_t> idx = {2, 0};
  float x[4];
  int32_t y[2];
  ASSERT_TRUE(d.Gather(idx, x, y).ok());
  EXPECT_EQ(x[0], 20);
  EXPECT_EQ(x[3], 1);
  EXPECT_EQ(y[0], 2);
  EXPECT_EQ(y[1], 0);
}

}  // namespace
}  // namespace tally
