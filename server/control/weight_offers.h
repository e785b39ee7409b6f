// The offers of Python models' initial weights that the coordinator is
// reading (WorkerService.OfferInitialWeights). An offer holds the values
// read so far, up to its whole model (4 bytes a parameter, 1 GiB at the
// default --max_params), so that however many workers offer at once:
//   - a job has one offer being read at a time;
//   - the offers being read hold at most `max_bytes` of values together,
//     except that one offer alone may be larger (a model over the budget
//     can still be offered, once nothing else is being read);
//   - an offer whose job ends (or whose worker leaves the job) is ended
//     then: its end callback finishes the stream, whose reader frees the
//     values.
// The coordinator owns one and lets offers in under its own lock
// (Coordinator::BeginInitialWeights); each Offer belongs to its reader.
//
// Thread-safe. An end callback runs without this object's lock held. An
// Offer may outlive the WeightOffers that let it in.
#ifndef TALLY_SERVER_CONTROL_WEIGHT_OFFERS_H_
#define TALLY_SERVER_CONTROL_WEIGHT_OFFERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tally {

class WeightOffers {
 private:
  struct State;

 public:
  // One offer let in: its job's place and its bytes are held until it
  // goes (when its reader is done with the values).
  class Offer {
   public:
    Offer(const Offer&) = delete;
    Offer& operator=(const Offer&) = delete;
    ~Offer();
    int64_t values() const { return values_; }

   private:
    friend class WeightOffers;
    Offer(std::shared_ptr<State> state, std::string job_id, int64_t id,
          int64_t values)
        : state_(std::move(state)),
          job_id_(std::move(job_id)),
          id_(id),
          values_(values) {}
    std::shared_ptr<State> state_;
    const std::string job_id_;
    const int64_t id_;
    const int64_t values_;
  };

  explicit WeightOffers(int64_t max_bytes)
      : max_bytes_(max_bytes), state_(std::make_shared<State>()) {}
  WeightOffers(const WeightOffers&) = delete;
  WeightOffers& operator=(const WeightOffers&) = delete;

  // Lets in `worker_id`'s offer of `values` float32 values for `job_id`:
  // kResourceExhausted + OFFER_BUSY while another offer of the job is
  // being read, or while others are and this one would take the bytes
  // being read past max_bytes (the message names the bound). `end` is
  // called once, if End ends the offer before it goes.
  absl::StatusOr<std::unique_ptr<Offer>> Begin(
      const std::string& job_id, const std::string& worker_id,
      int64_t values, std::function<void(absl::Status)> end);
  // Ends the job's offer being read, if any (only `worker_id`'s, when
  // given): its end callback is called with `why`. The offer keeps its
  // place and bytes until its reader lets it go.
  void End(const std::string& job_id, const absl::Status& why,
           const std::string& worker_id = "");

  // The bytes of the offers being read, and how many there are.
  int64_t bytes() const;
  int size() const;

 private:
  struct Entry {
    int64_t id = 0;
    std::string worker_id;
    std::function<void(absl::Status)> end;  // empty once called
  };
  struct State {
    absl::Mutex mu;
    int64_t bytes ABSL_GUARDED_BY(mu) = 0;
    int64_t next_id ABSL_GUARDED_BY(mu) = 1;
    std::map<std::string, Entry> offers ABSL_GUARDED_BY(mu);  // by job
  };

  const int64_t max_bytes_;
  std::shared_ptr<State> state_;  // the offers' too
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_WEIGHT_OFFERS_H_
