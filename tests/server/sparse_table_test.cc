// Sparse embedding tables on a parameter shard: where rows live, their
// initial values, the rows a step applies, and every refusal.
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/io/safetensors.h"
#include "common/spec/embedding.h"
#include "gtest/gtest.h"
#include "server/data/shard.h"
#include "server/data/sparse_table.h"
#include "server/data/table_checkpoint.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

EmbeddingTableSpec Table(const std::string& name, int64_t rows, int64_t dim,
                         TableOptimizer::Type type = TableOptimizer::Type::kSgd) {
  EmbeddingTableSpec t;
  t.name = name;
  t.num_embeddings = rows;
  t.dim = dim;
  t.salt = TableSalt(name);
  t.optimizer.type = type;
  t.optimizer.lr = 0.5;
  return t;
}

TEST(EmbeddingTest, RowsBucketsAndSlotsAreStableAndSpread) {
  const uint64_t salt = TableSalt("user");
  EXPECT_NE(salt, TableSalt("item"));
  std::set<int64_t> rows;
  std::vector<int> per_slot(3, 0);
  for (int64_t id = 0; id < 30000; ++id) {
    const int64_t r = HashedRow(id * 7919 + (int64_t{1} << 40), salt, 1000);
    ASSERT_GE(r, 0);
    ASSERT_LT(r, 1000);
    rows.insert(r);
    EXPECT_EQ(r, HashedRow(id * 7919 + (int64_t{1} << 40), salt, 1000));
    ++per_slot[SlotOfRow(id, salt, 3)];
  }
  EXPECT_EQ(rows.size(), 1000u);  // every row is some id's
  for (int n : per_slot) EXPECT_NEAR(n, 10000, 600);
  // Slots own contiguous runs of buckets, all of them, once.
  EXPECT_EQ(SlotOfBucket(0, 3), 0);
  EXPECT_EQ(SlotOfBucket(kTableBuckets - 1, 3), 2);
  for (int b = 1; b < kTableBuckets; ++b)
    EXPECT_LE(SlotOfBucket(b - 1, 3), SlotOfBucket(b, 3));
}

TEST(EmbeddingTest, InitialRowsDependOnSeedTableAndRowOnly) {
  EmbeddingTableSpec t = Table("emb", 1 << 20, 64);
  std::vector<float> a(64), b(64), c(64);
  InitRow(t, 7, 12345, a.data());
  InitRow(t, 7, 12345, b.data());
  EXPECT_EQ(a, b);
  InitRow(t, 8, 12345, c.data());
  EXPECT_NE(a, c);
  // N(0, 1), as nn.Embedding's: over 64k values the mean and variance.
  double sum = 0, sq = 0;
  std::vector<float> row(64);
  for (int64_t r = 0; r < 1024; ++r) {
    InitRow(t, 7, r, row.data());
    for (float v : row) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sq += double(v) * v;
    }
  }
  const double n = 1024.0 * 64;
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(sq / n, 1.0, 0.03);
  t.init = TableInit::kUniform;
  t.init_scale = 0.25;
  for (int64_t r = 0; r < 256; ++r) {
    InitRow(t, 7, r, row.data());
    for (float v : row) {
      EXPECT_GE(v, -0.25f);
      EXPECT_LT(v, 0.25f);
    }
  }
}

class TableShardTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(1, 0); }
  void Make(int slots, int slot, int64_t budget = 0,
            TableOptimizer::Type type = TableOptimizer::Type::kSgd,
            bool streamed = true) {
    OptimizerConfig c;
    c.lr = 1.0;
    tables_ = {Table("emb", 100, 4, type), Table("bag", 50, 2, type)};
    ParameterShard::Options o;
    o.tables = std::make_unique<SparseTables>(
        tables_, /*seed=*/3, slot, slots,
        budget > 0 ? std::make_shared<std::atomic<int64_t>>(budget) : nullptr);
    o.max_samples = 64;
    o.streamed_sums = streamed;
    shard_ = std::make_unique<ParameterShard>(
        std::vector<float>{10, 20, 30}, *Optimizer::Create(c, 3), &clock_, o);
    shard_->AddMember("a", 1);
    shard_->AddMember("b", 1);
  }
  v1::PullRowsRequest PullReq(const std::string& w, int table,
                              std::vector<int64_t> rows) {
    v1::PullRowsRequest r;
    r.set_job_id("j");
    r.set_worker_id(w);
    r.set_incarnation(1);
    v1::TableRows* t = r.add_tables();
    t->set_table(table);
    for (int64_t x : rows) t->add_rows(x);
    return r;
  }
  v1::PushRowsRequest PushReq(const std::string& w, int64_t step,
                              int64_t samples, int table,
                              std::vector<int64_t> rows,
                              std::vector<float> grads) {
    v1::PushRowsRequest r;
    r.set_job_id("j");
    r.set_worker_id(w);
    r.set_incarnation(1);
    r.set_step(step);
    r.set_samples(samples);
    v1::TableRows* t = r.add_tables();
    t->set_table(table);
    for (int64_t x : rows) t->add_rows(x);
    t->set_values(std::string(reinterpret_cast<const char*>(grads.data()),
                              grads.size() * 4));
    return r;
  }
  std::vector<float> Rows(int table, std::vector<int64_t> rows) {
    v1::PullRowsResponse resp;
    TALLY_EXPECT_OK(shard_->ReadRows(PullReq("a", table, rows), &resp));
    const std::string& v = resp.tables(0).values();
    std::vector<float> out(v.size() / 4);
    std::memcpy(out.data(), v.data(), v.size());
    return out;
  }
  void Close(int64_t step, int64_t sa, int64_t sb, bool b_counts = true) {
    bool dup = false;
    std::vector<float> g = {0, 0, 0};
    PushMeta m;
    m.worker_id = "a";
    m.incarnation = 1;
    m.step = step;
    m.base_version = step;
    m.samples = sa;
    TALLY_ASSERT_OK(shard_->Accept(m, g.data(), &dup));
    shard_->Commit("a", 1, step, true);
    m.worker_id = "b";
    m.samples = sb;
    TALLY_ASSERT_OK(shard_->Accept(m, g.data(), &dup));
    shard_->Commit("b", 1, step, b_counts);
  }
  std::vector<float> Init(int table, int64_t row) {
    std::vector<float> v(tables_[table].dim);
    InitRow(tables_[table], 3, row, v.data());
    return v;
  }

  FakeClock clock_;
  std::vector<EmbeddingTableSpec> tables_;
  std::unique_ptr<ParameterShard> shard_;
};

TEST_F(TableShardTest, RowsStartFromTheirInitialValuesAndTakeTheWeightedMean) {
  std::vector<float> start = Init(0, 5), nine_start = Init(0, 9);
  start.insert(start.end(), nine_start.begin(), nine_start.end());
  EXPECT_EQ(Rows(0, {5, 9}), start);
  bool replaced = true;
  // a (1 sample) touches rows 5 and 9; b (3 samples) touches 9 only.
  TALLY_ASSERT_OK(shard_->StageRows(
      PushReq("a", 0, 1, 0, {5, 9}, {1, 1, 1, 1, 2, 2, 2, 2}), &replaced));
  EXPECT_FALSE(replaced);
  TALLY_ASSERT_OK(
      shard_->StageRows(PushReq("b", 0, 3, 0, {9}, {6, 6, 6, 6}), &replaced));
  Close(0, 1, 3);
  EXPECT_EQ(shard_->version(), 1);
  std::vector<float> five = Init(0, 5), nine = Init(0, 9);
  for (int j = 0; j < 4; ++j) {
    // mean over the step's 4 samples; sgd lr 0.5
    five[j] = std::fma(0.25f, -0.5f, five[j]);
    nine[j] = std::fma((2.0f + 3 * 6.0f) / 4, -0.5f, nine[j]);
  }
  std::vector<float> want = five;
  want.insert(want.end(), nine.begin(), nine.end());
  EXPECT_EQ(Rows(0, {5, 9}), want);
  ShardMetrics m = shard_->Metrics();
  ASSERT_EQ(m.tables.size(), 2u);
  EXPECT_EQ(m.tables[0].name, "emb");
  EXPECT_EQ(m.tables[0].rows, 2);
  EXPECT_EQ(m.tables[0].rows_pushed, 3);
  EXPECT_EQ(m.tables[0].rows_applied, 2);
  EXPECT_EQ(m.tables[0].rows_pulled, 4);
  EXPECT_EQ(m.tables[0].rows_created, 2);
  EXPECT_EQ(m.tables[0].pulled_bytes, 4 * 4 * 4);
  EXPECT_EQ(m.tables[0].pushed_bytes, 3 * 4 * 4);
  // Only the rows' values move, and a bounded header (ids, tags, sizes).
  EXPECT_GE(m.tables[0].pull_wire_bytes, m.tables[0].pulled_bytes);
  EXPECT_LE(m.tables[0].pull_wire_bytes, m.tables[0].pulled_bytes + 2 * 32);
  EXPECT_EQ(m.tables[1].rows, 0);  // never touched: holds nothing
}

