#include "common/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tally {

namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kIoTimeoutMs = 2000;

// Reads the request head (up to the blank line), bounded in size and time.
std::string ReadHead(int fd) {
  std::string head;
  char buf[1024];
  while (head.size() < kMaxRequestBytes &&
         head.find("\r\n\r\n") == std::string::npos &&
         head.find("\n\n") == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, kIoTimeoutMs) <= 0) break;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  return head;
}

void WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, kIoTimeoutMs) <= 0) return;
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done,
                           MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string Response(const char* status, const char* type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address ", address, " is not HOST:PORT"));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string host = address.substr(0, colon);
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(),
                &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address ", address, ": give an IPv4 address to listen on"));
  }
  std::unique_ptr<MetricsEndpoint> m(new MetricsEndpoint());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(m->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (m->listen_fd_ < 0 ||
      bind(m->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
          0 ||
      listen(m->listen_fd_, 16) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(m->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  m->port_ = ntohs(addr.sin_port);
  MetricsEndpoint* raw = m.get();
  m->thread_ = std::thread([raw] { raw->Serve(); });
  return m;
}

MetricsEndpoint::~MetricsEndpoint() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsEndpoint::Add(std::shared_ptr<prometheus::Collectable> collectable) {
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

void MetricsEndpoint::Serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;  // wakes to see stop_
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    close(fd);
  }
}

void MetricsEndpoint::Answer(int fd) const {
  const std::string head = ReadHead(fd);
  const size_t eol = head.find_first_of("\r\n");
  const std::string line = head.substr(0, eol);
  if (absl::StartsWith(line, "GET /metrics ") ||
      absl::StartsWith(line, "GET /metrics?")) {
    WriteAll(fd, Response("200 OK", "text/plain; version=0.0.4; charset=utf-8",
                          Render()));
  } else if (absl::StartsWith(line, "GET ")) {
    WriteAll(fd, Response("404 Not Found", "text/plain; charset=utf-8",
                          "Tally serves its metrics at /metrics\n"));
  } else {
    WriteAll(fd, Response("400 Bad Request", "text/plain; charset=utf-8",
                          "GET /metrics\n"));
  }
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
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,     10, 30};
}

}  // namespace tally
