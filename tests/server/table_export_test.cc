// An ended job's tables exported from its shards (tally fetch): rows in
// order from the slot that owns each, initial values for the rest, and a
// shard's bad answer refused.
#include "server/control/table_export.h"

#include <cstring>
#include <map>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

// A shard holding some rows of one table, as ReadTable answers them.
class RowsShard final : public ShardControl {
 public:
  std::map<int64_t, std::vector<float>> rows;
  bool reversed = false;  // answer out of order
  int64_t claim_more = 0;  // say it holds this many rows more than it has
  int table = 0;           // the table (index) its rows are of; others: none
  int reads = 0;

  absl::StatusOr<v1::ReadTableResponse> ReadTable(const std::string& job,
                                                  int64_t, int index,
                                                  int64_t start,
                                                  int64_t max_rows) override {
    ++reads;
    EXPECT_EQ(job, "job-1");
    v1::ReadTableResponse out;
    if (index != table) return out;
    for (auto it = rows.lower_bound(start);
         it != rows.end() && out.rows_size() < max_rows; ++it) {
      out.add_rows(it->first);
      out.mutable_values()->append(
          reinterpret_cast<const char*>(it->second.data()),
          it->second.size() * 4);
    }
    if (reversed && out.rows_size() > 1) out.mutable_rows()->SwapElements(0, 1);
    out.set_total_rows(static_cast<int64_t>(rows.size()) + claim_more);
    return out;
  }
  absl::Status Install(const v1::InstallRangeRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<HoldReport> Hold(const std::string&, int64_t, int64_t,
                                  absl::Duration) override {
    return absl::UnimplementedError("");
  }
  absl::Status SetMembers(const std::string&, int64_t,
                          const std::vector<MemberSpec>&, int64_t,
                          const PlanChange&) override {
    return absl::UnimplementedError("");
  }
  absl::Status Retire(const std::string&, int64_t) override {
    return absl::UnimplementedError("");
  }
  void Drop(const std::string&, bool) override {}
  absl::StatusOr<ShardState> Save(const std::string&, int64_t, int64_t,
                                  int64_t, absl::Duration, bool) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::vector<v1::RangeStatus>> Status() override {
    return absl::UnimplementedError("");
  }
  bool local() const override { return false; }
};

EmbeddingTableSpec Table(int64_t rows, int64_t dim) {
  EmbeddingTableSpec t;
  t.name = "tables.0";
  t.num_embeddings = rows;
  t.dim = dim;
  t.salt = TableSalt(t.name);
  return t;
}

std::string All(TableExport& e) {
  std::string out;
  while (true) {
    absl::StatusOr<std::string> piece = e.Next();
    if (!piece.ok()) return std::string(piece.status().message());
    if (piece->empty()) return out;
    EXPECT_LE(piece->size(), size_t{1} << 20);
    out += *piece;
  }
}

TEST(TableExportTest, RowsComeFromTheirSlotsAndTheRestAreInitialValues) {
  // 300000 rows of 8, a third held: over one read (2^18 values) a slot.
  const EmbeddingTableSpec t = Table(300000, 8);
  auto a = std::make_shared<RowsShard>(), b = std::make_shared<RowsShard>();
  std::map<int64_t, std::vector<float>> want;
  for (int64_t row = 0; row < t.num_embeddings; row += 3) {
    std::vector<float> v(8, static_cast<float>(row));
    (SlotOfRow(row, t.salt, 2) == 0 ? a : b)->rows[row] = v;
    want[row] = v;
  }
  TableExport e("job-1", 4, {t}, /*seed=*/11, {a, b});
  ASSERT_EQ(e.Tensors().size(), 1u);
  EXPECT_EQ(e.Tensors()[0].name, "tables.0.weight");
  EXPECT_EQ(e.Tensors()[0].shape, (Shape{300000, 8}));
  EXPECT_EQ(e.bytes(), 300000 * 8 * 4);
  const std::string bytes = All(e);
  ASSERT_EQ(bytes.size(), size_t{300000} * 8 * 4);
  std::vector<float> row(8), init(8);
  for (int64_t r = 0; r < t.num_embeddings; ++r) {
    std::memcpy(row.data(), bytes.data() + r * 32, 32);
    if (want.count(r)) {
      ASSERT_EQ(row, want[r]) << r;
    } else {
      InitRow(t, 11, r, init.data());
      ASSERT_EQ(row, init) << r;
    }
  }
  EXPECT_GT(a->reads, 1);  // paged, not one whole answer
}

TEST(TableExportTest, AShardsBadAnswerIsDataLoss) {
  const EmbeddingTableSpec t = Table(100, 4);
  auto a = std::make_shared<RowsShard>();
  a->rows[3] = {1, 2, 3, 4};
  a->rows[5] = {1, 2, 3, 4};
  a->reversed = true;
  TableExport e("job-1", 4, {t}, 11, {a});
  EXPECT_THAT(e.Next(), StatusIs(absl::StatusCode::kDataLoss,
                                 HasSubstr("out of order")));
  // A row outside the table.
  auto b = std::make_shared<RowsShard>();
  b->rows[100] = {1, 2, 3, 4};
  TableExport f("job-1", 4, {t}, 11, {b});
  EXPECT_THAT(f.Next(), StatusIs(absl::StatusCode::kDataLoss,
                                 HasSubstr("outside the 100 rows")));
  // Values of another width.
  auto c = std::make_shared<RowsShard>();
  c->rows[1] = {1, 2, 3};
  TableExport g("job-1", 4, {t}, 11, {c});
  EXPECT_THAT(g.Next(), StatusIs(absl::StatusCode::kDataLoss,
                                 HasSubstr("12 bytes for 1 rows of 4")));
}

TEST(TableExportTest, ADynamicTableIsItsIdsThenItsRowsShardByShard) {
  EmbeddingTableSpec t = Table(0, 2);
  t.name = "users";
  t.salt = TableSalt(t.name);
  t.ids = TableIds::kDynamic;
  auto a = std::make_shared<RowsShard>(), b = std::make_shared<RowsShard>();
  std::vector<int64_t> ids = {-(int64_t{1} << 62), -5, 123456789012345,
                              INT64_MAX};
  for (int64_t id = 0; id < 12; ++id) ids.push_back(id);
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t id : ids) {
    (SlotOfRow(id, t.salt, 2) == 0 ? a : b)->rows[id] = {
        static_cast<float>(id % 1000), 1.0f};
  }
  ASSERT_FALSE(a->rows.empty());
  ASSERT_FALSE(b->rows.empty());
  // A fixed table beside it, so that the tensors follow one another.
  const EmbeddingTableSpec fixed = Table(10, 2);
  TableExport e("job-1", 4, {t, fixed}, 11, {a, b});
  TALLY_ASSERT_OK(e.Prepare());
  const std::vector<LaterTensor> tensors = e.Tensors();
  ASSERT_EQ(tensors.size(), 3u);
  EXPECT_EQ(tensors[0].name, "users.ids");
  EXPECT_EQ(tensors[0].dtype, "I64");
  EXPECT_EQ(tensors[0].shape, (Shape{n}));
  EXPECT_EQ(tensors[1].name, "users.rows");
  EXPECT_EQ(tensors[1].shape, (Shape{n, 2}));
  EXPECT_EQ(tensors[2].name, "tables.0.weight");
  const std::string bytes = All(e);
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), e.bytes()) << bytes;
  std::vector<int64_t> got(n);
  std::memcpy(got.data(), bytes.data(), n * 8);
  std::vector<int64_t> want;  // slot 0's in order, then slot 1's
  for (auto* s : {a.get(), b.get()})
    for (const auto& [id, v] : s->rows) want.push_back(id);
  EXPECT_EQ(got, want);
  for (int64_t i = 0; i < n; ++i) {
    float v[2];
    std::memcpy(v, bytes.data() + n * 8 + i * 8, 8);
    EXPECT_EQ(v[0], static_cast<float>(want[i] % 1000));
  }
  // A shard that said it holds more than it sends.
  b->claim_more = 1;
  TableExport f("job-1", 4, {t}, 11, {a, b});
  TALLY_ASSERT_OK(f.Prepare());
  EXPECT_THAT(All(f), HasSubstr("said it holds"));
}

}  // namespace
}  // namespace tally
