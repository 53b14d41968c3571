#include "fluxon/runtime/transport.hpp"

#include <utility>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fluxon {

namespace {

struct RequestHeader {
  uint32_t magic, version;
  uint64_t generation;
  uint32_t count, flags;
};
struct RangeWire {
  uint64_t offset, len;
};
struct ReplyHeader {
  uint32_t magic, status;
  uint64_t total;
};
static_assert(sizeof(RequestHeader) == 24 && sizeof(ReplyHeader) == 16 && sizeof(RangeWire) == 16);
// The keyed handshake (transport.hpp).
struct AuthChallenge {
  uint32_t magic, version;
  Nonce nonce;
};
struct AuthHello {
  uint32_t magic, node;
  uint64_t generation;
  Nonce nonce;
  Proof proof;
};
struct AuthVerdict {
  uint32_t magic, status;
  Proof proof;
};
static_assert(sizeof(AuthChallenge) == 24 && sizeof(AuthHello) == 64 && sizeof(AuthVerdict) == 40);
constexpr std::string_view kDataChannel = "data";

std::string identity_bytes(uint32_t node, uint64_t generation) {
  std::string s(12, '\0');
  std::memcpy(s.data(), &node, 4);
  std::memcpy(s.data() + 4, &generation, 8);
  return s;
}

}  // namespace

bool data_header_ok(const uint8_t* header, uint32_t* count) {
  RequestHeader h;
  std::memcpy(&h, header, sizeof(h));
  *count = h.count;
  return h.magic == kDataMagic && h.version == kDataVersion && h.count != 0 && h.count <= kDataMaxRanges;
}

DataStatus data_ranges_status(const uint8_t* ranges, uint32_t count, bool generation_ok, uint64_t segment_len,
                              uint64_t* total) {
  *total = 0;
  if (!generation_ok) return DataStatus::kGenerationMismatch;
  for (uint32_t i = 0; i < count; ++i) {
    RangeWire r;
    std::memcpy(&r, ranges + size_t(i) * sizeof(RangeWire), sizeof(r));
    if (r.offset > segment_len || r.len > segment_len - r.offset) {
      *total = 0;
      return DataStatus::kOutOfRange;
    }
    if (r.len > UINT64_MAX - *total) {  // the reply's total would wrap (found by fuzz_data_request)
      *total = 0;
      return DataStatus::kBadRequest;
    }
    *total += r.len;
  }
  return DataStatus::kOk;
}

namespace {

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Whole buffer or an error. EINTR retried; timeouts come from SO_RCVTIMEO / SO_SNDTIMEO.
bool send_all(int fd, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= size_t(w);
  }
  return true;
}

// Every byte of iov[0..n) in as few system calls as the socket allows.
bool send_all_iov(int fd, iovec* iov, int n) {
  while (n > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = size_t(n);
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    size_t left = size_t(w);
    while (n > 0 && left >= iov->iov_len) {  // whole buffers sent
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {  // part of the next one
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n) {
  uint8_t* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, b, n, MSG_WAITALL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= size_t(r);
  }
  return true;
}

// Send and receive timeouts; 0: none (a server's connection waits for its peer's next request).
void set_timeouts(int fd, uint32_t timeout_ms) {
  timeval tv{time_t(timeout_ms / 1000), suseconds_t((timeout_ms % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void tune(int fd, uint32_t timeout_ms) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (timeout_ms) set_timeouts(fd, timeout_ms);
}

Result<sockaddr_in> resolve(const std::string& host, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
    return Status(Code::kInvalidArgument, "data plane: cannot resolve host '" + host + "'");
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

}  // namespace

// ---- server ------------------------------------------------------------------------------------

Result<std::unique_ptr<DataServer>> DataServer::start(const std::string& host, uint16_t port, const uint8_t* base,
                                                      uint64_t len, uint64_t generation, uint32_t max_connections,
                                                      AuthKeyPtr key) {
  auto addr = resolve(host, port);
  if (!addr.ok()) return addr.status();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(Code::kInternal, errno_text("data plane: socket"));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(sockaddr_in)) != 0 || ::listen(fd, 128) != 0) {
    Status s(Code::kInvalidArgument,
             errno_text(("data plane: cannot listen on " + host + ":" + std::to_string(port)).c_str()));
    ::close(fd);
    return s;
  }
  sockaddr_in bound{};
  socklen_t bl = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bl);
  return std::unique_ptr<DataServer>(
      new DataServer(fd, ntohs(bound.sin_port), base, len, generation, max_connections, std::move(key)));
}

DataServer::DataServer(int fd, uint16_t port, const uint8_t* base, uint64_t len, uint64_t generation,
                       uint32_t max_conns, AuthKeyPtr key)
    : listen_fd_(fd),
      port_(port),
      base_(base),
      len_(len),
      generation_(generation),
      max_conns_(max_conns),
      key_(std::move(key)) {
  acceptor_ = std::thread([this] { accept_loop(); });
}

DataServer::~DataServer() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  std::map<int, std::thread> conns;
  std::vector<std::thread> finished;
  {
    std::lock_guard<std::mutex> g(m_);
    for (auto& [fd, t] : conns_) ::shutdown(fd, SHUT_RDWR);  // wakes the readers; they close their fd
    conns = std::move(conns_);
    finished = std::move(finished_);
  }
  for (auto& [fd, t] : conns) t.join();
  for (auto& t : finished) t.join();
}

void DataServer::accept_loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> g(m_);
    for (auto& t : finished_) t.join();
    finished_.clear();
    if (stop_ || conns_.size() >= max_conns_) {  // bounded: a peer over the limit is refused
      ::close(fd);
      requests_refused_++;
      continue;
    }
    tune(fd, 0);
    conns_.emplace(fd, std::thread([this, fd] { serve(fd); }));
  }
}

