// The transport flags every Tally program takes (tally-server, tally-worker,
// tally), defined once:
//   --tls_ca=FILE --tls_cert=FILE --tls_key=FILE   mTLS (all three or none)
//   --token_file=FILE                              this program's bearer token
// and the command-line parsing they share. Call from main() only.
#ifndef TALLY_PROTO_TRANSPORT_FLAGS_H_
#define TALLY_PROTO_TRANSPORT_FLAGS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/transport.h"

namespace tally {

// absl::ParseCommandLine with `usage` as the program's usage message, and
// --help / --helpfull listing every flag the program's own sources define
// with its help text (Abseil's default lists only those of a file named
// after the binary: "No flags matched"). Returns the positional arguments,
// argv[0] first.
std::vector<char*> ParseProgramFlags(int argc, char** argv,
                                     absl::string_view usage);

// TransportOptions with the TLS material and token the flags name.
// NOT_FOUND or INVALID_ARGUMENT names the flag and file.
absl::StatusOr<TransportOptions> TransportFromFlags();
// The same from the files' paths (empty: none), for programs without flags
// (the Python worker).
absl::StatusOr<TransportOptions> TransportFromFiles(
    const std::string& tls_ca, const std::string& tls_cert,
    const std::string& tls_key, const std::string& token_file);

// protobuf logs every request it cannot parse (a string field with invalid
// UTF-8, for one): a client could fill a server's log. After this, the
// first 20 such lines are printed, then one per 10,000. protobuf's handler
// is process-wide (a plain function), hence a call from main().
void LimitProtobufLogs();

}  // namespace tally

#endif  // TALLY_PROTO_TRANSPORT_FLAGS_H_
