// A range's weights as pulls read them: the current vector, shared with its
// readers (immutable snapshots), spare vectors to step into while a reader
// still holds the current one, and the bfloat16 encoding of the last
// version pulled in bfloat16, made once however many workers pull it.
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock
// (a bfloat16 encoding is made outside it, between Bfloat16Of and
// KeepBfloat16).
#ifndef TALLY_SERVER_DATA_PUBLISHED_WEIGHTS_H_
#define TALLY_SERVER_DATA_PUBLISHED_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace tally {

class PublishedWeights {
 public:
  explicit PublishedWeights(std::vector<float> weights)
      : current_(std::make_shared<std::vector<float>>(std::move(weights))) {}
  PublishedWeights(const PublishedWeights&) = delete;
  PublishedWeights& operator=(const PublishedWeights&) = delete;

  // The current weights (what Snapshot hands out).
  const std::shared_ptr<std::vector<float>>& current() const {
    return current_;
  }
  // The weights to step now: the current vector when no reader holds it,
  // which is the rule in a steady job (every member pulled it before it
  // pushed); otherwise a copy of it, in a spare no reader holds, which
  // becomes the current one. What a reader holds never changes under it.
  float* Writable();
  // The encoding of `snapshot` (the weights of `version`) kept already, or
  // null. Keyed by the version: snapshot buffers are reused for later ones.
  std::shared_ptr<const std::vector<uint16_t>> Bfloat16Of(
      const std::vector<float>& snapshot, int64_t version) const;
  // Keeps `encoded` as the encoding of `version` (the latest is kept: half
  // the range's float32 bytes).
  void KeepBfloat16(int64_t version,
                    std::shared_ptr<const std::vector<uint16_t>> encoded);
  // The job ended: the spares and the encoding go, the weights stay.
  void Retire();

 private:
  std::shared_ptr<std::vector<float>> current_;
  // Earlier weights, reused once no reader holds them any more.
  std::vector<std::shared_ptr<std::vector<float>>> spares_;
  int64_t bf16_version_ = -1;
  std::shared_ptr<const std::vector<uint16_t>> bf16_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_PUBLISHED_WEIGHTS_H_
