// The metrics port's HTTP server (http_server.hpp): real sockets on loopback. Also built under
// TSan (its thread and the destructor that stops it).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "fluxon/runtime/http_server.hpp"

using namespace fluxon;

namespace {

// Sends `request` as it is and reads the answer until the server closes.
std::string exchange(uint16_t port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server answered (431) and closed before reading it all
    sent += size_t(n);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
  ::close(fd);
  return out;
}

bool has(const std::string& doc, const std::string& part) { return doc.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("http server: a route, 404 for another path, 405 for POST, HEAD without the body, a query ignored") {
  auto s = HttpServer::start("127.0.0.1", 0, {{"/x", [] { return HttpResponse{200, "text/plain", "hello"}; }}});
  REQUIRE(s.ok());
  const uint16_t port = (*s)->port();
  REQUIRE(port != 0);
  std::string r = exchange(port, "GET /x?refresh=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(has(r, "Content-Length: 5\r\n"));
  CHECK(r.substr(r.size() - 5) == "hello");
  CHECK(exchange(port, "GET /y HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404 ", 0) == 0);
  CHECK(exchange(port, "POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n").rfind("HTTP/1.1 405 ", 0) == 0);
  r = exchange(port, "HEAD /x HTTP/1.1\r\n\r\n");
  CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(r.substr(r.size() - 4) == "\r\n\r\n");  // the head only
  CHECK((*s)->requests_served() == 4);
}

TEST_CASE("http server: a request head past kMaxHead is refused with 431, a malformed one with 400") {
  auto s = HttpServer::start("127.0.0.1", 0, {{"/", [] { return HttpResponse{}; }}});
  REQUIRE(s.ok());
  const std::string big = "GET / HTTP/1.1\r\nX-Pad: " + std::string(HttpServer::kMaxHead, 'a') + "\r\n\r\n";
  CHECK(exchange((*s)->port(), big).rfind("HTTP/1.1 431 ", 0) == 0);
  CHECK(exchange((*s)->port(), "garbage\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
  CHECK(HttpServer::parse_head("GET x HTTP/1.1\r\n\r\n").error == 400);  // not an absolute path
  CHECK(HttpServer::parse_head("GET /a#frag HTTP/1.0\r\n\r\n").path == "/a");
  CHECK(HttpServer::parse_head("DELETE /a HTTP/1.1\r\n\r\n").error == 405);
}

TEST_CASE("http server: a second server on a taken port fails naming the address") {
  auto a = HttpServer::start("127.0.0.1", 0, {});
  REQUIRE(a.ok());
  auto b = HttpServer::start("127.0.0.1", (*a)->port(), {});
  REQUIRE_FALSE(b.ok());
  CHECK(has(b.status().message(), "127.0.0.1:" + std::to_string((*a)->port())));
}

