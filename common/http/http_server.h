// A small HTTP/1.1 server for Tally's read-only pages: /metrics and the
// coordinator's dashboard. One thread answers one request per connection
// (GET only, request head at most 8 KiB, 2 s in all to send it, 10 s to
// take the answer), then closes it:
// enough for Prometheus and a browser refreshing every few seconds, and
// nothing a client sends can hold it longer than that.
//
// Thread-safe; the handler runs on the server's thread.
#ifndef TALLY_COMMON_HTTP_HTTP_SERVER_H_
#define TALLY_COMMON_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace tally {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  // `handler` gets the path of a GET (query string included).
  using Handler = std::function<HttpResponse(const std::string& path)>;

  // Listens on `address` ("0.0.0.0:8080"; port 0 picks one). kUnavailable
  // when it cannot; kInvalidArgument for an address that is not IPv4:PORT.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  HttpServer() = default;
  void Serve();
  void Answer(int fd) const;

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tally

#endif  // TALLY_COMMON_HTTP_HTTP_SERVER_H_
