// Registrations and their leases: renewals, stale incarnations, expiry.
#include "server/control/leases.h"

#include <set>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;

TEST(LeasesTest, ALeaseLivesWhileRenewedAndGoesWhenItRunsOut) {
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  Leases leases(absl::Seconds(3), t0);
  const int64_t a = leases.Grant("worker-1", t0);
  const int64_t shard = leases.Grant("shard-0", t0, /*forever=*/true);
  EXPECT_NE(shard, a);
  EXPECT_GT(a, 0);
  // Random, not a sequence a peer could walk: 100 grants, no two adjacent.
  std::set<int64_t> seen;
  for (int i = 0; i < 100; ++i) seen.insert(leases.Grant("probe", t0));
  EXPECT_EQ(seen.size(), 100u);
  int adjacent = 0;
  for (int64_t v : seen) adjacent += seen.count(v + 1);
  EXPECT_EQ(adjacent, 0);
  leases.Revoke("probe");
  TALLY_EXPECT_OK(leases.Renew("worker-1", a, t0 + absl::Seconds(2)));
  EXPECT_THAT(leases.Renew("worker-1", a + 7, t0 + absl::Seconds(2)),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::REGISTER_AGAIN));
  EXPECT_TRUE(leases.Expire(t0 + absl::Seconds(4)).empty());  // renewed at 2
  EXPECT_EQ(leases.Expire(t0 + absl::Seconds(6)),
            std::vector<std::string>{"worker-1"});
  EXPECT_THAT(leases.Check("worker-1", a),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::REGISTER_AGAIN));
  TALLY_EXPECT_OK(leases.Check("shard-0", shard));  // forever
  // Registering again gives a new incarnation; the old one is stale.
  const int64_t a2 = leases.Grant("worker-1", t0 + absl::Seconds(7));
  EXPECT_NE(a2, a);
  EXPECT_THAT(leases.Check("worker-1", a),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::REGISTER_AGAIN));
  leases.Revoke("worker-1");
  EXPECT_FALSE(leases.Check("worker-1", a2).ok());
}

}  // namespace
}  // namespace tally
