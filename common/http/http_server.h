// A small HTTP/1.1 server for Tally's read-only pages: /metrics and the
// coordinator's dashboard. Each connection gets its own thread, which
// answers one request (GET only, request head at most 8 KiB, 2 s in all to
// send it, 10 s to take the answer: Options) and closes it. At most
// kMaxConnections are answered at once; a connection beyond that is
// answered 503 at once and closed, as is one whose thread cannot be
// started. So a slow or silent client holds one thread for 12 s at most
// and delays nobody else's scrape or page; the server's end shuts every
// open connection down at once.
//
// Thread-safe; the handler runs on the connections' threads, several at
// once, and must be thread-safe.
#ifndef TALLY_COMMON_HTTP_HTTP_SERVER_H_
#define TALLY_COMMON_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

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

  struct Options {
    // What a client has to send its request head, and to take the answer.
    absl::Duration request_timeout = absl::Seconds(2);
    absl::Duration answer_timeout = absl::Seconds(10);
  };

  // Listens on `address` ("0.0.0.0:8080"; port 0 picks one). kUnavailable
  // when it cannot; kInvalidArgument for an address that is not IPv4:PORT.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, Handler handler);
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, Handler handler, const Options& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  static constexpr int kMaxConnections = 32;

 private:
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
    // The socket, until its thread closes it (guarded by mu); shut down at
    // the server's end so that a slow client does not hold it up.
    absl::Mutex mu;
    int fd = -1;
  };
  HttpServer() = default;
  void Serve();
  void Answer(int fd) const;
  // A thread answering `fd`; false when none could be started.
  bool Spawn(int fd);
  // Joins the connections' threads that have finished (all, with `all`,
  // shutting their sockets down first).
  void Reap(bool all);

  Handler handler_;
  Options options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // accepts; owns connections_
  std::list<std::unique_ptr<Connection>> connections_;
};

}  // namespace tally

#endif  // TALLY_COMMON_HTTP_HTTP_SERVER_H_
