#include "common/metrics/metrics.h"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <iterator>
#include <sstream>

namespace tally {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address) {
  std::unique_ptr<MetricsEndpoint> m(new MetricsEndpoint());
  m->registry_ = std::make_shared<prometheus::Registry>();
  MetricsEndpoint* raw = m.get();
  auto http = HttpServer::Start(address, [raw](const std::string& path) {
    if (path == "/metrics" || path.rfind("/metrics?", 0) == 0) {
      return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                          raw->Render()};
    }
    return HttpResponse{404, "text/plain; charset=utf-8",
                        "Tally serves its metrics at /metrics\n"};
  });
  if (!http.ok()) return http.status();
  m->http_ = *std::move(http);
  return m;
}

MetricsEndpoint::~MetricsEndpoint() { http_.reset(); }

void MetricsEndpoint::Add(
    std::shared_ptr<prometheus::Collectable> collectable) {
  std::lock_guard<std::mutex> lock(mu_);
  collectables_.push_back(std::move(collectable));
}

void MetricsEndpoint::Remove(
    const std::shared_ptr<prometheus::Collectable>& collectable) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase(collectables_, collectable);
}

std::string MetricsEndpoint::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  {
    // Held while collecting: Remove waits for a scrape in progress, so a
    // collector is never read after its owner removed it.
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : collectables_) {
      std::vector<prometheus::MetricFamily> more = c->Collect();
      std::move(more.begin(), more.end(), std::back_inserter(families));
    }
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

prometheus::MetricFamily Family(std::string name, std::string help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddSample(prometheus::MetricFamily* family,
               std::vector<std::pair<std::string, std::string>> labels,
               double value) {
  prometheus::ClientMetric m;
  for (auto& [k, v] : labels) m.label.push_back({std::move(k), std::move(v)});
  switch (family->type) {
    case prometheus::MetricType::Counter:
      m.counter.value = value;
      break;
    case prometheus::MetricType::Gauge:
      m.gauge.value = value;
      break;
    default:
      m.untyped.value = value;
      break;
  }
  family->metric.push_back(std::move(m));
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30};
}

prometheus::Counter& AddCounter(prometheus::Registry& registry,
                                const char* name, const char* help) {
  return prometheus::BuildCounter()
      .Name(name)
      .Help(help)
      .Register(registry)
      .Add({});
}

prometheus::Histogram& AddLatencyHistogram(prometheus::Registry& registry,
                                           const char* name, const char* help) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Register(registry)
      .Add({}, LatencyBuckets());
}

}  // namespace tally
