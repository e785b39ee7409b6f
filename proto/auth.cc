#include "proto/auth.h"

#include <grpcpp/server_context.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tally {

namespace {

constexpr size_t kMinTokenChars = 16;
constexpr absl::string_view kJobService = "/tally.v1.JobService/";
constexpr absl::string_view kHealth = "/grpc.health.v1.Health/";

absl::StatusOr<Role> ParseRole(absl::string_view s) {
  if (s == "admin") return Role::kAdmin;
  if (s == "submitter") return Role::kSubmitter;
  if (s == "viewer") return Role::kViewer;
  if (s == "worker") return Role::kWorker;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role \"", s, "\" (admin, submitter, viewer or worker)"));
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kSubmitter:
      return "submitter";
    case Role::kViewer:
      return "viewer";
    case Role::kWorker:
      return "worker";
  }
  return "?";
}

bool RoleMayCall(Role role, absl::string_view path) {
  if (absl::StartsWith(path, kHealth)) return true;
  switch (role) {
    case Role::kAdmin:
      return true;
    case Role::kWorker:
      return absl::StartsWith(path, "/tally.v1.WorkerService/") ||
             absl::StartsWith(path, "/tally.v1.ParameterService/");
    case Role::kSubmitter:
    case Role::kViewer: {
      if (!absl::ConsumePrefix(&path, kJobService)) return false;
      const bool read = path == "GetJob" || path == "ListJobs" ||
                        path == "WatchJob" || path == "GetJobHistory";
      if (role == Role::kViewer) return read || path == "ListShards";
      return read || path == "SubmitJob" || path == "CancelJob" ||
             path == "FetchWeights";
    }
  }
  return false;
}

absl::StatusOr<std::shared_ptr<const TokenTable>> TokenTable::Parse(
    absl::string_view text) {
  auto table = std::make_shared<TokenTable>();
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos)
      line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto where = [line_no](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file line ", line_no, ": ", what));
    };
    if (fields.size() != 3) return where("want \"TOKEN ROLE NAME\"");
    if (fields[0].size() < kMinTokenChars) {
      return where(absl::StrCat("token shorter than ", kMinTokenChars,
                                " characters"));
    }
    auto role = ParseRole(fields[1]);
    if (!role.ok()) return where(role.status().message());
    Caller caller{*role, std::string(fields[2])};
    if (!table->callers_.emplace(std::string(fields[0]), caller).second)
      return where("token given twice");
  }
  if (table->callers_.empty())
    return absl::InvalidArgumentError("token file names no tokens");
  return std::shared_ptr<const TokenTable>(std::move(table));
}

absl::StatusOr<std::shared_ptr<const TokenTable>> TokenTable::Load(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto table = Parse(text.str());
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

const Caller* TokenTable::Find(absl::string_view token) const {
  auto it = callers_.find(token);
  return it == callers_.end() ? nullptr : &it->second;
}

absl::string_view BearerToken(absl::string_view header) {
  if (!absl::ConsumePrefix(&header, "Bearer ")) return {};
  return absl::StripAsciiWhitespace(header);
}

Caller CallerOf(const grpc::ServerContextBase& ctx, const TokenTable* tokens) {
  if (tokens == nullptr) return Caller{};
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    absl::string_view header(it->second.data(), it->second.size());
    if (const Caller* c = tokens->Find(BearerToken(header))) return *c;
  }
  // Not reached after TokenAuthProcessor, which refuses such calls; the
  // weakest role if it ever is.
  return Caller{Role::kViewer, ""};
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* /*context*/,
                                         OutputMetadata* /*consumed*/,
                                         OutputMetadata* /*response*/) {
  absl::string_view path;
  if (auto it = auth_metadata.find(":path"); it != auth_metadata.end())
    path = absl::string_view(it->second.data(), it->second.size());
  if (absl::StartsWith(path, kHealth)) return grpc::Status::OK;
  absl::string_view token;
  if (auto it = auth_metadata.find("authorization");
      it != auth_metadata.end()) {
    token = BearerToken(absl::string_view(it->second.data(), it->second.size()));
  }
  if (token.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "no bearer token (give the client --token_file)");
  }
  const Caller* caller = tokens_->Find(token);
  if (caller == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "unknown bearer token");
  }
  if (!RoleMayCall(caller->role, path)) {
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("role ", RoleName(caller->role), " (", caller->name,
                     ") may not call ", path.substr(0, 128)));
  }
  return grpc::Status::OK;
}

}  // namespace tally
