#include "common/spec/internal/yaml_fields.h"

#include <yaml-cpp/yaml.h>

#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally::spec_internal {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

TEST(YamlFieldsTest, JoinNamesTheTopLevelWithoutADot) {
  EXPECT_EQ(Join("", "name"), "name");
  EXPECT_EQ(Join("training", "epochs"), "training.epochs");
}

TEST(YamlFieldsTest, CheckKeysNamesTheUnknownKeyAndTheKnownOnes) {
  const YAML::Node n = YAML::Load("{epochs: 1, epoch: 2}");
  EXPECT_THAT(CheckKeys(n, "training", {"epochs", "seed"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("training.epoch: unknown field (known: "
                                 "epochs, seed)")));
  EXPECT_TRUE(CheckKeys(n, "training", {"epochs", "epoch"}).ok());
  EXPECT_THAT(CheckKeys(YAML::Load("[1]"), "", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("document: must be a mapping")));
}

TEST(YamlFieldsTest, ReadIntKeepsTheDefaultWhenMissingAndChecksTheRange) {
  const YAML::Node n = YAML::Load("{a: 5, b: 50, c: x}");
  int64_t v = 7;
  EXPECT_TRUE(ReadInt(n, "p", "missing", 0, 10, &v).ok());
  EXPECT_EQ(v, 7);
  EXPECT_TRUE(ReadInt(n, "p", "a", 0, 10, &v).ok());
  EXPECT_EQ(v, 5);
  EXPECT_THAT(ReadInt(n, "p", "b", 0, 10, &v),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("p.b: must be in [0, 10], got 50")));
  EXPECT_THAT(ReadInt(n, "p", "c", 0, 10, &v),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("p.c: must be an integer, got 'x'")));
  EXPECT_EQ(v, 5);
}

TEST(YamlFieldsTest, ReadDoubleBoolAndStringCheckTheirTypes) {
  const YAML::Node n = YAML::Load("{d: .inf, b: maybe, s: [1], ok: 0.5}");
  double d = 0;
  bool b = false;
  std::string s;
  EXPECT_THAT(ReadDouble(n, "", "d", &d),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("d: must be a finite number")));
  EXPECT_TRUE(ReadDouble(n, "", "ok", &d).ok());
  EXPECT_EQ(d, 0.5);
  EXPECT_THAT(ReadBool(n, "x", "b", &b),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("x.b: must be true or false")));
  EXPECT_THAT(ReadString(n, "x", "s", &s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("x.s: must be a string")));
}

TEST(YamlFieldsTest, ReadShapeAppendsSizesWithinBounds) {
  Shape shape;
  EXPECT_TRUE(ReadShape(YAML::Load("[3, 0]"), "t.shape", 0, &shape).ok());
  EXPECT_EQ(shape, (Shape{3, 0}));
  Shape refused;
  EXPECT_THAT(ReadShape(YAML::Load("[3, 0]"), "t.shape", 1, &refused),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.shape: sizes must be in [1, ")));
  EXPECT_THAT(ReadShape(YAML::Node(), "t.shape", 1, &refused),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at most 8 sizes")));
}

}  // namespace
}  // namespace tally::spec_internal
