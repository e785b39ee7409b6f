// Who may call what: bearer tokens mapped to roles, checked on every call
// to a server that has a token table.
//
// A token file has one token per line, "TOKEN ROLE NAME" ('#' starts a
// comment); roles:
//   admin      everything (the coordinator and shard processes use one)
//   submitter  SubmitJob, and GetJob/GetJobHistory/WatchJob/ListJobs/
//              CancelJob/FetchWeights on the jobs it submitted
//   viewer     GetJob, GetJobHistory, ListJobs, WatchJob, ListShards on
//              every job
//   worker     WorkerService and ParameterService only
// grpc.health.v1 is open to every caller that completes the TLS handshake.
//
// TokenAuthProcessor authenticates and authorizes by method (UNAUTHENTICATED:
// no or unknown token; PERMISSION_DENIED: the role may not call the method)
// before a handler runs; handlers that care whose job it is ask CallerOf.
// Tokens travel only over TLS (gRPC sends call credentials on secure
// channels only), so a server with a token table must have TLS.
//
// Thread-safe: a TokenTable is immutable once parsed.
#ifndef TALLY_PROTO_AUTH_H_
#define TALLY_PROTO_AUTH_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ServerContextBase;
}

namespace tally {

enum class Role { kAdmin, kSubmitter, kViewer, kWorker };

absl::string_view RoleName(Role role);

// Whether `role` may call the method at `path` ("/tally.v1.JobService/
// SubmitJob"); ownership of a job is the handler's check.
bool RoleMayCall(Role role, absl::string_view path);

struct Caller {
  Role role = Role::kAdmin;
  std::string name;  // empty when the server checks no tokens
};

class TokenTable {
 public:
  // Parses a token file's text. INVALID_ARGUMENT names the line: an unknown
  // role, a token shorter than 16 characters, a token given twice.
  static absl::StatusOr<std::shared_ptr<const TokenTable>> Parse(
      absl::string_view text);
  static absl::StatusOr<std::shared_ptr<const TokenTable>> Load(
      const std::string& path);

  // The caller a token names; null when unknown.
  const Caller* Find(absl::string_view token) const;
  size_t size() const { return callers_.size(); }

 private:
  absl::flat_hash_map<std::string, Caller> callers_;
};

// The bearer token in an "authorization" header value ("Bearer TOKEN");
// empty when there is none.
absl::string_view BearerToken(absl::string_view header);

// The caller of a call that passed TokenAuthProcessor; with no token table
// (null), every caller is an admin.
Caller CallerOf(const grpc::ServerContextBase& ctx, const TokenTable* tokens);

class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::shared_ptr<const TokenTable> tokens)
      : tokens_(std::move(tokens)) {}
  bool IsBlocking() const override { return false; }  // a hash lookup
  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  std::shared_ptr<const TokenTable> tokens_;
};

}  // namespace tally

#endif  // TALLY_PROTO_AUTH_H_
