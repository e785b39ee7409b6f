#include "proto/errors.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace tally {

namespace {

constexpr char kDetailTypeUrl[] = "type.googleapis.com/tally.v1.ErrorDetail";

std::optional<v1::ErrorDetail> DetailOf(const absl::Status& status) {
  auto payload = status.GetPayload(kDetailTypeUrl);
  if (!payload.has_value()) return std::nullopt;
  v1::ErrorDetail detail;
  if (!detail.ParseFromString(std::string(*payload))) return std::nullopt;
  return detail;
}

}  // namespace

absl::Status WithReason(absl::Status status, v1::ErrorReason reason,
                        int64_t step) {
  if (status.ok()) return status;
  v1::ErrorDetail detail;
  detail.set_reason(reason);
  detail.set_step(step);
  status.SetPayload(kDetailTypeUrl, absl::Cord(detail.SerializeAsString()));
  return status;
}

v1::ErrorReason ReasonOf(const absl::Status& status) {
  auto detail = DetailOf(status);
  return detail.has_value() ? detail->reason() : v1::ERROR_REASON_UNSPECIFIED;
}

int64_t ReasonStep(const absl::Status& status) {
  auto detail = DetailOf(status);
  return detail.has_value() ? detail->step() : 0;
}

std::string Quoted(absl::string_view s) {
  constexpr size_t kMax = 64;
  if (s.size() <= kMax) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kMax), "...' (", s.size(), " bytes)");
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  std::string message(status.message());
  auto detail = DetailOf(status);
  if (!detail.has_value()) return grpc::Status(code, message);
  v1::RpcStatus rich;
  rich.set_code(static_cast<int32_t>(status.code()));
  rich.set_message(message);
  rich.add_details()->PackFrom(*detail);
  return grpc::Status(code, message, rich.SerializeAsString());
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message());
  if (status.error_details().empty()) return out;
  v1::RpcStatus rich;
  if (!rich.ParseFromString(status.error_details())) return out;
  for (const auto& any : rich.details()) {
    v1::ErrorDetail detail;
    if (any.UnpackTo(&detail)) {
      return WithReason(std::move(out), detail.reason(), detail.step());
    }
  }
  return out;
}

}  // namespace tally
