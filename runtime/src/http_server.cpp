#include "fluxon/runtime/http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

namespace fluxon {

namespace {

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    default: return "Internal Server Error";
  }
}

// Waits until fd is ready for `events` or the deadline passes (false then, or on the stop pipe).
bool wait_fd(int fd, short events, int stop_fd, int timeout_ms) {
  pollfd p[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
  for (;;) {
    const int n = ::poll(p, 2, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (p[1].revents) return false;
    return true;
  }
}

}  // namespace

struct HttpServer::Impl {
  int listen_fd = -1;
  int stop_pipe[2] = {-1, -1};
  uint16_t port = 0;
  std::map<std::string, Handler> routes;
  std::atomic<uint64_t> served{0};
  std::thread thread;

  ~Impl() {
    if (thread.joinable()) {
      const char b = 1;
      (void)!::write(stop_pipe[1], &b, 1);
      thread.join();
    }
    for (int fd : {listen_fd, stop_pipe[0], stop_pipe[1]})
      if (fd >= 0) ::close(fd);
  }

  void run() {
    for (;;) {
      if (!wait_fd(listen_fd, POLLIN, stop_pipe[0], -1)) {
        // The stop pipe (or an error on the socket: stop too rather than spin).
        return;
      }
      const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      serve(c);
      ::close(c);
    }
  }

  void serve(int c) {
    std::string head;
    char buf[4096];
    int status = 0;
    while (head.find("\r\n\r\n") == std::string::npos) {
      if (head.size() >= kMaxHead) {
        status = 431;
        break;
      }
      if (!wait_fd(c, POLLIN, stop_pipe[0], kIoTimeoutMs)) return;  // silent or stopping: drop it
      const ssize_t n = ::recv(c, buf, std::min(sizeof buf, kMaxHead + 4 - head.size()), 0);
      if (n <= 0) return;
      head.append(buf, size_t(n));
    }
    HttpResponse rep;
    bool head_only = false;
    if (status == 0) {
      const Asked a = parse_head(head);
      status = a.error;
      head_only = a.method == "HEAD";
      if (status == 0) {
        auto it = routes.find(a.path);
        if (it == routes.end()) {
          status = 404;
        } else {
          rep = it->second();
          status = rep.status;
        }
      }
    }
    if (status != 200 && rep.body.empty()) rep.body = std::to_string(status) + " " + reason(status) + "\n";
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\nContent-Type: " +
                      rep.content_type + "\r\nContent-Length: " + std::to_string(rep.body.size()) +
                      "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n";
    if (!head_only) out += rep.body;
    size_t sent = 0;
    while (sent < out.size()) {
      if (!wait_fd(c, POLLOUT, stop_pipe[0], kIoTimeoutMs)) return;
      const ssize_t n = ::send(c, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += size_t(n);
    }
    served.fetch_add(1, std::memory_order_relaxed);
    // A lingering close: what the client still sends (the rest of a head past kMaxHead) is read and
    // dropped until it closes too - at most kDrainBytes, and no longer than kDrainMs of silence:
    // closing with unread bytes would reset the connection and could take the answer with it.
    ::shutdown(c, SHUT_WR);
    size_t drained = 0;
    while (drained < kDrainBytes && wait_fd(c, POLLIN, stop_pipe[0], kDrainMs)) {
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      drained += size_t(n);
    }
  }
};

HttpServer::Asked HttpServer::parse_head(const std::string& head) {
  Asked a;
  const size_t eol = head.find("\r\n");
  const std::string line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    a.error = 400;
    return a;
  }
  a.method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (target.empty() || target[0] != '/') {
    a.error = 400;
    return a;
  }
  if (const size_t q = target.find_first_of("?#"); q != std::string::npos) target.resize(q);
  a.path = target;
  if (a.method != "GET" && a.method != "HEAD") a.error = 405;
  return a;
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const std::string& host, uint16_t port,
                                                      std::map<std::string, Handler> routes) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return Status(Code::kInvalidArgument, "http " + where + ": " + ::gai_strerror(rc));
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->impl_ = std::make_unique<Impl>();
  Impl& I = *s->impl_;
  I.routes = std::move(routes);
  std::string err = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, kBacklog) == 0) {
      I.listen_fd = fd;
      break;
    }
    err = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (I.listen_fd < 0) return Status(Code::kInvalidArgument, "http " + where + ": cannot listen: " + err);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(I.listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  I.port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (::pipe2(I.stop_pipe, O_CLOEXEC) != 0) return Status(Code::kInternal, "http " + where + ": pipe failed");
  I.thread = std::thread([&I] { I.run(); });
  return s;
}

HttpServer::~HttpServer() = default;
uint16_t HttpServer::port() const { return impl_->port; }
uint64_t HttpServer::requests_served() const { return impl_->served.load(std::memory_order_relaxed); }

}  // namespace fluxon
