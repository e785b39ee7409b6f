#include "common/io/safetensors.h"

#include <cstring>
#include <filesystem>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<ParamInfo> Layout() {
  return {{"0.weight", {2, 3}, 0, 6},
          {"0.bias", {2}, 6, 2},
          {"2.weight", {1, 2}, 8, 2}};
}

TEST(SafetensorsTest, RoundTripThroughAFile) {
  const std::string dir = testing::TempDir("st");
  std::vector<float> flat(10);
  for (int i = 0; i < 10; ++i) flat[i] = i * 0.5f - 1.0f;
  TALLY_ASSERT_OK(SaveSafetensors(dir + "/m.safetensors", Layout(), flat.data(),
                                  {{"job", "x"}}));
  auto back = LoadSafetensors(dir + "/m.safetensors", Layout());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, flat);
  // No temporary file is left behind by the atomic write.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(WriteFileAtomicTest, PiecesLandBackToBackAndReplaceTheFile) {
  const std::string path = testing::TempDir("atomic") + "/f";
  TALLY_ASSERT_OK(WriteFileAtomic(path, "old contents"));
  TALLY_ASSERT_OK(WriteFileAtomic(path, {"ab", "", "cd"}));
  EXPECT_EQ(*ReadFile(path), "abcd");
  EXPECT_THAT(WriteFileAtomic("/nonexistent-dir/f", "x"),
              testing::StatusIs(absl::StatusCode::kUnavailable,
                                ::testing::HasSubstr("cannot create")));
}

TEST(SafetensorsTest, HeaderIsAlignedAndNamesShapes) {
  std::vector<float> flat(10, 1.0f);
  std::string bytes = EncodeSafetensors(Layout(), flat.data());
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 40);
  const std::string header = bytes.substr(8, n);
  EXPECT_THAT(header,
              HasSubstr("\"0.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                        "\"data_offsets\":[0,24]}"));
}

TEST(SafetensorsTest, ReadsFilesWrittenByPython) {
  TensorMap t = testing::LoadGolden("linear");
  ASSERT_TRUE(t.count("weight"));
  EXPECT_EQ(t.at("weight").shape, (Shape{3, 5}));
  EXPECT_EQ(t.at("weight").data.size(), 15u);
}

TEST(SafetensorsTest, MalformedInputIsRejectedNotCrashed) {
  EXPECT_THAT(
      DecodeSafetensors("abc"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shorter")));
  std::string huge(16, '\0');
  huge[0] = '\xff';
  huge[7] = '\x7f';
  EXPECT_THAT(
      DecodeSafetensors(huge),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds")));
  auto with_header = [](const std::string& json, size_t data_bytes) {
    std::string s(8, '\0');
    uint64_t n = json.size();
    std::memcpy(s.data(), &n, 8);
    return s + json + std::string(data_bytes, '\0');
  };
  EXPECT_THAT(DecodeSafetensors(with_header("{not json", 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("JSON")));
  EXPECT_THAT(
      DecodeSafetensors(with_header(
          R"({"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", 2)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F16")));
  EXPECT_THAT(
      DecodeSafetensors(with_header(
          R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data_offsets")));
  EXPECT_THAT(DecodeSafetensors(with_header(R"({"a":{"dtype":"F32"}})", 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs")));
}

TEST(SafetensorsTest, FlattenChecksNamesAndShapes) {
  std::vector<float> flat(10, 1.0f);
  auto map = DecodeSafetensors(EncodeSafetensors(Layout(), flat.data()));
  ASSERT_TRUE(map.ok());
  std::vector<ParamInfo> other = Layout();
  other[0].shape = {3, 2};
  EXPECT_THAT(
      FlattenTensors(*map, other),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape [2, 3]")));
  other = Layout();
  other[2].name = "3.weight";
  EXPECT_THAT(FlattenTensors(*map, other),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lack tensor '3.weight'")));
  EXPECT_THAT(LoadSafetensors("/nonexistent/x.safetensors", Layout()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent")));
}

}  // namespace
}  // namespace tally
