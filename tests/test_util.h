// Helpers shared by Tally's tests: status matchers and fixture paths.
#ifndef TALLY_TESTS_TEST_UTIL_H_
#define TALLY_TESTS_TEST_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/errors.h"

namespace tally::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
//                              HasSubstr("model.layers[4]")));
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::Matches(message_matcher)(std::string(s.message()));
}

// EXPECT_THAT(result, HasReason(absl::StatusCode::kAborted,
//                               v1::STEP_CLOSED));
// The code and the typed ErrorReason a caller reacts to; not the message.
MATCHER_P2(HasReason, code, reason, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s << ", reason "
                   << v1::ErrorReason_Name(ReasonOf(s));
  return s.code() == code && ReasonOf(s) == reason;
}

MATCHER(IsOk, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.ok();
}

#define TALLY_ASSERT_OK(expr) ASSERT_THAT((expr), ::tally::testing::IsOk())
#define TALLY_EXPECT_OK(expr) EXPECT_THAT((expr), ::tally::testing::IsOk())

// Path of a file in the source tree ("examples/fashion-mnist-mlp.yaml").
std::string SourcePath(const std::string& relative);

// A golden fixture from tests/golden/NAME.safetensors (fails the test when it
// cannot be read).
TensorMap LoadGolden(const std::string& name);

// A fresh empty directory under the test temp dir.
std::string TempDir(const std::string& name);

}  // namespace tally::testing

#endif  // TALLY_TESTS_TEST_UTIL_H_
