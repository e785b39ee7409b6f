// The waiters of a range's version: released in order of what they wait
// for, at their deadline, all at once, or a member's with its own reason;
// their calls wait in ReadyCalls until the owner's lock is let go.
#include "server/data/version_waiters.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

class VersionWaitersTest : public ::testing::Test {
 protected:
  // A waiter that records its outcome in got_[name].
  void Wait(const std::string& name, int64_t version, absl::Duration after,
            const std::string& worker_id = "") {
    got_[name] = absl::UnknownError("not called");
    waiters_.Add(
        version, start_ + after,
        [this, name](absl::Status s) { got_[name] = s; }, worker_id);
  }

  const absl::Time start_ = absl::UnixEpoch();
  VersionWaiters waiters_;
  std::map<std::string, absl::Status> got_;
};

TEST_F(VersionWaitersTest, AVersionReleasesThoseWaitingForItOrBefore) {
  Wait("v1", 1, absl::Seconds(5));
  Wait("v2", 2, absl::Seconds(5));
  Wait("v3", 3, absl::Seconds(5));
  ReadyCalls ready;
  waiters_.Release(2, &ready);
  EXPECT_EQ(ready.size(), 2u);
  EXPECT_EQ(waiters_.size(), 1u);
  // Nothing is called until the owner runs them.
  EXPECT_THAT(got_["v1"], StatusIs(absl::StatusCode::kUnknown, ::testing::_));
  RunReady(ready);
  TALLY_EXPECT_OK(got_["v1"]);
  TALLY_EXPECT_OK(got_["v2"]);
  EXPECT_THAT(got_["v3"], StatusIs(absl::StatusCode::kUnknown, ::testing::_));
}

TEST_F(VersionWaitersTest, ADeadlineReleasesAWaiterNamingItsVersion) {
  Wait("soon", 4, absl::Seconds(1));
  Wait("later", 5, absl::Seconds(10));
  ReadyCalls ready;
  waiters_.Expire(start_ + absl::Milliseconds(999), 2, &ready);
  EXPECT_TRUE(ready.empty());
  waiters_.Expire(start_ + absl::Seconds(1), 2, &ready);  // at the deadline
  RunReady(ready);
  EXPECT_THAT(got_["soon"], StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     HasSubstr("version 4 not reached in "
                                               "time (at 2)")));
  EXPECT_THAT(got_["later"],
              StatusIs(absl::StatusCode::kUnknown, ::testing::_));
  EXPECT_EQ(waiters_.size(), 1u);
}

TEST_F(VersionWaitersTest, CancelReleasesEveryOneWithItsReason) {
  Wait("a", 1, absl::Seconds(5));
  Wait("b", 9, absl::Seconds(5), "w");
  ReadyCalls ready;
  waiters_.Cancel(absl::UnavailableError("moved"), &ready);
  RunReady(ready);
  EXPECT_THAT(got_["a"], StatusIs(absl::StatusCode::kUnavailable, "moved"));
  EXPECT_THAT(got_["b"], StatusIs(absl::StatusCode::kUnavailable, "moved"));
  EXPECT_EQ(waiters_.size(), 0u);
}

// Only the named members' waits past the version fail: another member's,
// anyone's, and a named member's wait for the version itself stay.
TEST_F(VersionWaitersTest, FailReleasesTheNamedMembersWaitsPastTheVersion) {
  Wait("w past", 4, absl::Seconds(5), "w");
  Wait("w at", 3, absl::Seconds(5), "w");
  Wait("x past", 4, absl::Seconds(5), "x");
  Wait("anyone", 4, absl::Seconds(5));
  ReadyCalls ready;
  waiters_.Fail({"w"}, 3, absl::AbortedError("push again"), &ready);
  RunReady(ready);
  EXPECT_THAT(got_["w past"],
              StatusIs(absl::StatusCode::kAborted, "push again"));
  for (const char* still : {"w at", "x past", "anyone"}) {
    EXPECT_THAT(got_[still], StatusIs(absl::StatusCode::kUnknown, ::testing::_))
        << still;
  }
  EXPECT_EQ(waiters_.size(), 3u);
}

}  // namespace
}  // namespace tally
