#include "proto/transport_flags.h"

#include <google/protobuf/stubs/logging.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA whose certificates peers must present (mTLS)");
ABSL_FLAG(std::string, tls_cert, "", "PEM file of this program's certificate");
ABSL_FLAG(std::string, tls_key, "", "PEM file of this program's private key");
ABSL_FLAG(std::string, token_file, "",
          "File holding this program's bearer token (sent on every call; "
          "needs TLS)");

namespace tally {

namespace {

// A flag of the program's own, not one of Abseil's (--flagfile, ...).
bool OwnFlag(absl::string_view file) {
  return !absl::StrContains(file, "absl/");
}

void LimitedLog(google::protobuf::LogLevel level, const char* filename,
                int line, const std::string& message) {
  static std::atomic<int64_t> lines{0};
  const int64_t n = lines.fetch_add(1, std::memory_order_relaxed);
  if (n >= 20 && n % 10000 != 0) return;
  std::fprintf(stderr, "[protobuf %s %s:%d] %s%s\n",
               level >= google::protobuf::LOGLEVEL_ERROR ? "error" : "note",
               filename, line, message.c_str(),
               n >= 20 ? absl::StrCat(" (", n, " such lines so far; most not "
                                      "printed)").c_str()
                       : "");
}

}  // namespace

void LimitProtobufLogs() { google::protobuf::SetLogHandler(&LimitedLog); }

absl::StatusOr<TransportOptions> TransportFromFiles(
    const std::string& tls_ca, const std::string& tls_cert,
    const std::string& tls_key, const std::string& token_file) {
  TransportOptions options;
  auto tls = LoadTls(tls_ca, tls_cert, tls_key);
  if (!tls.ok()) return tls.status();
  options.tls = *std::move(tls);
  if (!token_file.empty()) {
    if (!options.tls.enabled()) {
      return absl::InvalidArgumentError(
          "--token_file needs TLS (--tls_ca, --tls_cert, --tls_key): a "
          "bearer token is never sent in plaintext");
    }
    std::ifstream in(token_file);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot read --token_file=", token_file));
    }
    std::stringstream text;
    text << in.rdbuf();
    options.token = std::string(absl::StripAsciiWhitespace(text.str()));
    if (options.token.empty() ||
        options.token.find_first_of(" \t\r\n") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--token_file=", token_file, " must hold one token and nothing else"));
    }
  }
  return options;
}

absl::StatusOr<TransportOptions> TransportFromFlags() {
  return TransportFromFiles(
      absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
      absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_token_file));
}

std::vector<char*> ParseProgramFlags(int argc, char** argv,
                                     absl::string_view usage) {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = &OwnFlag;
  config.contains_help_flags = &OwnFlag;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace tally
