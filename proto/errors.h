// Errors as protocol: an absl::Status may carry one ErrorReason (with the
// step it refers to), and it travels with the status across gRPC as the
// call's rich-status detail (tally.v1.RpcStatus holding one ErrorDetail), so
// a caller decides what to do from the code and the reason, never from the
// message. ToGrpc / FromGrpc convert at the RPC edges only; the codes map
// one to one.
//
//   return WithReason(absl::FailedPreconditionError("..."),
//                     v1::JOIN_LATER, join_step);
//   ...
//   if (ReasonOf(s) == v1::JOIN_LATER) next = ReasonStep(s);
//
// Thread-safe (no shared state).
#ifndef TALLY_PROTO_ERRORS_H_
#define TALLY_PROTO_ERRORS_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/tally.pb.h"

namespace tally {

// `status` (not OK) with `reason` and `step` attached, replacing any
// reason it had.
absl::Status WithReason(absl::Status status, v1::ErrorReason reason,
                        int64_t step = 0);
// The reason a status carries; ERROR_REASON_UNSPECIFIED when it has none.
v1::ErrorReason ReasonOf(const absl::Status& status);
// The step attached with the reason (0 when none).
int64_t ReasonStep(const absl::Status& status);

// `s` quoted for an error message, cut to its first 64 bytes (with its
// length said): a message never echoes unbounded input back.
std::string Quoted(absl::string_view s);

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace tally

#endif  // TALLY_PROTO_ERRORS_H_
