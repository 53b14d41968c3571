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
