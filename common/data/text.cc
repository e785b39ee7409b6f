#include "common/data/text.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data/data_file.h"
#include "common/status_macros.h"

namespace tally {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One vocabulary line's token, its escapes undone.
absl::StatusOr<std::string> Unescape(absl::string_view line,
                                     const std::string& where) {
  std::string out;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] != '\\') {
      out.push_back(line[i]);
      continue;
    }
    if (++i == line.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a line ends in a lone \\ (write \\\\)"));
    }
    switch (line[i]) {
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 's': out.push_back(' '); break;
      case '\\': out.push_back('\\'); break;
      case 'x': {
        const int hi = i + 1 < line.size() ? HexDigit(line[i + 1]) : -1;
        const int lo = i + 2 < line.size() ? HexDigit(line[i + 2]) : -1;
        if (hi < 0 || lo < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": \\x needs two hex digits"));
        }
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            where, ":", i, ": an unknown escape (known: \\n \\r \\t \\s "
            "\\\\ \\xHH)"));
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  return ReadWholeFile(path);
}

constexpr int64_t kDescribedBytes = 4096;

}  // namespace

absl::StatusOr<Vocabulary> Vocabulary::Parse(absl::string_view text,
                                             const std::string& name) {
  Vocabulary v;
  v.token_at_.push_back(-1);
  int64_t line_no = 0;
  size_t at = 0;
  while (at < text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == absl::string_view::npos) eol = text.size();
    absl::string_view line = text.substr(at, eol - at);
    at = eol + 1;
    ++line_no;
    const std::string where = absl::StrCat(name, ":", line_no);
    if (line.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": an empty line (a token has at least one byte)"));
    }
    if (v.size() >= kMaxVocabulary) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": more than ", kMaxVocabulary, " tokens"));
    }
    TALLY_ASSIGN_OR_RETURN(std::string token, Unescape(line, where));
    const int32_t id = static_cast<int32_t>(v.size());
    if (token == "<unk>") {
      v.unknown_ = id;
      v.tokens_.push_back(std::move(token));
      continue;  // stands for bytes; never matched as text
    }
    if (v.token_at_.size() + token.size() > size_t{1} << 30) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the vocabulary's tokens pass 2^30 bytes"));
    }
    int32_t node = 0;
    for (const char c : token) {
      const int64_t key = (int64_t{node} << 8) | static_cast<uint8_t>(c);
      auto [it, added] =
          v.edges_.try_emplace(key, static_cast<int32_t>(v.token_at_.size()));
      if (added) v.token_at_.push_back(-1);
      node = it->second;
    }
    if (v.token_at_[node] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the token of line ", v.token_at_[node] + 1, " again"));
    }
    v.token_at_[node] = id;
    v.tokens_.push_back(std::move(token));
  }
  if (v.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no tokens"));
  }
  return v;
}

absl::StatusOr<Vocabulary> Vocabulary::Load(const std::string& path) {
  TALLY_ASSIGN_OR_RETURN(std::string text, ReadWhole(path));
  return Parse(text, path);
}

