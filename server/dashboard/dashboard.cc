#include "server/dashboard/dashboard.h"

#include <cctype>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/control/coordinator.h"
#include "common/page/page.h"

namespace tally {

namespace {

HttpResponse NotFound(const std::string& what) {
  std::string safe;
  for (char c : what.substr(0, 200)) {
    if (c == '<')
      safe += "&lt;";
    else if (c == '>')
      safe += "&gt;";
    else if (c == '&')
      safe += "&amp;";
    else
      safe += c;
  }
  return {404, "text/html; charset=utf-8",
          absl::StrCat("<!doctype html><title>Not found</title><h1>Not "
                       "found</h1><p>",
                       safe, "</p><p><a href=\"/\">All jobs</a></p>\n")};
}

// "%2D" and friends in a job id from the URL.
std::string Unescape(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() &&
        isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(
          std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> Dashboard::JobDetailJson(
    const std::string& job_id) const {
  auto job = coord_->Get(job_id);
  if (!job.ok()) return job.status();
  auto history = coord_->History(job_id);
  if (!history.ok()) return history.status();
  auto workers = coord_->JobWorkers(job_id);
  if (!workers.ok()) return workers.status();
  std::string out =
      absl::StrCat("{\"job\":", PageJson(*job),
                   ",\"history\":", PageJson(*history), ",\"workers\":[");
  for (size_t i = 0; i < workers->size(); ++i)
    absl::StrAppend(&out, i ? "," : "", PageJson((*workers)[i]));
  out += "],\"shards\":";
  out += JobShardsJson(coord_->ListShards(), job_id);
  const CoordinatorStats stats = coord_->Stats();
  if (auto it = stats.checkpoint_age_seconds.find(job_id);
      it != stats.checkpoint_age_seconds.end()) {
    absl::StrAppend(&out, ",\"checkpoint_age_seconds\":", it->second);
  }
  out += "}";
  return out;
}

HttpResponse Dashboard::Handle(const std::string& raw_path) const {
  absl::string_view path = raw_path;
  path = path.substr(0, path.find('?'));
  if (path == "/" || path == "/index.html") {
    return {200, "text/html; charset=utf-8", DashboardPage()};
  }
  if (path == "/api/jobs") {
    std::string out = "{\"jobs\":[";
    bool first = true;
    for (const v1::Job& j : coord_->List(/*with_specs=*/false)) {
      absl::StrAppend(&out, first ? "" : ",", PageJson(j));
      first = false;
    }
    out += "]}";
    return {200, "application/json", out};
  }
  if (absl::ConsumePrefix(&path, "/api/jobs/")) {
    const std::string id = Unescape(path);
    auto json = JobDetailJson(id);
    if (!json.ok())
      return {404, "application/json", "{\"error\":\"no such job\"}"};
    return {200, "application/json", *json};
  }
  return NotFound(absl::StrCat("Nothing at ", raw_path, "."));
}

}  // namespace tally
