// The files a job spec names, opened as a worker must: regular files only
// and without blocking, link loops and directory links refused or not
// followed, sizes bounded, paths confined to the data roots, and no file's
// bytes in any message. Each case is a way a submitter once took a worker
// down or read its files.
#include "common/data/data_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/data/criteo.h"
#include "common/data/csv.h"
#include "common/data/image_folder.h"
#include "common/data/text.h"
#include "common/spec/job_spec.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "root:$6$s3cr3tHASH";

class DataFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tally_data_file_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }
  std::string Link(const std::string& name, const std::string& target) const {
    EXPECT_EQ(::symlink(target.c_str(), Path(name).c_str()), 0);
    return Path(name);
  }

  std::string dir_;
};

TEST_F(DataFileTest, OnlyRegularFilesOpenAndNothingBlocks) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A FIFO with no writer blocked the open for ever; now refused at once.
  EXPECT_THAT(DataFile::Open(fifo),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("not a regular file")));
  EXPECT_THAT(DataFile::Open("/dev/zero"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("/dev/zero: not a regular file")));
  EXPECT_THAT(DataFile::Open(dir_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("a directory")));
  EXPECT_THAT(DataFile::Open(Path("missing")),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  const std::string loop = Link("loop", "loop");
  EXPECT_THAT(DataFile::Open(loop),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  absl::StatusOr<DataFile> f = DataFile::Open(Write("a", "abc"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 3);
}

TEST_F(DataFileTest, AWholeReadIsBoundedBeforeAllocating) {
  const std::string big = Path("big");
  ASSERT_EQ(::truncate(Write("big", "").c_str(), int64_t{1} << 40), 0);  // sparse
  EXPECT_THAT(ReadWholeFile(big),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("a file read whole may hold at most")));
  EXPECT_THAT(ReadWholeFile(Write("small", "12345"), 4),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  EXPECT_EQ(*ReadWholeFile(Path("small")), "12345");
}

TEST_F(DataFileTest, ListingsNeverFollowDirectoryLinks) {
  ASSERT_EQ(::mkdir(Path("d").c_str(), 0700), 0);
  Write("d/f.png", "x");
  Link("d/a", ".");
  Link("d/b", ".");
  Link("d/g.png", Path("d/f.png"));
  Link("d/dangling", Path("nowhere"));
  absl::StatusOr<std::vector<DirEntry>> l = ListDirectory(Path("d"));
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->size(), 5u);
  EXPECT_EQ((*l)[0].name, "a");
  EXPECT_EQ((*l)[0].kind, DirEntry::Kind::kOther);
  EXPECT_EQ((*l)[3].name, "f.png");
  EXPECT_EQ((*l)[3].kind, DirEntry::Kind::kFile);
  EXPECT_EQ((*l)[4].kind, DirEntry::Kind::kLinkToFile);
  EXPECT_EQ((*l)[4].size, 1);
  EXPECT_THAT(ListDirectory(Path("d/f.png")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("not a directory")));
}

TEST_F(DataFileTest, AnImageFolderWithLinkCyclesListsOnce) {
  // A class directory holding a -> . and b -> . made the listing endless.
  ASSERT_EQ(::mkdir(Path("train").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(Path("train/cat").c_str(), 0700), 0);
  Write("train/cat/1.png", "not really a png");
  Link("train/cat/a", ".");
  Link("train/cat/b", ".");
  Link("train/dog", Path("train/cat"));  // a linked class: not followed
  absl::StatusOr<ImageFolderListing> l = ListImageFolder(Path("train"));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->classes, (std::vector<std::string>{"cat"}));
  EXPECT_EQ(l->files, (std::vector<std::string>{Path("train/cat/1.png")}));
}

TEST_F(DataFileTest, RootsConfineEveryPathAndLink) {
  ASSERT_EQ(::mkdir(Path("data").c_str(), 0700), 0);
  absl::StatusOr<DataRoots> roots = DataRoots::Make({Path("data")});
  ASSERT_TRUE(roots.ok()) << roots.status();
  const std::string in = Write("data/t.csv", "x,y\n1,0\n");
  EXPECT_TRUE(roots->Resolve("dataset.train", in).ok());
  EXPECT_THAT(roots->Resolve("dataset.train", "/etc/shadow"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("dataset.train: /etc/shadow is outside this "
                                 "worker's data roots")));
  // A link inside the roots to a file outside them is outside.
  Link("data/escape.csv", "/etc/passwd");
  EXPECT_THAT(roots->Resolve("dataset.train", Path("data/escape.csv")),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(roots->Resolve("dataset.train", Path("data/../t.csv")),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(roots->Resolve("dataset.train", Path("data/gone.csv")),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  Link("data/loop", "loop");
  EXPECT_THAT(roots->Resolve("dataset.train", Path("data/loop")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("a loop")));
  // A root's sibling with the root's name as its prefix is not inside.
  ASSERT_EQ(::mkdir(Path("database").c_str(), 0700), 0);
  EXPECT_THAT(roots->Resolve("x", Write("database/f", "1")),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  // Outside, a missing file and a present one get the same answer.
  EXPECT_THAT(roots->Resolve("x", "/nonexistent/f"),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(roots->Resolve("x", Path("data/../../nope")),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(DataRoots::Make({"relative/dir"}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_TRUE(DataRoots::Make({"/"})->Contains("/etc/shadow"));
}

TEST_F(DataFileTest, ASpecOutsideTheRootsFailsBeforeAnyOpen) {
  ASSERT_EQ(::mkdir(Path("data").c_str(), 0700), 0);
  absl::StatusOr<DataRoots> roots = DataRoots::Make({Path("data")});
  ASSERT_TRUE(roots.ok());
  DatasetSpec dataset;
  dataset.name = "criteo";
  dataset.criteo.train = {"/etc/shadow"};
  EXPECT_THAT(OpenDataset(dataset, *roots),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("dataset.train: /etc/shadow is outside")));
  dataset.criteo.train = {Path("data/*.tsv")};
  Write("data/a.tsv", "0\t1\n");
  Link("data/b.tsv", "/etc/passwd");  // a glob's match that escapes
  EXPECT_THAT(CheckDataPaths(dataset, *roots),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("b.tsv is outside")));
  // A pattern outside the roots is refused as written: its matches (names
  // on the worker's disk) never reach the message.
  dataset.criteo.train = {"/etc/pass*"};
  absl::Status s = CheckDataPaths(dataset, *roots);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                          HasSubstr("dataset.train: /etc/pass* is outside")));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("passwd")));
  ASSERT_EQ(::mkdir(Path("data/sub").c_str(), 0700), 0);
  dataset.criteo.train = {Path("data/*/../../../../etc/passw?")};
  EXPECT_THAT(CheckDataPaths(dataset, *roots),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  // A single-path field is opened as written, and checked as written.
  dataset.name = "csv";
  dataset.csv.train = Path("data/[t].csv");
  EXPECT_THAT(CheckDataPaths(dataset, *roots),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST_F(DataFileTest, CsvOfSpecialFilesFailsWithoutCrashOrHang) {
  CsvOptions o;
  o.label = "y";
  o.num_classes = 2;
  // /dev/zero was read whole until the worker died of bad_alloc.
  EXPECT_THAT(LoadCsv("/dev/zero", o),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("not a regular file")));
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(LoadCsv(fifo, o),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  // A link loop threw ELOOP out of std::filesystem and ended the worker.
  EXPECT_THAT(LoadCsv(Link("loop", "loop"), o),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

TEST_F(DataFileTest, MessagesNameFileLineAndColumnNeverTheBytes) {
  CsvOptions o;
  o.label = "y";
  o.num_classes = 2;
  const std::string csv =
      Write("t.csv", std::string("x,y\n1,0\n2,") + kSecret + "\n");
  absl::Status s = LoadCsv(csv, o).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr(csv + ":3:2: the label is not")));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("s3cr3t")));
  s = LoadCsv(Write("f.csv", std::string("x,y\n") + kSecret + ",1\n"), o)
          .status();
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("s3cr3t")));
  // A Criteo log that is really a password file.
  CriteoOptions c;
  c.files = {Write("shadow", std::string(kSecret) + ":19000:0:99999:7:::\n")};
  s = CriteoLines::Open(c).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("root")));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("s3cr3t")));
  TextOptions t;
  t.files = {Write("corpus", std::string(kSecret))};
  t.vocab = Write("vocab", "a\n");
  t.seq_len = 2;
  s = TextTokens::Open(t).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("0x72")));  // 'r'
}

}  // namespace
}  // namespace tally
