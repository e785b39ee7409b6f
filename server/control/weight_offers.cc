#include "server/control/weight_offers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/errors.h"

namespace tally {

WeightOffers::Offer::~Offer() {
  absl::MutexLock lock(&state_->mu);
  state_->bytes -= 4 * values_;
  auto it = state_->offers.find(job_id_);
  if (it != state_->offers.end() && it->second.id == id_)
    state_->offers.erase(it);
}

absl::StatusOr<std::unique_ptr<WeightOffers::Offer>> WeightOffers::Begin(
    const std::string& job_id, const std::string& worker_id, int64_t values,
    std::function<void(absl::Status)> end) {
  const int64_t bytes = 4 * values;
  absl::MutexLock lock(&state_->mu);
  if (state_->offers.count(job_id) > 0) {
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "another offer of ", job_id,
            "'s initial weights is being read: offer again once it is done")),
        v1::OFFER_BUSY);
  }
  // One offer alone may be larger than the budget: a model past it could
  // never be offered otherwise.
  if (state_->bytes > 0 && state_->bytes + bytes > max_bytes_) {
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "the initial weights being read hold ", state_->bytes,
            " bytes; this offer's ", bytes, " more would pass the "
            "coordinator's --max_offer_bytes (", max_bytes_,
            "): offer again later")),
        v1::OFFER_BUSY);
  }
  const int64_t id = state_->next_id++;
  state_->offers[job_id] = Entry{id, worker_id, std::move(end)};
  state_->bytes += bytes;
  return std::unique_ptr<Offer>(new Offer(state_, job_id, id, values));
}

void WeightOffers::End(const std::string& job_id, const absl::Status& why,
                       const std::string& worker_id) {
  std::function<void(absl::Status)> end;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->offers.find(job_id);
    if (it == state_->offers.end() ||
        (!worker_id.empty() && it->second.worker_id != worker_id)) {
      return;
    }
    end = std::exchange(it->second.end, nullptr);
  }
  if (end) end(why);
}

int64_t WeightOffers::bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->bytes;
}

int WeightOffers::size() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int>(state_->offers.size());
}

}  // namespace tally
