// The HTTP server behind /metrics and the dashboard: slow or silent clients
// do not hold up anybody else's request.
#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// The whole answer to one GET (the server closes the connection after it).
std::string Get(int port, const std::string& path) {
  const int fd = Connect(port);
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

// Nothing has come back on `fd` yet: the server still waits for its request.
bool Unanswered(int fd) {
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN;
}

// A server answering every GET with `body` (or the path, when empty);
// clients get `request_timeout` to send their request.
std::unique_ptr<HttpServer> StartServer(absl::Duration request_timeout,
                                        std::string body = "") {
  HttpServer::Options o;
  o.request_timeout = request_timeout;
  auto server = HttpServer::Start(
      "127.0.0.1:0",
      [body](const std::string& path) {
        return HttpResponse{200, "text/plain", body.empty() ? "path " + path
                                                            : body};
      },
      o);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(HttpServerTest, SilentConnectionsDoNotDelayOthers) {
  // Silent clients are given a minute, so that they are surely still
  // waited on when the GET has its answer, however slow the machine.
  std::unique_ptr<HttpServer> server = StartServer(absl::Minutes(1));
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(Connect(port));
  // Answered while the four silent ones are still waited on: a connection
  // does not wait for the ones before it.
  const std::string answer = Get(port, "/metrics");
  EXPECT_NE(answer.find("200 OK"), std::string::npos) << answer;
  EXPECT_NE(answer.find("path /metrics"), std::string::npos) << answer;
  for (int fd : silent) {
    EXPECT_TRUE(Unanswered(fd));
    close(fd);
  }
}

TEST(HttpServerTest, ConnectionsBeyondTheBoundAreTurnedAwayAtOnce) {
  std::unique_ptr<HttpServer> server = StartServer(absl::Minutes(1), "ok");
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  std::vector<int> silent;
  for (int i = 0; i < HttpServer::kMaxConnections; ++i)
    silent.push_back(Connect(port));
  // The server takes connections in order: once it holds the bound, the
  // next is answered 503 without its request being read.
  std::string answer;
  for (int attempt = 0; attempt < 50; ++attempt) {
    answer = Get(port, "/");
    if (answer.find("503") != std::string::npos) break;
  }
  EXPECT_NE(answer.find("503 Service Unavailable"), std::string::npos)
      << answer;
  for (int fd : silent) close(fd);
}

// The server's end does not wait for its clients: open connections are
// shut down, not waited out.
TEST(HttpServerTest, StoppingDoesNotWaitForSilentClients) {
  std::unique_ptr<HttpServer> server = StartServer(absl::Hours(1), "ok");
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  // Accepted (a GET after it is answered, so the loop has taken it).
  EXPECT_NE(Get(server->port(), "/").find("200 OK"), std::string::npos);
  server.reset();  // returns: the silent connection was shut down
  char c;
  EXPECT_LE(read(fd, &c, 1), 0);  // and its client sees the end
  close(fd);
}

}  // namespace
}  // namespace tally
