// libFuzzer: the job spec parser and validator (YAML or JSON text from a
// client) under the server's default limits; when a spec is accepted, the
// schedule computed from it. Nothing may crash, hang or allocate past the
// limits.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/spec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = tally::ParseJobSpec(text, tally::SpecLimits());
  if (spec.ok()) {
    tally::MakeSchedule(*spec, tally::TrainSize(spec->dataset),
                        static_cast<int>(spec->training.workers));
  }
  return 0;
}
