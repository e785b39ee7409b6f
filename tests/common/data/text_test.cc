// Text corpora: byte-level and vocabulary tokens, windows of seq_len + 1
// across file boundaries, the split by fraction of the stream, and errors
// that name the file and the place.
#include "common/data/text.h"

#include <fstream>
#include <numeric>

#include "common/spec/job_spec.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

class TextTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::tally::testing::TempDir("text_test"); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // Every window of `source`, as (inputs, labels).
  static void All(const TextTokens& t, int64_t seq_len,
                  std::vector<int64_t>* x, std::vector<int32_t>* y) {
    std::vector<int64_t> all(static_cast<size_t>(t.size()));
    std::iota(all.begin(), all.end(), 0);
    x->assign(all.size() * seq_len, -1);
    y->assign(all.size() * seq_len, -1);
    ASSERT_TRUE(t.GatherIds(all, {}, x->data(), y->data()).ok());
  }
  std::string dir_;
};

TEST_F(TextTest, ByteWindowsSpanFilesAndShiftTheirLabelsByOne) {
  TextOptions o;
  o.files = {Write("a.txt", "abcde"), Write("b.txt", "fghij")};
  o.seq_len = 2;  // windows of 3: abc def ghi, and j left out
  auto t = TextTokens::Open(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->size(), 3);
  EXPECT_EQ((*t)->vocabulary(), 256);
  EXPECT_EQ((*t)->input_type(), InputType::kInt64);
  std::vector<int64_t> x;
  std::vector<int32_t> y;
  All(**t, 2, &x, &y);
  EXPECT_EQ(x, (std::vector<int64_t>{'a', 'b', 'd', 'e', 'g', 'h'}));
  EXPECT_EQ(y, (std::vector<int32_t>{'b', 'c', 'e', 'f', 'h', 'i'}));
  // Gathered in any order, a window is the same.
  std::vector<int64_t> one(2);
  std::vector<int32_t> next(2);
  const int64_t second[] = {1};
  ASSERT_TRUE((*t)->GatherIds(second, {}, one.data(), next.data()).ok());
  EXPECT_EQ(one, (std::vector<int64_t>{'d', 'e'}));
  EXPECT_EQ(next, (std::vector<int32_t>{'e', 'f'}));
  EXPECT_EQ((*t)->bytes_read(), 4 * 3);
  float f = 0;
  int32_t l = 0;
  EXPECT_THAT((*t)->Gather(second, {}, &f, &l),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("token ids")));
}

TEST_F(TextTest, BytesAbove127AreTokensOfTheirOwn) {
  TextOptions o;
  o.files = {Write("u.txt", std::string("\xc3\xa9\xff\x00", 4))};  // é, 0xff, NUL
  o.seq_len = 3;
  auto t = TextTokens::Open(o);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int64_t> x;
  std::vector<int32_t> y;
  All(**t, 3, &x, &y);
  EXPECT_EQ(x, (std::vector<int64_t>{0xc3, 0xa9, 0xff}));
  EXPECT_EQ(y, (std::vector<int32_t>{0xa9, 0xff, 0x00}));
}

TEST_F(TextTest, TheSplitCutsTheStreamAtOnePlace) {
  std::string text(100, 'a');
  for (int i = 0; i < 100; ++i) text[i] = static_cast<char>(i);
  TextOptions o;
  o.files = {Write("s.txt", text)};
  o.seq_len = 4;
  o.end = 0.8;
  auto train = TextTokens::Open(o);
  o.begin = 0.8;
  o.end = 1.0;
  auto test = TextTokens::Open(o);
  ASSERT_TRUE(train.ok() && test.ok());
  EXPECT_EQ((*train)->tokens(), 80);
  EXPECT_EQ((*train)->size(), 16);
  EXPECT_EQ((*test)->tokens(), 20);
  EXPECT_EQ((*test)->size(), 4);
  std::vector<int64_t> x;
  std::vector<int32_t> y;
  All(**test, 4, &x, &y);
  EXPECT_EQ(x.front(), 80);  // the test split starts where training ends
  EXPECT_EQ(y.back(), 99);
}

