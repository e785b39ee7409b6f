// The offers of initial weights being read: one a job, their bytes within
// a budget (one offer alone may be larger), each given back when its
// reader lets it go, and each ended once when its job ends.
#include "server/control/weight_offers.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

std::function<void(absl::Status)> Ignore() {
  return [](absl::Status) {};
}

TEST(WeightOffersTest, AJobHasOneOfferBeingRead) {
  WeightOffers offers(1000);
  auto first = offers.Begin("job-1", "w1", 10, Ignore());
  TALLY_ASSERT_OK(first);
  EXPECT_EQ((*first)->values(), 10);
  EXPECT_EQ(offers.bytes(), 40);
  // A second, however small and whoever sends it, waits for the first.
  EXPECT_THAT(offers.Begin("job-1", "w1", 1, Ignore()),
              HasReason(absl::StatusCode::kResourceExhausted, v1::OFFER_BUSY));
  EXPECT_THAT(offers.Begin("job-1", "w2", 1, Ignore()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("another offer of job-1")));
  // Another job's goes on beside it.
  auto other = offers.Begin("job-2", "w2", 10, Ignore());
  TALLY_ASSERT_OK(other);
  EXPECT_EQ(offers.size(), 2);
  first->reset();  // its reader is done: the place and bytes come back
  EXPECT_EQ(offers.bytes(), 40);
  TALLY_EXPECT_OK(offers.Begin("job-1", "w1", 10, Ignore()));
}

TEST(WeightOffersTest, OffersBeingReadStayWithinTheBudget) {
  WeightOffers offers(100);  // 25 values
  auto a = offers.Begin("job-1", "w1", 20, Ignore());
  TALLY_ASSERT_OK(a);
  EXPECT_THAT(offers.Begin("job-2", "w2", 6, Ignore()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_offer_bytes (100)")));
  EXPECT_THAT(offers.Begin("job-2", "w2", 6, Ignore()),
              HasReason(absl::StatusCode::kResourceExhausted, v1::OFFER_BUSY));
  EXPECT_EQ(offers.bytes(), 80);  // nothing taken by the refusals
  auto b = offers.Begin("job-2", "w2", 5, Ignore());
  TALLY_ASSERT_OK(b);
  EXPECT_EQ(offers.bytes(), 100);
  a->reset();
  b->reset();
  EXPECT_EQ(offers.bytes(), 0);
  EXPECT_EQ(offers.size(), 0);
  // A model over the budget is let in alone, and keeps the others out.
  auto big = offers.Begin("job-3", "w3", 1000, Ignore());
  TALLY_ASSERT_OK(big);
  EXPECT_THAT(offers.Begin("job-4", "w4", 1, Ignore()),
              HasReason(absl::StatusCode::kResourceExhausted, v1::OFFER_BUSY));
}

TEST(WeightOffersTest, AnOfferWhoseJobEndsIsEndedOnce) {
  WeightOffers offers(1000);
  std::vector<absl::Status> ended;
  auto record = [&ended](absl::Status s) { ended.push_back(s); };
  auto offer = offers.Begin("job-1", "w1", 10, record);
  TALLY_ASSERT_OK(offer);
  offers.End("job-2", absl::CancelledError("another job"));
  offers.End("job-1", absl::CancelledError("another worker"), "w2");
  EXPECT_TRUE(ended.empty());
  const absl::Status why =
      WithReason(absl::FailedPreconditionError("ended"), v1::JOB_ENDED);
  offers.End("job-1", why, "w1");
  offers.End("job-1", why);  // once
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0],
              HasReason(absl::StatusCode::kFailedPrecondition, v1::JOB_ENDED));
  // Its memory is its reader's until the reader lets it go.
  EXPECT_EQ(offers.bytes(), 40);
  EXPECT_THAT(offers.Begin("job-1", "w1", 10, Ignore()),
              HasReason(absl::StatusCode::kResourceExhausted, v1::OFFER_BUSY));
  offer->reset();
  EXPECT_EQ(offers.bytes(), 0);
  // An offer may outlive the registry that let it in.
  auto registry = std::make_unique<WeightOffers>(1000);
  auto late = registry->Begin("job-5", "w5", 10, Ignore());
  TALLY_ASSERT_OK(late);
  registry.reset();
  late->reset();
}

}  // namespace
}  // namespace tally
