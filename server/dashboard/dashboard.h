// The coordinator's dashboard (tally-server --http_port): the page, and the
// JSON it refreshes from every 2 s, read from the same state JobService
// serves:
//   /                 the page (common/page/index.html)
//   /api/jobs         {"jobs": [Job, ...]} without specs, in submission order
//   /api/jobs/ID      {"job", "history", "workers", "shards",
//                      "checkpoint_age_seconds"}
// Anything else, or an unknown job: 404. Read-only; no tokens are checked,
// so it listens on loopback unless told otherwise (--http_listen).
#ifndef TALLY_SERVER_DASHBOARD_DASHBOARD_H_
#define TALLY_SERVER_DASHBOARD_DASHBOARD_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/http/http_server.h"

namespace tally {

class Coordinator;


class Dashboard {
 public:
  // `coordinator` is borrowed.
  explicit Dashboard(const Coordinator* coordinator) : coord_(coordinator) {}
  HttpResponse Handle(const std::string& path) const;
  // The JSON of /api/jobs/ID; kNotFound for an unknown job.
  absl::StatusOr<std::string> JobDetailJson(const std::string& job_id) const;

 private:
  const Coordinator* coord_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DASHBOARD_DASHBOARD_H_
