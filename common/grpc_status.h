// absl::Status <-> grpc::Status; the codes map one to one. Used only at the
// RPC edges (services and clients).
#ifndef TALLY_COMMON_GRPC_STATUS_H_
#define TALLY_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace tally {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

}  // namespace tally

#endif  // TALLY_COMMON_GRPC_STATUS_H_