TEST_F(TableShardTest, RowsOfAPushThatDidNotCountAreNotApplied) {
  // Staged pushes: a streamed sum holding b's push would be dropped whole.
  Make(1, 0, 0, TableOptimizer::Type::kSgd, /*streamed=*/false);
  bool replaced = false;
  TALLY_ASSERT_OK(
      shard_->StageRows(PushReq("a", 0, 1, 1, {7}, {4, 4}), &replaced));
  TALLY_ASSERT_OK(
      shard_->StageRows(PushReq("b", 0, 1, 1, {7}, {100, 100}), &replaced));
  Close(0, 1, 1, /*b_counts=*/false);  // b's push was refused somewhere
  std::vector<float> seven = Init(1, 7);
  for (float& v : seven) v = std::fma(4.0f, -0.5f, v);  // a's alone, of 1
  EXPECT_EQ(Rows(1, {7}), seven);
  // The next step goes on from there, staged rows of step 0 gone.
  Close(1, 1, 1);
  EXPECT_EQ(Rows(1, {7}), seven);
}

TEST_F(TableShardTest, APieceAgainReplacesItselfAndPieceZeroStartsOver) {
  bool replaced = false;
  v1::PushRowsRequest p0 = PushReq("a", 0, 2, 0, {1}, {1, 1, 1, 1});
  v1::PushRowsRequest p1 = PushReq("a", 0, 2, 0, {2}, {2, 2, 2, 2});
  p1.set_piece(1);
  // Piece 0 comes first: 1 before it is refused.
  EXPECT_THAT(shard_->StageRows(p1, &replaced),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("piece 0 has not come")));
  v1::PushRowsRequest p2 = PushReq("a", 0, 2, 0, {3}, {8, 8, 8, 8});
  p2.set_piece(2);
  v1::PushRowsRequest p64 = p2;
  p64.set_piece(64);
  TALLY_ASSERT_OK(shard_->StageRows(p0, &replaced));
  // The rest in any order (a worker sends them at once), at most 64.
  TALLY_ASSERT_OK(shard_->StageRows(p2, &replaced));
  EXPECT_THAT(shard_->StageRows(p64, &replaced),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("up to 63 more")));
  TALLY_ASSERT_OK(shard_->StageRows(p1, &replaced));
  TALLY_ASSERT_OK(shard_->StageRows(p1, &replaced));  // a retried piece
  TALLY_ASSERT_OK(shard_->StageRows(p0, &replaced));  // the push again
  EXPECT_TRUE(replaced);
  TALLY_ASSERT_OK(shard_->StageRows(p1, &replaced));
  Close(0, 2, 2);
  std::vector<float> two = Init(0, 2);
  for (float& v : two) v = std::fma(2.0f * 2 / 4, -0.5f, v);  // once, not twice
  EXPECT_EQ(Rows(0, {2}), two);
  // Piece 0 again started over: piece 2's row went with it.
  EXPECT_EQ(Rows(0, {3}), Init(0, 3));
}

