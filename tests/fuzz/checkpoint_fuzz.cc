// libFuzzer: a coordinator checkpoint file (the bytes of job-1.ckpt) read
// back as at a restart: format, job id, spec, sizes and checksum checked.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "server/control/job_store.h"

// protobuf logs every string field with invalid UTF-8; the harness runs
// millions of such inputs.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)tally::JobStore::ParseCheckpoint(bytes, "/state/job-1.ckpt",
                                         tally::SpecLimits());
  return 0;
}
