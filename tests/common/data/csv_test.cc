// CSV tables: the label and feature columns by name, numbers converted as
// written, and every bad cell named by file, line and column.
#include "common/data/csv.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CsvTest, ColumnsByNameInTheirOrder) {
  const char* text =
      "a, label ,b,c\n"
      "1.5,2,-3,\"4e2\"\n"
      " 0 ,0, 7 ,0.25\r\n"
      "\n";
  CsvOptions o;
  o.label = "label";
  o.num_classes = 3;
  auto all = ParseCsv(text, "t.csv", o);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->sample_shape, (Shape{3}));
  EXPECT_EQ(all->labels, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(all->features,
            (std::vector<float>{1.5f, -3, 400, 0, 7, 0.25f}));
  o.features = {"c", "a"};
  auto some = ParseCsv(text, "t.csv", o);
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->features, (std::vector<float>{400, 1.5f, 0.25f, 0}));
}

TEST(CsvTest, EveryBadCellIsNamedByLineAndColumn) {
  CsvOptions o;
  o.label = "y";
  o.num_classes = 2;
  EXPECT_THAT(ParseCsv("x,y\n1,0\n2,abc\n", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.csv:3:2: the label is not an integer "
                                 "in [0, 2)")));
  EXPECT_THAT(ParseCsv("x,y\n1,0\n2,2\n", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.csv:3:2: the label is not")));
  EXPECT_THAT(ParseCsv("x,y\n1,0\nnan?,1\n", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.csv:3:1: not a number")));
  EXPECT_THAT(ParseCsv("x,y\n1,0\ninf,1\n", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.csv:3:1: not a number")));
  EXPECT_THAT(ParseCsv("x,y\n1,0,5\n", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.csv:2:1: 3 cells; the header has 2")));
  EXPECT_THAT(ParseCsv("x,z\n1,0\n", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.csv:1:1: the header has no column 'y'")));
  EXPECT_THAT(ParseCsv("x,y,x\n1,0,2\n", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.csv:1:3: a second column of the same name")));
  o.features = {"x", "y"};
  EXPECT_THAT(ParseCsv("x,y\n1,0\n", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.csv:1:2: 'y' is the label, not a feature")));
  o.features.clear();
  EXPECT_THAT(ParseCsv("", "t.csv", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no header row")));
  EXPECT_THAT(LoadCsv("/nonexistent/t.csv", o),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such file")));
}

}  // namespace
}  // namespace tally