TEST_F(TextTest, AVocabularyTokenizesByTheLongestMatch) {
  auto v = Vocabulary::Parse("a\nab\nabc\nb\n\\s\n\\n\n\\x00\n", "v.txt");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->size(), 7);
  std::vector<int32_t> ids;
  ASSERT_TRUE(v->Tokenize(std::string("abcab b\na\0", 10), "t.txt", 0, &ids)
                  .ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 1, 4, 3, 5, 0, 6}));
}

TEST_F(TextTest, AVocabularyStreamAcrossFiles) {
  TextOptions o;
  o.vocab = Write("v.txt", "the\\s\ncat\n.\n<unk>\n");
  o.files = {Write("a.txt", "the cat."), Write("b.txt", "the !cat")};
  o.seq_len = 2;
  auto t = TextTokens::Open(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocabulary(), 4);
  // "the " cat . | "the " <unk> cat: '!' starts no token.
  EXPECT_EQ((*t)->tokens(), 6);
  std::vector<int64_t> x;
  std::vector<int32_t> y;
  All(**t, 2, &x, &y);
  EXPECT_EQ(x, (std::vector<int64_t>{0, 1, 0, 3}));
  EXPECT_EQ(y, (std::vector<int32_t>{1, 2, 3, 1}));
}

TEST_F(TextTest, BadVocabulariesAndTextAreNamed) {
  EXPECT_THAT(Vocabulary::Parse("a\n\nb\n", "v.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("v.txt:2: an empty line")));
  EXPECT_THAT(Vocabulary::Parse("a\nb\na\n", "v.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("v.txt:3: the token of line 1 again")));
  EXPECT_THAT(Vocabulary::Parse("a\\q\n", "v.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("v.txt:1:2: an unknown escape")));
  EXPECT_THAT(Vocabulary::Parse("\\x4\n", "v.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("v.txt:1: \\x needs two hex digits")));
  EXPECT_THAT(Vocabulary::Parse("", "v.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("v.txt: no tokens")));
  auto v = Vocabulary::Parse("a\nb\n", "v.txt");
  ASSERT_TRUE(v.ok());
  std::vector<int32_t> ids;
  EXPECT_THAT(v->Tokenize("abba!", "t.txt", 100, &ids),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.txt: byte 104 starts no token")));
  TextOptions o;
  o.files = {dir_ + "/missing.txt"};
  EXPECT_THAT(TextTokens::Open(o),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.txt")));
  o.files = {Write("t.txt", "abc!")};
  o.vocab = Write("v.txt", "a\nb\nc\n");
  EXPECT_THAT(TextTokens::Open(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("t.txt: byte 3 starts no token")));
}

// The spec's text dataset opened as a worker opens it: its windows counted
// against the submitted train_size, the test split held out at the end.
TEST_F(TextTest, OpenDatasetChecksTheSubmittedCounts) {
  const std::string corpus = Write("c.txt", std::string(1000, 'x'));
  JobSpec spec;
  spec.dataset.name = "text";
  spec.dataset.text.train = {corpus};
  spec.dataset.text.seq_len = 9;
  spec.dataset.text.test_fraction = 0.1;
  spec.dataset.text.train_size = 90;  // 900 tokens / 10
  auto d = OpenDataset(spec.dataset, DataRoots::Any());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.size(), 90);
  EXPECT_EQ(d->test.size(), 10);
  EXPECT_EQ(d->train.input_type, InputType::kInt64);
  EXPECT_EQ(d->train.label_shape, (Shape{9}));
  EXPECT_EQ(d->train.num_classes, 256);
  EXPECT_FALSE(d->fingerprint.empty());
  spec.dataset.text.train_size = 91;
  EXPECT_THAT(OpenDataset(spec.dataset, DataRoots::Any()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("hold 90 training windows of 10 tokens (900 "
                                 "tokens); the job was submitted with "
                                 "dataset.train_size 91")));
  spec.dataset.text.train = {dir_ + "/none-*.txt"};
  EXPECT_THAT(OpenDataset(spec.dataset, DataRoots::Any()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("none-*.txt: the pattern matches no file")));
}

}  // namespace
}  // namespace tally
