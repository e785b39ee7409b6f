// A program's Prometheus metrics: one prometheus-cpp registry for what the
// program counts as it goes (counters, histograms), collectors that read a
// state at scrape time (jobs, shards, workers), and an HTTP endpoint serving
// both at /metrics in the text exposition format (prometheus-cpp's
// TextSerializer). The HTTP side is common/http's small server, not
// prometheus-cpp's civetweb one: civetweb starts its threads with a 100 KiB
// stack, which fails in a process that links cuBLAS (its libraries' static
// TLS alone is over 90 KiB).
//
// Names follow Prometheus's conventions: the `tally_` prefix, base units
// (`_seconds`, `_bytes`), `_total` on counters, and labels whose values are
// bounded (job and worker ids of live jobs, shard addresses).
//
// Thread-safe: prometheus-cpp's metrics and registry are.
#ifndef TALLY_COMMON_METRICS_METRICS_H_
#define TALLY_COMMON_METRICS_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_server.h"

namespace tally {

class MetricsEndpoint {
 public:
  // Serves /metrics on `address` ("0.0.0.0:9100" or "127.0.0.1:9100"; port
  // 0 picks one). kUnavailable when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return http_->port(); }
  // Also served: a collector read at every scrape. Kept alive by the
  // endpoint until removed.
  void Add(std::shared_ptr<prometheus::Collectable> collectable);
  // No longer served (call before what it reads goes away).
  void Remove(const std::shared_ptr<prometheus::Collectable>& collectable);
  prometheus::Registry& registry() { return *registry_; }
  // The exposition text of everything served (what a scrape gets).
  std::string Render() const;

 private:
  MetricsEndpoint() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex mu_;  // guards collectables_
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<HttpServer> http_;  // last: stops before the rest goes
};

// Building families in a collector's Collect().
prometheus::MetricFamily Family(std::string name, std::string help,
                                prometheus::MetricType type);
void AddSample(prometheus::MetricFamily* family,
               std::vector<std::pair<std::string, std::string>> labels,
               double value);

// Buckets for latencies from 100 µs to 30 s.
prometheus::Histogram::BucketBoundaries LatencyBuckets();

// A counter, or a latency histogram, with no labels, registered in
// `registry` (which owns it).
prometheus::Counter& AddCounter(prometheus::Registry& registry,
                                const char* name, const char* help);
prometheus::Histogram& AddLatencyHistogram(prometheus::Registry& registry,
                                           const char* name, const char* help);

}  // namespace tally

#endif  // TALLY_COMMON_METRICS_METRICS_H_