absl::Status Vocabulary::Tokenize(absl::string_view text,
                                  const std::string& name, int64_t offset,
                                  std::vector<int32_t>* out) const {
  size_t at = 0;
  while (at < text.size()) {
    int32_t node = 0, best = -1;
    size_t best_end = at;
    for (size_t i = at; i < text.size(); ++i) {
      auto it = edges_.find((int64_t{node} << 8) |
                            static_cast<uint8_t>(text[i]));
      if (it == edges_.end()) break;
      node = it->second;
      if (token_at_[node] >= 0) {
        best = token_at_[node];
        best_end = i + 1;
      }
    }
    if (best < 0) {
      if (unknown_ < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": byte ", offset + static_cast<int64_t>(at),
            " starts no token of the vocabulary, which has no <unk>"));
      }
      best = unknown_;
      best_end = at + 1;
    }
    out->push_back(best);
    at = best_end;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const TextTokens>> TextTokens::Open(
    const TextOptions& o) {
  if (o.files.empty()) {
    return absl::InvalidArgumentError("a text dataset needs files");
  }
  if (o.seq_len < 1 || !(o.begin >= 0 && o.begin <= o.end && o.end <= 1)) {
    return absl::InvalidArgumentError(
        "a text split needs seq_len >= 1 and 0 <= begin <= end <= 1");
  }
  std::shared_ptr<TextTokens> t(new TextTokens);
  t->seq_len_ = o.seq_len;
  t->vocab_path_ = o.vocab;
  std::unique_ptr<Vocabulary> vocab;
  if (!o.vocab.empty()) {
    TALLY_ASSIGN_OR_RETURN(Vocabulary v, Vocabulary::Load(o.vocab));
    vocab = std::make_unique<Vocabulary>(std::move(v));
    t->vocabulary_ = vocab->size();
  }
  int64_t total = 0;
  for (const std::string& path : o.files) {
    TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> f,
                           MappedFile::Open(path));
    t->starts_.push_back(total);
    if (vocab != nullptr) {
      TALLY_RETURN_IF_ERROR(vocab->Tokenize(
          absl::string_view(f->data(), static_cast<size_t>(f->size())), path,
          0, &t->ids_));
      total = static_cast<int64_t>(t->ids_.size());
    } else {
      f->AdviseRandom();
      total += f->size();
    }
    t->files_.push_back(std::move(f));
  }
  // Fractions of the stream, so that both splits cut it at one place.
  t->begin_ = static_cast<int64_t>(std::floor(o.begin * total));
  t->end_ = static_cast<int64_t>(std::floor(o.end * total));
  t->windows_ = (t->end_ - t->begin_) / (o.seq_len + 1);
  t->paths_ = o.files;
  if (vocab != nullptr) t->files_.clear();  // the stream is in ids_
  return std::shared_ptr<const TextTokens>(std::move(t));
}

void TextTokens::Copy(int64_t at, int64_t n, int64_t* out) const {
  if (files_.empty()) {  // a vocabulary's
    std::copy(ids_.begin() + at, ids_.begin() + at + n, out);
    return;
  }
  // The file holding token `at`, then on across file boundaries.
  size_t f = static_cast<size_t>(
      std::upper_bound(starts_.begin(), starts_.end(), at) - starts_.begin() -
      1);
  while (n > 0) {
    const MappedFile& file = *files_[f];
    const int64_t from = at - starts_[f];
    const int64_t take = std::min(n, file.size() - from);
    const auto* bytes = reinterpret_cast<const uint8_t*>(file.data() + from);
    for (int64_t i = 0; i < take; ++i) out[i] = bytes[i];
    out += take;
    at += take;
    n -= take;
    ++f;
  }
}

absl::Status TextTokens::Gather(std::span<const int64_t> /*indices*/,
                                const GatherContext& /*context*/,
                                float* /*x*/, int32_t* /*y*/) const {
  return absl::FailedPreconditionError(
      "a text dataset's inputs are token ids (int64), not floats");
}

absl::Status TextTokens::GatherIds(std::span<const int64_t> indices,
                                   const GatherContext& /*context*/,
                                   int64_t* x, int32_t* y) const {
  const int64_t window = seq_len_ + 1;
  std::vector<int64_t> w(static_cast<size_t>(window));
  for (size_t i = 0; i < indices.size(); ++i) {
    Copy(begin_ + indices[i] * window, window, w.data());
    std::copy(w.begin(), w.end() - 1, x + i * seq_len_);
    for (int64_t k = 0; k < seq_len_; ++k) {
      y[i * seq_len_ + k] = static_cast<int32_t>(w[k + 1]);
    }
  }
  bytes_.fetch_add(static_cast<int64_t>(indices.size()) * window *
                       (files_.empty() ? static_cast<int64_t>(sizeof(int32_t)) : 1),
                   std::memory_order_relaxed);
  return absl::OkStatus();
}

void TextTokens::Describe(Fingerprint* f) const {
  auto describe = [f](const std::string& path) {
    absl::StatusOr<std::shared_ptr<const MappedFile>> m =
        MappedFile::Open(path);
    if (!m.ok()) {
      f->AddFile(-1);
      return;
    }
    f->AddFile((*m)->size());
    f->Add(absl::string_view(
        (*m)->data(),
        static_cast<size_t>(std::min((*m)->size(), kDescribedBytes))));
  };
  for (const std::string& path : paths_) describe(path);
  if (!vocab_path_.empty()) describe(vocab_path_);
  f->Add(seq_len_);
}

}  // namespace tally
