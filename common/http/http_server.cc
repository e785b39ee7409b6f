#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tally {

namespace {

constexpr size_t kMaxRequestBytes = 8192;

// Milliseconds left until `deadline` (0 once passed).
int Left(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(
      0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// Reads the request head (up to the blank line), bounded in size and in
// time as a whole: a client trickling bytes gets no more than the deadline.
std::string ReadHead(int fd, absl::Time deadline) {
  std::string head;
  char buf[1024];
  while (head.size() < kMaxRequestBytes &&
         head.find("\r\n\r\n") == std::string::npos &&
         head.find("\n\n") == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, Left(deadline)) <= 0) break;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  return head;
}

void WriteAll(int fd, const std::string& bytes, absl::Time deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, Left(deadline)) <= 0) return;
    const ssize_t n =
        send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 503:
      return "Service Unavailable";
    default:
      return "Internal Server Error";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, Handler handler) {
  return Start(address, std::move(handler), Options());
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, Handler handler, const Options& options) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP address ", address, " is not HOST:PORT"));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string host = address.substr(0, colon);
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(),
                &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HTTP address ", address, ": give an IPv4 address to listen on"));
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->handler_ = std::move(handler);
  s->options_ = options;
  s->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (s->listen_fd_ < 0 ||
      setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) !=
          0 ||
      bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
          0 ||
      listen(s->listen_fd_, 16) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve HTTP on ", address, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = ntohs(addr.sin_port);
  HttpServer* raw = s.get();
  s->thread_ = std::thread([raw] { raw->Serve(); });
  return s;
}

HttpServer::~HttpServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void HttpServer::Serve() {
  while (!stop_) {
    Reap(/*all=*/false);
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;  // wakes to see stop_
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (connections_.size() >= kMaxConnections || !Spawn(fd)) {
      // Busy: said at once, without reading the request or waiting for
      // the client to take the answer.
      static constexpr char kBusy[] =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
          "Retry-After: 1\r\nConnection: close\r\n\r\n";
      send(fd, kBusy, sizeof(kBusy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
    }
  }
  Reap(/*all=*/true);
}

bool HttpServer::Spawn(int fd) {
  auto c = std::make_unique<Connection>();
  Connection* raw = c.get();
  c->fd = fd;
  try {
    c->thread = std::thread([this, raw] {
      Answer(raw->fd);
      absl::MutexLock lock(&raw->mu);
      close(raw->fd);
      raw->fd = -1;
      raw->done = true;
    });
  } catch (const std::exception&) {  // system_error, bad_alloc
    return false;  // no thread to be had: the caller answers 503
  }
  connections_.push_back(std::move(c));
  return true;
}

void HttpServer::Reap(bool all) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    Connection& c = **it;
    if (all) {
      // The server is going: the connection's reads and writes end now.
      absl::MutexLock lock(&c.mu);
      if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);
    }
    if (all || c.done) {
      c.thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void HttpServer::Answer(int fd) const {
  const std::string head = ReadHead(fd, absl::Now() + options_.request_timeout);
  const std::string line = head.substr(0, head.find_first_of("\r\n"));
  HttpResponse r;
  // "GET /path HTTP/1.1"
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    r = {400, "text/plain; charset=utf-8", "malformed request\n"};
  } else if (line.substr(0, sp1) != "GET") {
    r = {405, "text/plain; charset=utf-8", "only GET\n"};
  } else {
    r = handler_(line.substr(sp1 + 1, sp2 - sp1 - 1));
  }
  WriteAll(fd,
           absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status),
                        "\r\nContent-Type: ", r.content_type,
                        "\r\nContent-Length: ", r.body.size(),
                        "\r\nCache-Control: no-store"
                        "\r\nConnection: close\r\n\r\n",
                        r.body),
           absl::Now() + options_.answer_timeout);
}

}  // namespace tally
