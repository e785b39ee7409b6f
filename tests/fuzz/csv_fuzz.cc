// libFuzzer: a CSV table (dataset.name csv) parsed, its first column the
// label of up to 10 classes.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/data/csv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  tally::CsvOptions o;
  o.label = "y";
  o.num_classes = 10;
  auto table = tally::ParseCsv(text, "fuzz.csv", o);
  (void)table;
  return 0;
}