TEST_F(TableShardTest, BadRowsAndGradientsAreRefusedAndChangeNothing) {
  v1::PullRowsResponse resp;
  EXPECT_THAT(shard_->ReadRows(PullReq("a", 5, {1}), &resp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the job has 2 tables")));
  EXPECT_THAT(shard_->ReadRows(PullReq("a", 0, {100}), &resp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row 100 is outside its 100 rows")));
  EXPECT_THAT(shard_->ReadRows(PullReq("a", 0, {-1}), &resp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row -1")));
  EXPECT_THAT(shard_->ReadRows(PullReq("a", 0, {3, 3}), &resp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("listed twice")));
  EXPECT_THAT(shard_->ReadRows(PullReq("stranger", 0, {3}), &resp),
              HasReason(absl::StatusCode::kPermissionDenied, v1::NOT_A_MEMBER));
  bool replaced = false;
  EXPECT_THAT(shard_->StageRows(PushReq("a", 0, 1, 0, {1}, {1, 1, 1}), &replaced),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("12 bytes of gradients for 1 rows of 4")));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(
      shard_->StageRows(PushReq("a", 0, 1, 0, {1, 2}, {0, 0, 0, 0, 0, nan, 0, 0}),
                        &replaced),
      HasReason(absl::StatusCode::kInvalidArgument, v1::NON_FINITE));
  EXPECT_THAT(shard_->StageRows(PushReq("a", 1, 1, 0, {1}, {1, 1, 1, 1}), &replaced),
              HasReason(absl::StatusCode::kAborted, v1::STEP_NOT_OPEN));
  EXPECT_THAT(shard_->StageRows(PushReq("a", 0, 65, 0, {1}, {1, 1, 1, 1}), &replaced),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("samples")));
  // None of it was staged: the step applies nothing to row 1 or 2.
  Close(0, 1, 1);
  EXPECT_EQ(Rows(0, {1}), Init(0, 1));
  EXPECT_EQ(Rows(0, {2}), Init(0, 2));
  EXPECT_THAT(shard_->StageRows(PushReq("a", 0, 1, 0, {1}, {1, 1, 1, 1}), &replaced),
              HasReason(absl::StatusCode::kAborted, v1::STEP_CLOSED));
  // A member that committed the step sends its rows too late.
  bool dup = false;
  std::vector<float> g = {0, 0, 0};
  PushMeta m;
  m.worker_id = "a";
  m.incarnation = 1;
  m.step = 1;
  m.base_version = 1;
  m.samples = 1;
  TALLY_ASSERT_OK(shard_->Accept(m, g.data(), &dup));
  shard_->Commit("a", 1, 1, true);
  EXPECT_THAT(shard_->StageRows(PushReq("a", 1, 1, 0, {1}, {1, 1, 1, 1}), &replaced),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("after its commit")));
  EXPECT_EQ(shard_->Metrics().tables[0].rows_applied, 0);
}

// A row listed in two blocks of one request would be read twice, or
// stepped twice as far (one SGD step moving it by both gradients):
// refused, naming the row, with nothing made or staged.
TEST_F(TableShardTest, ARowInTwoBlocksOfARequestIsRefused) {
  v1::PullRowsRequest pull = PullReq("a", 0, {1, 5});
  v1::TableRows* again = pull.add_tables();
  again->set_table(0);
  again->add_rows(5);
  v1::PullRowsResponse resp;
  EXPECT_THAT(shard_->CheckPullRows(pull),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("table 'emb': row 5 is listed twice")));
  EXPECT_THAT(shard_->ReadRows(pull, &resp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row 5 is listed twice")));
  EXPECT_EQ(shard_->Metrics().tables[0].rows, 0);  // nothing made
  // Row 5 of another table is another row.
  v1::PullRowsRequest two = PullReq("a", 0, {5});
  v1::TableRows* bag = two.add_tables();
  bag->set_table(1);
  bag->add_rows(5);
  TALLY_EXPECT_OK(shard_->ReadRows(two, &resp));
  bool replaced = false;
  v1::PushRowsRequest push = PushReq("a", 0, 1, 0, {5}, {1, 1, 1, 1});
  const v1::TableRows same = push.tables(0);
  *push.add_tables() = same;
  EXPECT_THAT(shard_->StageRows(push, &replaced),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("table 'emb': row 5 is listed twice")));
  Close(0, 1, 1);
  EXPECT_EQ(Rows(0, {5}), Init(0, 5));  // nothing staged, nothing stepped
  EXPECT_EQ(shard_->Metrics().tables[0].rows_pushed, 0);
}

// A request is checked whole, its sizes first: one of too many values is
// refused as such before its rows are looked at (and the sets that look
// takes are made), as is one of too many blocks.
TEST_F(TableShardTest, ARequestIsCheckedWholeItsSizesFirst) {
  v1::PullRowsRequest big = PullReq("a", 1, {});  // bag: 2 values a row
  for (int i = 0; i < (1 << 17) + 1; ++i) big.mutable_tables(0)->add_rows(3);
  EXPECT_THAT(shard_->CheckPullRows(big),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a pull of 262146 row values; at most "
                                 "262144")));
  v1::PullRowsRequest blocks = PullReq("a", 0, {1});
  for (int i = 0; i < SparseTables::kMaxBlocksPerMessage; ++i)
    blocks.add_tables()->set_table(1);
  EXPECT_THAT(shard_->CheckPullRows(blocks),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1025 table blocks; at most 1024")));
  blocks.mutable_tables()->RemoveLast();
  TALLY_EXPECT_OK(shard_->CheckPullRows(blocks));  // 1024, most of them empty
  EXPECT_THAT(shard_->CheckPullRows(PullReq("stranger", 0, {1})),
              HasReason(absl::StatusCode::kPermissionDenied, v1::NOT_A_MEMBER));
  bool replaced = false;
  v1::PushRowsRequest push = PushReq("a", 0, 1, 1, {}, {});
  for (int i = 0; i < (1 << 17) + 1; ++i) push.mutable_tables(0)->add_rows(3);
  EXPECT_THAT(shard_->StageRows(push, &replaced),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a push of 262146 row values")));
}

TEST_F(TableShardTest, RowsOfAnotherShardAreRefused) {
  Make(/*slots=*/2, /*slot=*/0);
  const uint64_t salt = TableSalt("emb");
  int64_t mine = -1, theirs = -1;
  for (int64_t r = 0; r < 100 && (mine < 0 || theirs < 0); ++r)
    (SlotOfRow(r, salt, 2) == 0 ? mine : theirs) = r;
  ASSERT_GE(mine, 0);
  ASSERT_GE(theirs, 0);
  v1::PullRowsResponse resp;
  TALLY_EXPECT_OK(shard_->ReadRows(PullReq("a", 0, {mine}), &resp));
  EXPECT_THAT(shard_->ReadRows(PullReq("a", 0, {theirs}), &resp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("belongs to shard 1 of 2")));
}

TEST_F(TableShardTest, TheTableBudgetBoundsTheRowsMade) {
  // A row of emb: 4 values (sgd: no slots), and its index entry: 56 bytes.
  Make(1, 0, /*budget=*/56 * 3);
  v1::PullRowsResponse resp;
  TALLY_EXPECT_OK(shard_->ReadRows(PullReq("a", 0, {1, 2}), &resp));
  v1::PullRowsResponse more;
  EXPECT_THAT(shard_->ReadRows(PullReq("a", 0, {3, 4}), &more),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_table_bytes")));
  EXPECT_EQ(shard_->Metrics().tables[0].rows, 2);  // nothing made
  TALLY_EXPECT_OK(shard_->ReadRows(PullReq("a", 0, {1, 3}), &more));
  EXPECT_EQ(shard_->Metrics().tables[0].rows, 3);
}

TEST_F(TableShardTest, ShortOfBudgetTheReclaimHookIsAskedOnceForRoom) {
  auto budget = std::make_shared<std::atomic<int64_t>>(56);  // one emb row
  SparseTables tables(tables_, 3, 0, 1, budget);
  int asked = 0;
  tables.set_reclaim([&](int64_t need) {
    ++asked;
    EXPECT_EQ(need, 56);  // the second row's bytes
    budget->fetch_add(need);  // as dropping an ended job's tables does
    return true;
  });
  std::vector<float> out(8);
  const int64_t rows[] = {1, 2};
  TALLY_EXPECT_OK(tables.Read(0, rows, 1, out.data()));
  TALLY_EXPECT_OK(tables.Read(0, rows + 1, 1, out.data()));
  EXPECT_EQ(asked, 1);
  // With nothing to give back, the read is refused and makes nothing.
  tables.set_reclaim([&](int64_t) { return ++asked, false; });
  const int64_t three = 3;
  EXPECT_THAT(tables.Read(0, &three, 1, out.data()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_table_bytes")));
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(tables.Metrics()[0].rows, 2);
}

TEST_F(TableShardTest, RetiredTablesReadInRowOrderAsTheyEnded) {
  std::vector<float> pulled = Rows(0, {9, 2, 7});
  std::shared_ptr<const SparseTables> t = shard_->Retire();
  ASSERT_NE(t, nullptr);
  std::vector<int64_t> rows;
  std::string values;
  t->ReadSorted(0, 0, 2, &rows, &values);
  EXPECT_EQ(rows, (std::vector<int64_t>{2, 7}));
  ASSERT_EQ(values.size(), 2u * 4 * 4);
  std::vector<float> v(8);
  std::memcpy(v.data(), values.data(), values.size());
  EXPECT_EQ(std::vector<float>(v.begin(), v.begin() + 4),
            std::vector<float>(pulled.begin() + 4, pulled.begin() + 8));
  t->ReadSorted(0, 8, 2, &rows, &values);  // from row 8 on: one left
  EXPECT_EQ(rows, (std::vector<int64_t>{9}));
  t->ReadSorted(1, 0, 10, &rows, &values);  // bag: never touched
  EXPECT_TRUE(rows.empty());
  EXPECT_TRUE(values.empty());
}

EmbeddingTableSpec Dynamic(int64_t dim) {
  EmbeddingTableSpec t = Table("users", 0, dim);
  t.ids = TableIds::kDynamic;
  return t;
}

TEST(DynamicTableTest, RowsAreKeyedByAnyIdAndStartFromTheirInitialValues) {
  SparseTables tables({Dynamic(3)}, 3, 0, 1, nullptr);
  const int64_t ids[] = {-7, 0, int64_t{1} << 50, INT64_MAX};
  TALLY_EXPECT_OK(tables.CheckRows(0, ids, 4));
  std::vector<float> out(12), init(3);
  TALLY_EXPECT_OK(tables.Read(0, ids, 4, out.data()));
  for (int i = 0; i < 4; ++i) {
    InitRow(tables.spec(0), 3, ids[i], init.data());
    EXPECT_EQ(std::vector<float>(out.begin() + 3 * i, out.begin() + 3 * i + 3),
              init);
  }
  EXPECT_EQ(tables.Metrics()[0].rows, 4);
}

TEST(DynamicTableTest, AnIdGetsARowOnlyOnceMinCountPullsAskedForIt) {
  EmbeddingTableSpec t = Dynamic(2);
  t.min_count = 3;
  SparseTables tables({t}, 3, 0, 1, nullptr);
  const int64_t id = 42;
  std::vector<float> out(2), init(2), g = {1.0f, 1.0f};
  InitRow(tables.spec(0), 3, id, init.data());
  for (int pull = 0; pull < 2; ++pull) {
    TALLY_EXPECT_OK(tables.Read(0, &id, 1, out.data()));
    EXPECT_EQ(out, init);  // its initial values, no row
    tables.Apply(0, &id, 1, g.data(), pull);  // dropped
  }
  EXPECT_EQ(tables.Metrics()[0].rows, 0);
  EXPECT_EQ(tables.Metrics()[0].rows_filtered, 2);
  EXPECT_EQ(tables.Metrics()[0].rows_applied, 0);
  TALLY_EXPECT_OK(tables.Read(0, &id, 1, out.data()));  // the third: a row
  EXPECT_EQ(out, init);  // nothing applied before it was made
  tables.Apply(0, &id, 1, g.data(), 2);
  EXPECT_EQ(tables.Metrics()[0].rows, 1);
  EXPECT_EQ(tables.Metrics()[0].rows_created, 1);
  EXPECT_EQ(tables.Metrics()[0].rows_applied, 1);
}

TEST(DynamicTableTest, RowsNotSteppedForEvictAfterStepsAreDropped) {
  EmbeddingTableSpec t = Dynamic(4);
  t.evict_after_steps = 4;
  auto budget = std::make_shared<std::atomic<int64_t>>(1000);
  SparseTables tables({t}, 3, 0, 1, budget);
  const int64_t ids[] = {1, 2, 3};
  std::vector<float> out(12), g(4, 1.0f);
  TALLY_EXPECT_OK(tables.Read(0, ids, 3, out.data()));
  const int64_t row_bytes = 4 * 4 + SparseTables::kIndexBytesPerRow +
                            SparseTables::kEvictBytesPerRow;
  EXPECT_EQ(budget->load(), 1000 - 3 * row_bytes);
  tables.Apply(0, &ids[0], 1, g.data(), 3);  // 1 stepped at step 3
  for (int64_t step = 0; step < 4; ++step) tables.EndStep(step);
  EXPECT_EQ(tables.Metrics()[0].rows, 3);
  tables.EndStep(4);  // 2 and 3: not stepped since they were made
  EXPECT_EQ(tables.Metrics()[0].rows, 1);
  EXPECT_EQ(tables.Metrics()[0].rows_evicted, 2);
  EXPECT_EQ(budget->load(), 1000 - row_bytes);  // their bytes given back
  // The one kept is row 1, stepped once; 2 comes back from its start.
  std::vector<float> one(4), init(4);
  TALLY_EXPECT_OK(tables.Read(0, &ids[1], 1, one.data()));
  InitRow(tables.spec(0), 3, 2, init.data());
  EXPECT_EQ(one, init);
  TALLY_EXPECT_OK(tables.Read(0, &ids[0], 1, one.data()));
  EXPECT_NE(std::vector<float>(out.begin(), out.begin() + 4), one);
  tables.EndStep(7);  // 1: stepped at 3, four steps ago
  EXPECT_EQ(tables.Metrics()[0].rows_evicted, 3);
}

// What a row is counted against --max_table_bytes covers what it holds:
// its values, and its share of the index's slots and control bytes at the
// index's emptiest (just after it grew), replayed on a map of the same
// kind; a frozen table's row order is counted too.
TEST(TableBudgetTest, ARowIsCountedAtLeastWhatItHolds) {
  constexpr int64_t kBudget = int64_t{1} << 40;
  auto budget = std::make_shared<std::atomic<int64_t>>(kBudget);
  SparseTables tables({Dynamic(2)}, 3, 0, 1, budget);
  absl::flat_hash_map<int64_t, int64_t> index;  // as the table's own
  constexpr int64_t kSlot = sizeof(std::pair<const int64_t, int64_t>) + 1;
  std::vector<float> out(2);
  for (int64_t row = 0; row < 20000; ++row) {
    TALLY_ASSERT_OK(tables.Read(0, &row, 1, out.data()));
    index.emplace(row, row);
    const int64_t held =
        (row + 1) * 2 * 4 + static_cast<int64_t>(index.capacity()) * kSlot;
    ASSERT_GE(tables.bytes(), held) << (row + 1) << " rows";
  }
  EXPECT_EQ(budget->load(), kBudget - tables.bytes());
  const int64_t before = tables.bytes();
  tables.Freeze();
  EXPECT_EQ(tables.bytes(), before + 20000 * 8);
  EXPECT_EQ(budget->load(), kBudget - tables.bytes());
}

TEST(DynamicTableTest, AFloodOfNewIdsStopsAtMaxRows) {
  EmbeddingTableSpec t = Dynamic(2);
  t.max_rows = 4;  // over 2 shards: 2 on this one
  SparseTables tables({t}, 3, 0, 2, nullptr);
  std::vector<int64_t> mine;
  for (int64_t id = 0; mine.size() < 3; ++id)
    if (SlotOfRow(id, t.salt, 2) == 0) mine.push_back(id);
  std::vector<float> out(6);
  TALLY_EXPECT_OK(tables.Read(0, mine.data(), 2, out.data()));
  EXPECT_THAT(tables.Read(0, mine.data() + 2, 1, out.data()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("would pass its max_rows (2 on this shard")));
  EXPECT_EQ(tables.Metrics()[0].rows, 2);
  TALLY_EXPECT_OK(tables.Read(0, mine.data(), 2, out.data()));  // held ones
}

TEST(TableCheckpointTest, BaseAndDeltasRestoreTheRowsOfEachSlot) {
  EmbeddingTableSpec t = Dynamic(2);
  t.evict_after_steps = 2;
  t.optimizer.type = TableOptimizer::Type::kAdagrad;
  SparseTables a({t}, 3, 0, 1, nullptr);
  a.set_checkpointed();
  const int64_t ids[] = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(12), g(12, 0.5f);
  TALLY_ASSERT_OK(a.Read(0, ids, 6, out.data()));
  a.Apply(0, ids, 6, g.data(), 0);
  const std::string dir = ::testing::TempDir();
  TableRowsFile base = a.TakeSave(/*base=*/true);
  base.job_id = "job-1";
  TALLY_ASSERT_OK(WriteTableFile(dir + "/base.tbl", base));
  a.Apply(0, ids, 1, g.data(), 1);  // 1 stepped again; the rest go stale
  a.EndStep(2);                     // sweeps: 2 .. 6 evicted
  TableRowsFile delta = a.TakeSave(/*base=*/false);
  delta.job_id = "job-1";
  ASSERT_EQ(delta.parts[0].rows, std::vector<int64_t>{1});
  ASSERT_EQ(delta.parts[0].dropped.size(), 5u);
  TALLY_ASSERT_OK(WriteTableFile(dir + "/delta.tbl", delta));
  // Placed again over two slots: each loads its own rows of the chain.
  std::vector<float> want(2), got(2);
  TALLY_ASSERT_OK(a.Read(0, ids, 1, want.data()));
  int64_t held = 0;
  for (int slot = 0; slot < 2; ++slot) {
    SparseTables b({t}, 3, slot, 2, nullptr);
    for (const char* f : {"/base.tbl", "/delta.tbl"}) {
      absl::StatusOr<TableRowsFile> file = ReadTableFile(dir + f, "job-1");
      TALLY_ASSERT_OK(file.status());
      TALLY_ASSERT_OK(b.Load(*file));
    }
    held += b.Metrics()[0].rows;
    if (SlotOfRow(1, t.salt, 2) == slot) {
      TALLY_ASSERT_OK(b.Read(0, ids, 1, got.data()));
      EXPECT_EQ(got, want);
    }
  }
  EXPECT_EQ(held, 1);  // the evicted rows stay evicted
  // Another job's file, and a damaged one, are refused.
  EXPECT_THAT(ReadTableFile(dir + "/base.tbl", "job-2"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("job-1's")));
  std::string bytes = *ReadFile(dir + "/base.tbl");
  bytes[bytes.size() / 2] ^= 1;
  TALLY_ASSERT_OK(WriteFileAtomic(dir + "/bad.tbl", bytes));
  EXPECT_THAT(ReadTableFile(dir + "/bad.tbl", "job-1"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("CRC-32")));
}

TEST_F(TableShardTest, AdagradStepsTouchedRowsAsTorchAdagradDoes) {
  Make(1, 0, 0, TableOptimizer::Type::kAdagrad);
  std::vector<double> p(4), s(4, 0.0);
  std::vector<float> init = Init(0, 4);
  for (int j = 0; j < 4; ++j) p[j] = init[j];
  bool replaced = false;
  for (int step = 0; step < 5; ++step) {
    std::vector<float> g = {0.5f * (step + 1), -1.0f, 0.25f, 3.0f};
    TALLY_ASSERT_OK(shard_->StageRows(PushReq("a", step, 1, 0, {4}, g), &replaced));
    Close(step, 1, 1);
    for (int j = 0; j < 4; ++j) {
      const double mean = g[j] / 2.0;  // a's gradient over the step's 2 samples
      s[j] += mean * mean;
      p[j] -= 0.5 * mean / (std::sqrt(s[j]) + 1e-10);
    }
  }
  std::vector<float> got = Rows(0, {4});
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(got[j], p[j], 1e-6) << j;
}

}  // namespace
}  // namespace tally
