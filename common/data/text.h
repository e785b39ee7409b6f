// Text corpora as next-token samples (dataset.name: text, docs/job-spec.md).
//
// A corpus is one or more files read as one stream of tokens, in the order
// given (a glob's matches sorted): byte-level tokens (each byte one token,
// a vocabulary of 256) or the tokens of a vocabulary file. A sample is a
// window of seq_len + 1 consecutive tokens; windows do not overlap, and the
// stream's tail that fills no window is left out. A sample's inputs are
// its first seq_len tokens (int64) and its labels the next token of each
// (the window shifted by one), so a language model's targets come with it.
//
// Byte-level streams are mapped (mmap, read-only) and read as samples are
// gathered, never whole; a vocabulary's stream is tokenized once, when the
// files are opened, and kept as 4 bytes a token. Errors name the file and
// the place: kNotFound for a missing file, kInvalidArgument for a
// vocabulary that cannot be one or text it cannot tokenize.
// Thread-safe once opened.
#ifndef TALLY_COMMON_DATA_TEXT_H_
#define TALLY_COMMON_DATA_TEXT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/dataset.h"
#include "common/data/npy.h"

namespace tally {

inline constexpr int kByteVocabulary = 256;
inline constexpr int64_t kMaxVocabulary = int64_t{1} << 24;

// A vocabulary file: one token a line, its id the line's number from 0. A
// line is the token's UTF-8 bytes as they are (spaces count), with the
// escapes \n, \r, \t, \s (a space, where a line would end in one), \\ and
// \xHH (any byte). Text is tokenized by the longest token that matches at
// each place, from the start (greedy). A byte no token starts with is an
// error naming the file and its offset, unless the vocabulary holds the
// token <unk>, which then stands for that byte.
class Vocabulary {
 public:
  // kInvalidArgument for an empty line, a bad escape or a token given
  // twice (naming the line), or more than kMaxVocabulary tokens.
  static absl::StatusOr<Vocabulary> Parse(absl::string_view text,
                                          const std::string& name);
  static absl::StatusOr<Vocabulary> Load(const std::string& path);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  // Appends the tokens of `text`, which starts at byte `offset` of the
  // file `name` (for errors).
  absl::Status Tokenize(absl::string_view text, const std::string& name,
                        int64_t offset, std::vector<int32_t>* out) const;

 private:
  // A trie over the tokens' bytes: node 0 is the root; edges keyed by
  // (node << 8 | byte).
  absl::flat_hash_map<int64_t, int32_t> edges_;
  std::vector<int32_t> token_at_;  // per node: the token ending there, or -1
  std::vector<std::string> tokens_;
  int32_t unknown_ = -1;  // <unk>'s id
};

struct TextOptions {
  // The files, in stream order (globs expanded: ExpandGlob).
  std::vector<std::string> files;
  std::string vocab;  // a vocabulary file; empty: byte-level tokens
  int64_t seq_len = 128;
  // The part of the stream a split takes, as fractions of its tokens:
  // [begin, end) of the whole (the training split [0, 1 - f), the test
  // split [1 - f, 1) for a held-out fraction f).
  double begin = 0.0, end = 1.0;
};

// One split of a corpus: its windows, gathered as int64 inputs and int32
// next-token labels.
class TextTokens final : public SampleSource {
 public:
  static absl::StatusOr<std::shared_ptr<const TextTokens>> Open(
      const TextOptions& options);

  int64_t size() const override { return windows_; }
  InputType input_type() const override { return InputType::kInt64; }
  int64_t vocabulary() const { return vocabulary_; }
  // Tokens in the split's part of the stream (a tail of under seq_len + 1
  // fills no window).
  int64_t tokens() const { return end_ - begin_; }
  // Text has no float inputs: kFailedPrecondition.
  absl::Status Gather(std::span<const int64_t> indices,
                      const GatherContext& context, float* x,
                      int32_t* y) const override;
  absl::Status GatherIds(std::span<const int64_t> indices,
                         const GatherContext& context, int64_t* x,
                         int32_t* y) const override;
  int64_t bytes_read() const override { return bytes_.load(); }
  // Each file's size and first 4 KiB, and the vocabulary's.
  void Describe(Fingerprint* f) const override;

 private:
  TextTokens() = default;
  // Tokens [at, at + n) of the whole stream into out.
  void Copy(int64_t at, int64_t n, int64_t* out) const;

  std::vector<std::string> paths_;
  // Byte-level: the files, mapped, and each one's first token; empty for a
  // vocabulary's stream, which is in ids_.
  std::vector<std::shared_ptr<const MappedFile>> files_;
  std::vector<int64_t> starts_;
  std::vector<int32_t> ids_;     // a vocabulary's: the whole stream
  std::string vocab_path_;
  int64_t vocabulary_ = kByteVocabulary;
  int64_t seq_len_ = 0;
  int64_t begin_ = 0, end_ = 0;  // the split's tokens in the stream
  int64_t windows_ = 0;
  mutable std::atomic<int64_t> bytes_{0};
};

}  // namespace tally

#endif  // TALLY_COMMON_DATA_TEXT_H_
