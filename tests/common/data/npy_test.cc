// NumPy .npy arrays read in place: headers of every version, the dtypes
// NumPy writes converted on the fly, and each bad input named by file and
// place. (tests/python_model_test.py's arrays phase reads files NumPy itself
// wrote.)
#include "common/data/npy.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

// A .npy file as NumPy writes it (version 1.0 unless `major` says), the
// dict padded so the values start at a multiple of 64.
std::string Npy(const std::string& descr, const std::string& shape,
                const std::string& values, int major = 1,
                const std::string& fortran = "False") {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + fortran +
                     ", 'shape': " + shape + ", }";
  const size_t pre = major == 1 ? 10 : 12;
  while ((pre + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) +
                    '\0';
  const uint32_t len = static_cast<uint32_t>(dict.size());
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(len >> 8);
  if (major != 1) out += std::string(2, '\0');
  return out + dict + values;
}

template <typename T>
std::string Raw(std::initializer_list<T> v) {
  std::string s(v.size() * sizeof(T), '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

class NpyTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("npy_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(NpyTest, HeadersOfEveryVersionAndTheirShapes) {
  for (int major : {1, 2, 3}) {
    auto h = ParseNpyHeader(Npy("<f4", "(3, 2)", Raw<float>({1, 2, 3, 4, 5, 6}),
                                major),
                            "x.npy");
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->type, NpyType::kF32);
    EXPECT_EQ(h->shape, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(h->data_offset % 64, 0);
  }
  auto one = ParseNpyHeader(Npy("|u1", "(5,)", "abcde"), "y.npy");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(one->width, 1);
  auto scalar = ParseNpyHeader(Npy("<i8", "()", Raw<int64_t>({7})), "s.npy");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->values(), 1);
}

TEST_F(NpyTest, BadHeadersAreNamedWithWhatIsWrong) {
  const std::string v = Raw<float>({1, 2});
  EXPECT_THAT(ParseNpyHeader("not numpy at all", "a.npy"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a.npy: not a .npy file Tally reads: no")));
  EXPECT_THAT(ParseNpyHeader(Npy(">f4", "(2,)", v), "b.npy"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("big-endian")));
  EXPECT_THAT(ParseNpyHeader(Npy("<f4", "(2,)", v, 1, "True"), "c.npy"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Fortran order")));
  EXPECT_THAT(ParseNpyHeader(Npy("<c8", "(2,)", v), "d.npy"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dtype '<c8'")));
  EXPECT_THAT(ParseNpyHeader(Npy("<f4", "(9999999999999999, 9999999999999999)", v),
                             "g.npy"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than 2^50 values")));
  EXPECT_THAT(ParseNpyHeader(Npy("<f4", "(2,)", v, 4), "e.npy"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("format version 4")));
  const std::string whole = Npy("<f4", "(2,)", v);
  EXPECT_THAT(ParseNpyHeader(whole.substr(0, 40), "f.npy"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("f.npy: its header says")));
}

TEST_F(NpyTest, ArraysConvertOnTheFlyAndReadOnlyWhatIsGathered) {
  // uint8 images scale to [0, 1] as LoadIdx's; float16 and int16 convert.
  const std::string x8 = Write("x8.npy", Npy("|u1", "(3, 2)", Raw<uint8_t>({0x00, 0xff, 0x33, 0x66, 0x99, 0xcc})));
  const std::string x16 = Write(
      "x16.npy", Npy("<f2", "(3, 2)", Raw<uint16_t>({0x3c00, 0xc000, 0x3800,
                                                     0x0001, 0x7bff, 0x0000})));
  const std::string xi = Write("xi.npy", Npy("<i2", "(3, 2)",
                                             Raw<int16_t>({-3, 4, 5, 6, 7, 8})));
  const std::string y = Write("y.npy", Npy("<i8", "(3,)", Raw<int64_t>({2, 0, 1})));
  for (const std::string& x : {x8, x16, xi}) {
    auto a = NpyArrays::Open({"", x, y}, {2}, 3);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->size(), 3);
    float got[4];
    int32_t labels[2];
    const int64_t order[] = {2, 0};
    ASSERT_TRUE((*a)->Gather(order, {}, got, labels).ok());
    EXPECT_EQ(labels[0], 1);
    EXPECT_EQ(labels[1], 2);
    if (x == x8) {
      EXPECT_EQ(got[0], 0x99 / 255.0f);
      EXPECT_EQ(got[3], 1.0f);
    } else if (x == x16) {
      EXPECT_EQ(got[0], 65504.0f);  // the largest half
      EXPECT_EQ(got[1], 0.0f);
      EXPECT_EQ(got[2], 1.0f);
      EXPECT_EQ(got[3], -2.0f);
    } else {
      EXPECT_EQ(got[0], 7.0f);
      EXPECT_EQ(got[2], -3.0f);
    }
  }
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // subnormal
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
}

TEST_F(NpyTest, EveryBadDatasetIsNamedByFileAndPlace) {
  const std::string x = Write("x.npy", Npy("<f4", "(2, 2)", Raw<float>({1, 2, 3, 4})));
  const std::string y = Write("y.npy", Npy("|u1", "(2,)", Raw<uint8_t>({1, 0})));
  EXPECT_THAT(NpyArrays::Open({"", (dir_ / "none.npy").string(), y}, {2}, 2),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("none.npy")));
  const std::string cut =
      Write("cut.npy", Npy("<f4", "(2, 2)", Raw<float>({1, 2, 3})));
  EXPECT_THAT(NpyArrays::Open({"", cut, y}, {2}, 2),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("cut.npy: its header says 4 values of 4 "
                                 "bytes, the file holds 12")));
  EXPECT_THAT(NpyArrays::Open({"", x, y}, {3}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("inputs of shape [2, 2]; the job's samples "
                                 "are [3]")));
  const std::string three = Write("y3.npy", Npy("|u1", "(3,)", Raw<uint8_t>({1, 0, 1})));
  EXPECT_THAT(NpyArrays::Open({"", x, three}, {2}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds 2 samples, " + three + " 3 labels")));
  const std::string big = Write("ybig.npy", Npy("<i4", "(2,)", Raw<int32_t>({1, 7})));
  EXPECT_THAT(NpyArrays::Open({"", x, big}, {2}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("label 7 of sample 1 is outside [0, 2)")));
  const std::string fl = Write("yf.npy", Npy("<f4", "(2,)", Raw<float>({1, 0})));
  EXPECT_THAT(NpyArrays::Open({"", x, fl}, {2}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("floating dtype")));
}

TEST_F(NpyTest, AGlobOfShardsIsOneSplitInSortedOrder) {
  Write("sx_1.npy", Npy("<f4", "(1, 2)", Raw<float>({5, 6})));
  Write("sx_0.npy", Npy("<f4", "(2, 2)", Raw<float>({1, 2, 3, 4})));
  Write("sy_0.npy", Npy("|u1", "(2,)", Raw<uint8_t>({0, 1})));
  Write("sy_1.npy", Npy("|u1", "(1,)", Raw<uint8_t>({2})));
  const std::string xs = (dir_ / "sx_*.npy").string();
  const std::string ys = (dir_ / "sy_*.npy").string();
  auto a = NpyArrays::Open({"", xs, ys}, {2}, 3);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->size(), 3);
  float x[6];
  int32_t y[3];
  const int64_t order[] = {2, 0, 1};
  ASSERT_TRUE((*a)->Gather(order, {}, x, y).ok());
  EXPECT_EQ(std::vector<float>(x, x + 6), (std::vector<float>{5, 6, 1, 2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(y, y + 3), (std::vector<int32_t>{2, 0, 1}));
  Fingerprint f;
  (*a)->Describe(&f);
  EXPECT_THAT(f.Text(), HasSubstr("4 files, "));
  // A shard whose labels are fewer than its inputs, and globs of other sizes.
  Write("sy_1.npy", Npy("|u1", "(2,)", Raw<uint8_t>({2, 2})));
  EXPECT_THAT(NpyArrays::Open({"", xs, ys}, {2}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sx_1.npy holds 1 samples, ")));
  Write("sy_2.npy", Npy("|u1", "(1,)", Raw<uint8_t>({2})));
  EXPECT_THAT(NpyArrays::Open({"", xs, ys}, {2}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("matches 2 files, " + ys + " 3")));
  EXPECT_THAT(NpyArrays::Open({"", (dir_ / "none*.npy").string(), ys}, {2}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("none*.npy: the pattern matches no file")));
}

}  // namespace
}  // namespace tally
