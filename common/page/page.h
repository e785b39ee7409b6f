// The dashboard's one page (common/page/index.html, compiled in): the
// coordinator serves it live, `tally report` writes it with one job's data.
// In common/ because both stand on it, and a client includes no server.
#ifndef TALLY_COMMON_PAGE_PAGE_H_
#define TALLY_COMMON_PAGE_PAGE_H_

#include <string>
#include <vector>

#include "proto/tally.pb.h"

namespace tally {

const char* DashboardPage();

// The page with `detail_json` (the JSON of /api/jobs/ID, plus
// "written_unix") built in, for a file that needs no server.
std::string StaticReportPage(const std::string& detail_json);

// `m` as the page reads it: proto field names, every field printed.
std::string PageJson(const google::protobuf::Message& m);

// The ranges of `job_id` on `shards`, as the page's "shards" array (every
// string through protobuf's JSON printer, so escaped).
std::string JobShardsJson(const std::vector<v1::ShardInfo>& shards,
                          const std::string& job_id);

}  // namespace tally

#endif  // TALLY_COMMON_PAGE_PAGE_H_
