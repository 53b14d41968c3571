// A small HTTP/1.1 server for a daemon's metrics port: GET (and HEAD) of a fixed set of paths,
// each answered by a handler on the server's one thread, the connection closed after each answer.
// What it serves is for people and scrapers on a trusted network (Prometheus, a browser, `fluxon
// top`): no TLS, no keep-alive, nothing written by a request.
//
// Bounds: a request's head is at most kMaxHead bytes (431 past it), a connection is served within
// kIoTimeoutMs of reading and writing each, one connection at a time (a slow client delays the
// next by at most that), kBacklog connections wait in the kernel.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "fluxon/runtime/status.hpp"

namespace fluxon {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  static constexpr size_t kMaxHead = 16 * 1024;
  static constexpr int kIoTimeoutMs = 2000;
  static constexpr int kBacklog = 64;
  static constexpr size_t kDrainBytes = 1 << 20;  // read and dropped after an answer, at most,
  static constexpr int kDrainMs = 100;             // while the client keeps sending
  using Handler = std::function<HttpResponse()>;

  // Listens on host:port (port 0: the kernel picks; port() says which) and serves `routes` (exact
  // paths; a query string is ignored) until destroyed. An error names the address.
  static Result<std::unique_ptr<HttpServer>> start(const std::string& host, uint16_t port,
                                                   std::map<std::string, Handler> routes);
  ~HttpServer();
  uint16_t port() const;
  uint64_t requests_served() const;

  // What a request's head asks for: the method and the path without its query string, or an
  // error status (400 malformed, 405 a method other than GET and HEAD). Exposed for tests.
  struct Asked {
    int error = 0;
    std::string method, path;
  };
  static Asked parse_head(const std::string& head);

 private:
  HttpServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
