// The TCP data plane over real loopback sockets.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "fluxon/runtime/transport.hpp"

using namespace fluxon;

TEST_CASE("data plane: ranges of a served segment arrive intact, in one request") {
  std::vector<uint8_t> seg(1 << 20);
  for (size_t i = 0; i < seg.size(); ++i) seg[i] = uint8_t(i * 7 + (i >> 12));
  auto srv = DataServer::start("127.0.0.1", 0, seg.data(), seg.size(), 42);
  REQUIRE(srv.ok());
  TcpFetcher f(2000);
  std::vector<uint8_t> a(4096), b(65536), c(1);
  std::vector<ReadRange> rs{{0, a.size(), a.data()}, {12288, b.size(), b.data()}, {seg.size() - 1, 1, c.data()}};
  REQUIRE(f.read("127.0.0.1", (*srv)->port(), 42, rs).is_ok());
  CHECK(std::memcmp(a.data(), seg.data(), a.size()) == 0);
  CHECK(std::memcmp(b.data(), seg.data() + 12288, b.size()) == 0);
  CHECK(c[0] == seg.back());
  // The connection is reused.
  REQUIRE(f.read("127.0.0.1", (*srv)->port(), 42, rs).is_ok());
  CHECK(f.connects() == 1);
  // The server counts a request after its last byte left: the reader may be faster.
  for (int i = 0; i < 1000 && (*srv)->requests_served() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK((*srv)->requests_served() == 2);
  CHECK((*srv)->bytes_served() == 2 * (4096 + 65536 + 1));
}

TEST_CASE("data plane: ranges read for a reader (kDataFlagRead) are logged for the serving owner, copies are not") {
  std::vector<uint8_t> seg(1 << 16, 3);
  auto srv = DataServer::start("127.0.0.1", 0, seg.data(), seg.size(), 9);
  REQUIRE(srv.ok());
  TcpFetcher f(2000);
  std::vector<uint8_t> a(4096), b(4096);
  REQUIRE(f.read("127.0.0.1", (*srv)->port(), 9, {{8192, 4096, a.data()}, {0, 4096, b.data()}}, kDataFlagRead).is_ok());
  REQUIRE(f.read("127.0.0.1", (*srv)->port(), 9, {{4096, 4096, a.data()}}).is_ok());  // a copy: not logged
  for (int i = 0; i < 1000 && (*srv)->requests_served() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK((*srv)->take_reads() == std::vector<uint64_t>{8192, 0});
  CHECK((*srv)->take_reads().empty());  // taken once
  CHECK((*srv)->reads_dropped() == 0);
  // The log is bounded between two takes: past kReadLog offsets the rest are dropped, counted.
  std::vector<uint8_t> one(DataServer::kReadLog);
  std::vector<ReadRange> many;
  for (size_t i = 0; i < DataServer::kReadLog; ++i) many.push_back({i, 1, one.data() + i});
  REQUIRE(f.read("127.0.0.1", (*srv)->port(), 9, many, kDataFlagRead).is_ok());
  REQUIRE(f.read("127.0.0.1", (*srv)->port(), 9, {{0, 4096, a.data()}}, kDataFlagRead).is_ok());
  for (int i = 0; i < 1000 && (*srv)->requests_served() < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK((*srv)->reads_dropped() == 1);
  CHECK((*srv)->take_reads().size() == DataServer::kReadLog);
}

TEST_CASE("data plane: wrong generation, ranges outside the segment and garbage are refused, the server lives on") {
  std::vector<uint8_t> seg(65536, 1);
  auto srv = DataServer::start("127.0.0.1", 0, seg.data(), seg.size(), 5);
  REQUIRE(srv.ok());
  const uint16_t port = (*srv)->port();
  TcpFetcher f(2000);
  std::vector<uint8_t> buf(4096);
  Status s = f.read("127.0.0.1", port, 6, {{0, 4096, buf.data()}});
  CHECK(s.code() == Code::kGenerationMismatch);
  s = f.read("127.0.0.1", port, 5, {{65536 - 100, 4096, buf.data()}});
  CHECK(s.code() == Code::kInvalidArgument);
  s = f.read("127.0.0.1", port, 5, {{~0ull - 10, 4096, buf.data()}});  // overflow
  CHECK(s.code() == Code::kInvalidArgument);
  // Raw garbage on a socket.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  const char junk[64] = "GET / HTTP/1.1\r\n\r\n";
  CHECK(::send(fd, junk, sizeof(junk), MSG_NOSIGNAL) == ssize_t(sizeof(junk)));
  char rep[16];
  CHECK(::recv(fd, rep, sizeof(rep), MSG_WAITALL) == 16);  // a refusal, then the connection closes
  ::close(fd);
  CHECK((*srv)->requests_refused() >= 3);
  s = f.read("127.0.0.1", port, 5, {{0, 4096, buf.data()}});
  CHECK(s.is_ok());
}

TEST_CASE("data plane: an unreachable peer is an error naming it, within the timeout") {
  TcpFetcher f(500);
  std::vector<uint8_t> buf(16);
  // A port nobody listens on (bind one, close it).
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t l = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
  ::close(fd);
  Status s = f.read("127.0.0.1", ntohs(a.sin_port), 1, {{0, 16, buf.data()}});
  CHECK_FALSE(s.is_ok());
  CHECK(s.message().find("127.0.0.1:" + std::to_string(ntohs(a.sin_port))) != std::string::npos);
}

TEST_CASE("data plane: a server stopped mid-flight fails the read, concurrent readers each get their bytes") {
  std::vector<uint8_t> seg(8 << 20);
  for (size_t i = 0; i < seg.size(); ++i) seg[i] = uint8_t(i ^ (i >> 9));
  auto srv = DataServer::start("127.0.0.1", 0, seg.data(), seg.size(), 9);
  REQUIRE(srv.ok());
  const uint16_t port = (*srv)->port();
  TcpFetcher f(2000);
  std::vector<std::thread> ts;
  std::atomic<int> good{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<uint8_t> buf(1 << 20);
      for (int i = 0; i < 5; ++i) {
        const uint64_t off = uint64_t((t * 5 + i) % 7) << 20;
        if (!f.read("127.0.0.1", port, 9, {{off, buf.size(), buf.data()}}).is_ok()) return;
        if (std::memcmp(buf.data(), seg.data() + off, buf.size()) == 0) good++;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(good == 20);
  srv->reset();  // stopped: every connection is shut down
  std::vector<uint8_t> buf(4096);
  CHECK_FALSE(f.read("127.0.0.1", port, 9, {{0, 4096, buf.data()}}).is_ok());
}

TEST_CASE("rdma_probe says what this machine has") {
  RdmaProbe p = rdma_probe();
  CHECK_FALSE(p.detail.empty());
  if (!p.available) MESSAGE("RDMA: " << p.detail);
}

TEST_CASE("data plane request checks: the header's magic, version and range count, ranges inside the segment, a total that cannot wrap (fuzz_data_request's finding)") {
  using namespace fluxon;
  auto header = [](uint32_t magic, uint32_t version, uint32_t count) {
    std::vector<uint8_t> h(24);
    const uint64_t gen = 9;
    std::memcpy(h.data(), &magic, 4);
    std::memcpy(h.data() + 4, &version, 4);
    std::memcpy(h.data() + 8, &gen, 8);
    std::memcpy(h.data() + 16, &count, 4);
    return h;
  };
  uint32_t count = 0;
  CHECK(data_header_ok(header(kDataMagic, kDataVersion, 2).data(), &count));
  CHECK(count == 2);
  CHECK_FALSE(data_header_ok(header(kDataMagic + 1, kDataVersion, 2).data(), &count));
  CHECK_FALSE(data_header_ok(header(kDataMagic, kDataVersion + 1, 2).data(), &count));
  CHECK_FALSE(data_header_ok(header(kDataMagic, kDataVersion, 0).data(), &count));
  CHECK_FALSE(data_header_ok(header(kDataMagic, kDataVersion, kDataMaxRanges + 1).data(), &count));
  auto ranges = [](std::vector<std::pair<uint64_t, uint64_t>> rs) {
    std::vector<uint8_t> b(rs.size() * 16);
    for (size_t i = 0; i < rs.size(); ++i) {
      std::memcpy(b.data() + i * 16, &rs[i].first, 8);
      std::memcpy(b.data() + i * 16 + 8, &rs[i].second, 8);
    }
    return b;
  };
  uint64_t total = 0;
  auto ok = ranges({{0, 4096}, {8192, 100}});
  CHECK(data_ranges_status(ok.data(), 2, true, 1 << 20, &total) == DataStatus::kOk);
  CHECK(total == 4196);
  CHECK(data_ranges_status(ok.data(), 2, false, 1 << 20, &total) == DataStatus::kGenerationMismatch);
  auto past = ranges({{(1 << 20) - 10, 11}});
  CHECK(data_ranges_status(past.data(), 1, true, 1 << 20, &total) == DataStatus::kOutOfRange);
  auto wrap = ranges({{0, uint64_t(1) << 63}, {0, uint64_t(1) << 63}});
  CHECK(data_ranges_status(wrap.data(), 2, true, UINT64_MAX, &total) == DataStatus::kBadRequest);
  CHECK(total == 0);
}

// ---- with the cluster key ----------------------------------------------------------------------

namespace {
AuthKeyPtr fresh_key(const char* tag) {
  const std::string path = "/tmp/fluxon-dp-key-" + std::string(tag) + "-" + std::to_string(getpid());
  ::unlink(path.c_str());
  REQUIRE(write_key_file(path).is_ok());
  auto k = load_key_file(path);
  ::unlink(path.c_str());
  REQUIRE(k.ok());
  return *k;
}

int dial(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

bool read_exact(int fd, void* p, size_t n) { return ::recv(fd, p, n, MSG_WAITALL) == ssize_t(n); }
}  // namespace

TEST_CASE("data plane with the key: granted ranges are served, an ungranted or misgranted range is refused and counted") {
  auto key = fresh_key("grant");
  std::vector<uint8_t> seg(1 << 16);
  for (size_t i = 0; i < seg.size(); ++i) seg[i] = uint8_t(i * 13);
  auto srv = DataServer::start("127.0.0.1", 0, seg.data(), seg.size(), 42, 64, key);
  REQUIRE(srv.ok());
  const uint16_t port = (*srv)->port();
  TcpFetcher f(2000, DataIdentity{key, 2, 900});
  const uint64_t exp = wall_ms() + 60000;
  const Grant g = make_grant(*key, 2, 900, 42, 4096, 4096, exp);
  std::vector<uint8_t> out(4096);
  REQUIRE(f.read("127.0.0.1", port, 42, {{4096, 4096, out.data(), g.data()}}).is_ok());
  CHECK(std::memcmp(out.data(), seg.data() + 4096, 4096) == 0);
  // The same grant for another range, a grant for another requester, a forged grant: refused.
  const Grant other = make_grant(*key, 3, 900, 42, 4096, 4096, exp);
  Grant forged{};
  CHECK(f.read("127.0.0.1", port, 42, {{8192, 4096, out.data(), g.data()}}).code() == Code::kPermissionDenied);
  CHECK(f.read("127.0.0.1", port, 42, {{4096, 4096, out.data(), other.data()}}).code() == Code::kPermissionDenied);
  CHECK(f.read("127.0.0.1", port, 42, {{4096, 4096, out.data(), forged.data()}}).code() == Code::kPermissionDenied);
  // One bad range refuses the whole request: no byte of the good one is sent.
  std::vector<uint8_t> two(4096, 0xEE);
  CHECK(f.read("127.0.0.1", port, 42, {{4096, 4096, two.data(), g.data()}, {0, 16, out.data(), g.data()}}).code() ==
        Code::kPermissionDenied);
  CHECK(two[0] == 0xEE);
  CHECK((*srv)->requests_denied() == 4);
  CHECK((*srv)->bytes_served() == 4096);
  // The connection is still good, and so is the grant.
  REQUIRE(f.read("127.0.0.1", port, 42, {{4096, 4096, out.data(), g.data()}}).is_ok());
  CHECK(f.connects() == 1);
  // A range without a grant is not even sent.
  CHECK(f.read("127.0.0.1", port, 42, {{4096, 4096, out.data()}}).code() == Code::kPermissionDenied);
}

TEST_CASE("data plane with the key: a proven connection may idle past the handshake's 5 s and is still served") {
  auto key = fresh_key("idle");
  std::vector<uint8_t> seg(1 << 16, 5);
  auto srv = DataServer::start("127.0.0.1", 0, seg.data(), seg.size(), 42, 64, key);
  REQUIRE(srv.ok());
  TcpFetcher f(2000, DataIdentity{key, 2, 900});
  const Grant g = make_grant(*key, 2, 900, 42, 0, 4096, wall_ms() + 60000);
  std::vector<uint8_t> out(4096);
  REQUIRE(f.read("127.0.0.1", (*srv)->port(), 42, {{0, 4096, out.data(), g.data()}}).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5500));
  REQUIRE(f.read("127.0.0.1", (*srv)->port(), 42, {{0, 4096, out.data(), g.data()}}).is_ok());
  CHECK(f.connects() == 1);  // the pooled connection was kept, not dropped and proven again
  CHECK((*srv)->requests_served() >= 1);
}

TEST_CASE("data plane with the key: no key, a wrong key and a replayed handshake are refused, nothing served") {
  auto key = fresh_key("hs");
  auto wrong = fresh_key("wrong");
  std::vector<uint8_t> seg(1 << 16, 7);
  auto srv = DataServer::start("127.0.0.1", 0, seg.data(), seg.size(), 42, 64, key);
  REQUIRE(srv.ok());
  const uint16_t port = (*srv)->port();
  std::vector<uint8_t> out(4096);
  const Grant g = make_grant(*key, 2, 900, 42, 0, 4096, wall_ms() + 60000);
  TcpFetcher none(2000);
  auto s = none.read("127.0.0.1", port, 42, {{0, 4096, out.data()}});
  CHECK(s.code() == Code::kPermissionDenied);
  CHECK(s.message().find("requires the cluster key") != std::string::npos);
  TcpFetcher bad(2000, DataIdentity{wrong, 2, 900});
  const Grant wg = make_grant(*wrong, 2, 900, 42, 0, 4096, wall_ms() + 60000);
  CHECK(bad.read("127.0.0.1", port, 42, {{0, 4096, out.data(), wg.data()}}).code() == Code::kPermissionDenied);
  // A replay: a valid hello recorded on one connection, sent again on another.
  struct Challenge { uint32_t magic, version; Nonce nonce; } c1{}, c2{};
  struct Hello { uint32_t magic, node; uint64_t generation; Nonce nonce; Proof proof; } h{};
  struct Verdict { uint32_t magic, status; Proof proof; } v{};
  int a = dial(port);
  REQUIRE(read_exact(a, &c1, sizeof(c1)));
  CHECK(c1.magic == kDataAuthMagic);
  std::string who(12, '\0');
  const uint32_t node = 2;
  const uint64_t gen = 900;
  std::memcpy(who.data(), &node, 4);
  std::memcpy(who.data() + 4, &gen, 8);
  h = Hello{kDataAuthMagic, node, gen, random_nonce(), {}};
  h.proof = client_proof(*key, "data", c1.nonce, h.nonce, who);
  REQUIRE(::send(a, &h, sizeof(h), 0) == ssize_t(sizeof(h)));
  REQUIRE(read_exact(a, &v, sizeof(v)));
  CHECK(v.status == uint32_t(DataStatus::kOk));
  CHECK(v.proof == server_proof(*key, "data", c1.nonce, h.nonce, who));
  int b = dial(port);
  REQUIRE(read_exact(b, &c2, sizeof(c2)));
  CHECK(c2.nonce != c1.nonce);
  REQUIRE(::send(b, &h, sizeof(h), 0) == ssize_t(sizeof(h)));
  REQUIRE(read_exact(b, &v, sizeof(v)));
  CHECK(v.status == uint32_t(DataStatus::kPermissionDenied));
  char byte;
  CHECK(::recv(b, &byte, 1, 0) == 0);  // and the connection is closed
  ::close(a);
  ::close(b);
  for (int i = 0; i < 1000 && (*srv)->handshakes_refused() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK((*srv)->handshakes_refused() == 3);  // no key (its request is no hello), the wrong key, the replay
  CHECK((*srv)->bytes_served() == 0);
  // The server lives on: a reader with the key and a grant is served.
  TcpFetcher good(2000, DataIdentity{key, 2, 900});
  CHECK(good.read("127.0.0.1", port, 42, {{0, 4096, out.data(), g.data()}}).is_ok());
}