bool DataServer::handshake(int fd, uint32_t* node, uint64_t* generation) {
  // A silent or slow peer does not hold a connection thread: 5 s for its hello.
  set_timeouts(fd, 5000);
  const AuthChallenge ch{kDataAuthMagic, 1, random_nonce()};
  AuthHello hello{};
  if (!send_all(fd, &ch, sizeof(ch)) || !recv_all(fd, &hello, sizeof(hello))) {
    handshakes_refused_++;
    return false;
  }
  const std::string who = identity_bytes(hello.node, hello.generation);
  const Proof want = client_proof(*key_, kDataChannel, ch.nonce, hello.nonce, who);
  AuthVerdict v{kDataAuthMagic, uint32_t(DataStatus::kOk), {}};
  if (hello.magic != kDataAuthMagic || !equal_ct(want.data(), hello.proof.data(), kProofBytes)) {
    handshakes_refused_++;
    v.status = uint32_t(DataStatus::kPermissionDenied);
    send_all(fd, &v, sizeof(v));
    return false;
  }
  v.proof = server_proof(*key_, kDataChannel, ch.nonce, hello.nonce, who);
  if (!send_all(fd, &v, sizeof(v))) return false;
  set_timeouts(fd, 0);  // proven: the connection may idle between requests, as an unkeyed one does
  *node = hello.node;
  *generation = hello.generation;
  return true;
}

