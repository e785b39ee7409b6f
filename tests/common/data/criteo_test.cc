// Criteo's tab-separated click logs (dataset.name: criteo).
#include "common/data/criteo.h"

#include <unistd.h>

#include <fstream>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

class CriteoTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::tally::testing::TempDir("criteo_test"); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static std::vector<int64_t> Every(const CriteoLines& c) {
    std::vector<int64_t> all(static_cast<size_t>(c.size()));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  std::string dir_;
};

TEST_F(CriteoTest, ALineIsLabelIntegersThenHexIdsWithMissingAsZero) {
  int64_t x[6];
  int32_t y = -1;
  TALLY_ASSERT_OK(
      ParseCriteoLine("1\t5\t-2\t\t68fd1e64\t\t0000000F", 3, 3, x, &y));
  EXPECT_EQ(y, 1);
  EXPECT_THAT(std::vector<int64_t>(x, x + 6),
              ::testing::ElementsAre(5, -2, 0, 0x68fd1e64, 0, 15));
  int64_t z[6];
  TALLY_ASSERT_OK(ParseCriteoLine("0\t5\t-2\t\t68fd1e64\t\t0000000F\r", 3, 3,
                                  z, &y));
  EXPECT_EQ(y, 0);
  EXPECT_EQ(z[5], 15);
  EXPECT_EQ(z[4], 0);  // missing category
  // 16 digits: the id's 64 bits.
  TALLY_ASSERT_OK(ParseCriteoLine("0\t\tffffffffffffffff", 1, 1, z, &y));
  EXPECT_EQ(z[1], -1);
}

TEST_F(CriteoTest, BadLinesSayWhichField) {
  int64_t x[4];
  int32_t y;
  EXPECT_THAT(ParseCriteoLine("2\t1\t1\tab", 2, 1, x, &y),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field 1 (the label) is not 0 or 1")));
  EXPECT_THAT(ParseCriteoLine("1\t1\tx1\tab", 2, 1, x, &y),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field 3 (I2) is not a decimal integer")));
  EXPECT_THAT(ParseCriteoLine("1\t1\t1\tzz", 2, 1, x, &y),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field 4 (C1) is not 1 to 16 hexadecimal")));
  EXPECT_THAT(ParseCriteoLine("1\t1\t1", 2, 1, x, &y),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 tab-separated fields, not 4")));
  EXPECT_THAT(ParseCriteoLine("1\t1\t1\tab\tcd", 2, 1, x, &y),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("5 tab-separated fields, not 4")));
  EXPECT_THAT(ParseCriteoLine("", 2, 1, x, &y),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("an empty line")));
  EXPECT_THAT(ParseCriteoLine("1\t1\t1\t11223344556677889", 2, 1, x, &y),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not 1 to 16 hexadecimal digits")));
}

TEST_F(CriteoTest, FilesAreOneStreamSplitByFraction) {
  CriteoOptions o;
  o.integer_features = 1;
  o.categorical_features = 1;
  // Five lines over two files, the last without its newline.
  o.files = {Write("a.tsv", "0\t1\ta\n1\t2\tb\n1\t3\tc\n"),
             Write("b.tsv", "0\t4\td\n1\t\t")};
  o.end = 0.6;  // lines [0, 3)
  auto train = CriteoLines::Open(o);
  TALLY_ASSERT_OK(train.status());
  EXPECT_EQ((*train)->size(), 3);
  EXPECT_EQ((*train)->lines(), 5);
  o.begin = 0.6;
  o.end = 1.0;
  auto test = CriteoLines::Open(o);
  TALLY_ASSERT_OK(test.status());
  ASSERT_EQ((*test)->size(), 2);
  std::vector<int64_t> x(4);
  std::vector<int32_t> y(2);
  TALLY_ASSERT_OK((*test)->GatherIds(Every(**test), {}, x.data(), y.data()));
  EXPECT_THAT(x, ::testing::ElementsAre(4, 0xd, 0, 0));
  EXPECT_THAT(y, ::testing::ElementsAre(0, 1));
  // Shuffled indices gather their own lines.
  std::vector<int64_t> order = {2, 0};
  TALLY_ASSERT_OK((*train)->GatherIds(order, {}, x.data(), y.data()));
  EXPECT_THAT(x, ::testing::ElementsAre(3, 0xc, 1, 0xa));
  EXPECT_THAT(y, ::testing::ElementsAre(1, 0));
}

TEST_F(CriteoTest, OpeningChecksEveryLineOfItsSplit) {
  CriteoOptions o;
  o.integer_features = 1;
  o.categorical_features = 1;
  o.files = {Write("a.tsv", "0\t1\ta\n1\t2\tb\n"),
             Write("b.tsv", "0\t4\td\n1\t5\n")};
  EXPECT_THAT(CriteoLines::Open(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b.tsv:2: 2 tab-separated fields, not 3")));
  o.end = 0.5;  // the bad line is the test split's: this split opens
  TALLY_EXPECT_OK(CriteoLines::Open(o).status());
  o.files = {dir_ + "/missing.tsv"};
  EXPECT_THAT(CriteoLines::Open(o), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such file")));
  o.files = {Write("c.tsv.gz", "x")};
  EXPECT_THAT(CriteoLines::Open(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gunzip it first")));
  // A file of no lines (a sparse 64 GiB one) is refused at its first MiB,
  // not read to its end.
  const std::string sparse = Write("d.tsv", "0\t1\ta\n");
  ASSERT_EQ(::truncate(sparse.c_str(), int64_t{1} << 36), 0);
  o.files = {sparse};
  o.end = 1.0;
  EXPECT_THAT(CriteoLines::Open(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("d.tsv:2: a line over 1048576 bytes")));
}

}  // namespace
}  // namespace tally
