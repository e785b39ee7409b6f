// The dashboard's one page (server/dashboard/index.html, compiled in): the
// coordinator serves it live, `tally report` writes it with one job's data.
#ifndef TALLY_SERVER_DASHBOARD_PAGE_H_
#define TALLY_SERVER_DASHBOARD_PAGE_H_

#include <string>

namespace tally {

const char* DashboardPage();

// The page with `detail_json` (the JSON of /api/jobs/ID, plus
// "written_unix") built in, for a file that needs no server.
std::string StaticReportPage(const std::string& detail_json);

}  // namespace tally

#endif  // TALLY_SERVER_DASHBOARD_PAGE_H_