void DataServer::serve(int fd) {
  std::vector<RangeWire> ranges;
  std::vector<uint8_t> grants;
  uint32_t peer_node = 0;
  uint64_t peer_generation = 0;
  const bool keyed = key_ != nullptr;
  const bool open = !keyed || handshake(fd, &peer_node, &peer_generation);
  while (open && !stop_) {
    RequestHeader h;
    if (!recv_all(fd, &h, sizeof(h))) break;
    ReplyHeader rep{kDataMagic, uint32_t(DataStatus::kOk), 0};
    uint32_t count = 0;
    if (!data_header_ok(reinterpret_cast<const uint8_t*>(&h), &count)) {
      rep.status = uint32_t(DataStatus::kBadRequest);
      requests_refused_++;
      send_all(fd, &rep, sizeof(rep));
      break;  // a peer that does not speak the protocol loses its connection
    }
    ranges.resize(count);
    if (!recv_all(fd, ranges.data(), ranges.size() * sizeof(RangeWire))) break;
    if (keyed) {
      grants.resize(size_t(count) * kGrantBytes);
      if (!recv_all(fd, grants.data(), grants.size())) break;
    }
    rep.status = uint32_t(data_ranges_status(reinterpret_cast<const uint8_t*>(ranges.data()), count,
                                             h.generation == generation_, len_, &rep.total));
    if (keyed && rep.status == uint32_t(DataStatus::kOk)) {
      // Only what the master granted this requester, for this generation, not yet expired.
      const uint64_t now = wall_ms();
      for (uint32_t i = 0; i < count; ++i)
        if (check_grant(*key_, grants.data() + size_t(i) * kGrantBytes, peer_node, peer_generation, generation_,
                        ranges[i].offset, ranges[i].len, now) != nullptr) {
          rep.status = uint32_t(DataStatus::kPermissionDenied);
          requests_denied_++;
          break;
        }
    }
    if (rep.status != uint32_t(DataStatus::kOk)) {
      rep.total = 0;
      requests_refused_++;
      if (!send_all(fd, &rep, sizeof(rep))) break;
      continue;
    }
    if (!send_all(fd, &rep, sizeof(rep))) break;
    bool ok = true;
    for (const auto& r : ranges)
      if (!(ok = send_all(fd, base_ + r.offset, r.len))) break;
    if (!ok) break;
    bytes_served_ += rep.total;
    requests_served_++;
    if (h.flags & kDataFlagRead) {
      std::lock_guard<std::mutex> g(reads_m_);
      for (const auto& r : ranges) {
        if (reads_.size() >= kReadLog) {
          reads_dropped_++;
          continue;
        }
        reads_.push_back(r.offset);
      }
    }
  }
  {
    // Out of conns_ before the fd number is free again: closed first, the acceptor could take the
    // same number for a new connection and find this one's entry still there (its emplace would
    // then destroy the new, running thread: std::terminate; seen once refused handshakes made
    // connections short).
    std::lock_guard<std::mutex> g(m_);
    auto it = conns_.find(fd);
    if (it != conns_.end()) {
      finished_.push_back(std::move(it->second));
      conns_.erase(it);
    }
  }
  ::close(fd);
}

// ---- client ------------------------------------------------------------------------------------

TcpFetcher::~TcpFetcher() {
  for (auto& [peer, fds] : idle_)
    for (int fd : fds) ::close(fd);
}

Result<int> TcpFetcher::take(const std::string& host, uint16_t port) {
  {
    std::lock_guard<std::mutex> g(m_);
    auto& v = idle_[{host, port}];
    if (!v.empty()) {
      int fd = v.back();
      v.pop_back();
      return fd;
    }
  }
  auto addr = resolve(host, port);
  if (!addr.ok()) return addr.status();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(Code::kInternal, errno_text("data plane: socket"));
  tune(fd, timeout_ms_);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(sockaddr_in)) != 0) {
    Status s(Code::kTimeout, errno_text(("data plane: connect to " + host + ":" + std::to_string(port)).c_str()));
    ::close(fd);
    return s;
  }
  connects_++;
  if (id_.key) {
    Status s = handshake(fd, host + ":" + std::to_string(port));
    if (!s.is_ok()) {
      ::close(fd);
      return s;
    }
  }
  return fd;
}

Status TcpFetcher::handshake(int fd, const std::string& peer) {
  AuthChallenge ch{};
  if (!recv_all(fd, &ch, sizeof(ch)))
    return Status(Code::kTimeout, errno_text(("data plane: no challenge from " + peer).c_str()));
  if (ch.magic != kDataAuthMagic)
    return Status(Code::kPermissionDenied, "data plane: " + peer +
                                               " does not authenticate (a cluster without auth.key_file?): nothing read");
  const std::string who = identity_bytes(id_.node, id_.generation);
  AuthHello hello{kDataAuthMagic, id_.node, id_.generation, random_nonce(), {}};
  hello.proof = client_proof(*id_.key, kDataChannel, ch.nonce, hello.nonce, who);
  AuthVerdict v{};
  if (!send_all(fd, &hello, sizeof(hello)) || !recv_all(fd, &v, sizeof(v)))
    return Status(Code::kTimeout, errno_text(("data plane: handshake with " + peer).c_str()));
  if (v.magic != kDataAuthMagic || v.status != uint32_t(DataStatus::kOk))
    return Status(Code::kPermissionDenied, "data plane: " + peer + " refused this owner's key (auth.key_file)");
  const Proof want = server_proof(*id_.key, kDataChannel, ch.nonce, hello.nonce, who);
  if (!equal_ct(want.data(), v.proof.data(), kProofBytes))
    return Status(Code::kPermissionDenied, "data plane: " + peer + " does not hold this cluster's key");
  return Status::ok();
}

