// libFuzzer: a vocabulary file (dataset.name text, vocab: FILE) parsed and,
// when it is one, text tokenized with it. The input is the vocabulary, a
// NUL byte, then the text.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/data/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\0');
  auto vocab = tally::Vocabulary::Parse(input.substr(0, cut), "fuzz.vocab");
  if (vocab.ok() && cut != absl::string_view::npos) {
    std::vector<int32_t> ids;
    auto s = vocab->Tokenize(input.substr(cut + 1), "fuzz.txt", 0, &ids);
    (void)s;
  }
  return 0;
}