void TcpFetcher::give_back(const std::string& host, uint16_t port, int fd) {
  std::lock_guard<std::mutex> g(m_);
  auto& v = idle_[{host, port}];
  if (v.size() >= 8) {
    ::close(fd);
    return;
  }
  v.push_back(fd);
}

std::vector<uint64_t> DataServer::take_reads() {
  std::lock_guard<std::mutex> g(reads_m_);
  return std::exchange(reads_, {});
}

Status TcpFetcher::read(const std::string& host, uint16_t port, uint64_t generation,
                        const std::vector<ReadRange>& ranges, uint32_t flags) {
  if (ranges.empty()) return Status::ok();
  if (ranges.size() > kDataMaxRanges)
    return invalid_argument("data plane: " + std::to_string(ranges.size()) + " ranges in one request (max " +
                            std::to_string(kDataMaxRanges) + ")");
  const std::string peer = host + ":" + std::to_string(port);
  // A pooled connection may have been closed by the peer meanwhile: one fresh retry then.
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto fd = take(host, port);
    if (!fd.ok()) return fd.status();
    RequestHeader h{kDataMagic, kDataVersion, generation, uint32_t(ranges.size()), flags};
    std::vector<RangeWire> wire(ranges.size());
    uint64_t total = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      wire[i] = RangeWire{ranges[i].src_offset, ranges[i].len};
      total += ranges[i].len;
    }
    std::vector<uint8_t> grants;
    if (id_.key) {
      grants.resize(ranges.size() * kGrantBytes);
      for (size_t i = 0; i < ranges.size(); ++i) {
        if (!ranges[i].grant) {
          ::close(*fd);
          return Status(Code::kPermissionDenied, "data plane: a range of " + peer + " without the master's grant");
        }
        std::memcpy(grants.data() + i * kGrantBytes, ranges[i].grant, kGrantBytes);
      }
    }
    iovec iov[3] = {{&h, sizeof(h)},
                    {wire.data(), wire.size() * sizeof(RangeWire)},
                    {grants.data(), grants.size()}};
    const bool sent = send_all_iov(*fd, iov, id_.key ? 3 : 2);
    ReplyHeader rep{};
    if (!sent || !recv_all(*fd, &rep, sizeof(rep))) {
      ::close(*fd);
      if (attempt == 0 && errno != EAGAIN && errno != EWOULDBLOCK) continue;
      return Status(Code::kTimeout, errno_text(("data plane: request to " + peer).c_str()));
    }
    if (rep.magic == kDataAuthMagic) {  // a keyed server's challenge: this reader has no key
      ::close(*fd);
      return Status(Code::kPermissionDenied,
                    "data plane: " + peer + " requires the cluster key (auth.key_file), and this owner has none");
    }
    if (rep.magic != kDataMagic) {
      ::close(*fd);
      return Status(Code::kMalformedMessage, "data plane: " + peer + " answered with a bad magic");
    }
    if (rep.status != uint32_t(DataStatus::kOk)) {
      if (rep.status == uint32_t(DataStatus::kBadRequest)) ::close(*fd);
      else give_back(host, port, *fd);
      switch (DataStatus(rep.status)) {
        case DataStatus::kGenerationMismatch:
          return Status(Code::kGenerationMismatch,
                        "data plane: " + peer + " is not owner generation " + std::to_string(generation));
        case DataStatus::kOutOfRange:
          return invalid_argument("data plane: a range is outside " + peer + "'s segment");
        case DataStatus::kPermissionDenied:
          return Status(Code::kPermissionDenied,
                        "data plane: " + peer + " refused a range the master did not grant to this owner");
        default:
          return Status(Code::kMalformedMessage, "data plane: " + peer + " refused the request");
      }
    }
    if (rep.total != total) {
      ::close(*fd);
      return Status(Code::kMalformedMessage, "data plane: " + peer + " announced " + std::to_string(rep.total) +
                                                 " bytes, expected " + std::to_string(total));
    }
    for (const auto& r : ranges) {
      if (!recv_all(*fd, r.dst, r.len)) {
        ::close(*fd);
        return Status(Code::kTimeout, errno_text(("data plane: reading from " + peer).c_str()));
      }
    }
    give_back(host, port, *fd);
    return Status::ok();
  }
  return Status(Code::kTimeout, "data plane: " + peer + " closed the connection");
}

}  // namespace fluxon
