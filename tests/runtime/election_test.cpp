// ElectionCore (E1: a leader serves only while its lease is certainly alive; E2: terms only grow)
// and the etcd client's helpers. The real etcd runs in tests/python/test_ha.py.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <thread>
#include <vector>
#include <optional>

#include "fluxon/master/election.hpp"
#include "fluxon/runtime/etcd.hpp"

using namespace fluxon;
using Do = ElectionCore::Do;

namespace {

// etcd as far as an election sees it: leases with a deadline, one key, a revision counter. Every
// request is delivered at `arrive` (after it was sent); a lease lives ttl from its last arrival.
struct ModelEtcd {
  int64_t revision = 1, next_lease = 100;
  std::map<int64_t, int64_t> lease_until;  // lease -> expiry at etcd
  std::optional<std::pair<LeaderRecord, int64_t>> key;  // holder, its lease

  void expire(int64_t now) {
    for (auto it = lease_until.begin(); it != lease_until.end();)
      if (it->second <= now) {
        if (key && key->second == it->first) key.reset();
        it = lease_until.erase(it);
      } else {
        ++it;
      }
  }
};

// One master: asks its core, lets the model answer with a delivery delay, feeds the answer back.
struct Member {
  ElectionCore core;
  explicit Member(const std::string& addr, int64_t ttl = 1000) : core(ElectionCore::Options{ttl, 50, addr}) {}

  void step(ModelEtcd& etcd, int64_t now, int64_t delay, bool reachable = true) {
    const auto a = core.next(now);
    if (a.what == Do::kWait) return;
    const int64_t arrive = now + delay;
    etcd.expire(arrive);
    if (!reachable) return core.failed(now + delay);
    switch (a.what) {
      case Do::kGrant: {
        const int64_t id = etcd.next_lease++;
        etcd.lease_until[id] = arrive + 1000;
        return core.granted(id, now);
      }
      case Do::kCampaign: {
        if (!etcd.lease_until.count(a.lease)) return core.failed(now + delay);
        if (!etcd.key) {
          etcd.key = {{addr(), uint64_t(++etcd.revision)}, a.lease};
          return core.campaigned(true, etcd.key->first, now);
        }
        return core.campaigned(false, etcd.key->first, now);
      }
      case Do::kKeepAlive: {
        auto it = etcd.lease_until.find(a.lease);
        if (it == etcd.lease_until.end()) return core.kept_alive(false, now);
        it->second = arrive + 1000;
        return core.kept_alive(true, now);
      }
      case Do::kReadLeader:
        return core.read_leader(etcd.key ? std::optional<LeaderRecord>(etcd.key->first) : std::nullopt, now + delay);
      case Do::kResign:
        if (etcd.key && etcd.key->second == a.lease) etcd.key.reset();
        etcd.lease_until.erase(a.lease);
        return core.resigned();
      default: return;
    }
  }
  std::string addr() const { return name; }
  std::string name;
};

}  // namespace

TEST_CASE("E1 E2: one of two masters leads, a killed leader is replaced after its lease, terms grow") {
  ModelEtcd etcd;
  Member a("a:1"), b("b:1");
  a.name = "a:1";
  b.name = "b:1";
  int64_t now = 0;
  for (; now < 500; now += 5) {
    a.step(etcd, now, 2);
    b.step(etcd, now, 2);
  }
  REQUIRE(a.core.serving(now) != b.core.serving(now));
  Member& leader = a.core.serving(now) ? a : b;
  Member& standby = a.core.serving(now) ? b : a;
  const uint64_t t1 = leader.core.term();
  CHECK(standby.core.term() == t1);  // the standby knows who leads
  CHECK(standby.core.leader()->address == leader.name);
  // The leader stays while it renews.
  for (; now < 5000; now += 5) {
    leader.step(etcd, now, 2);
    standby.step(etcd, now, 2);
    CHECK_FALSE(standby.core.serving(now));
  }
  CHECK(leader.core.serving(now));
  // Killed: it never runs again. The standby takes over once the lease expired at etcd, not before.
  const int64_t killed = now;
  for (; !standby.core.serving(now) && now < killed + 3000; now += 5) standby.step(etcd, now, 2);
  CHECK(standby.core.serving(now));
  CHECK(now >= killed + 600);   // the lease outlives the last renewal by its TTL minus the renew period
  CHECK(now <= killed + 1300);  // and the standby's poll finds the key gone soon after
  CHECK(standby.core.term() > t1);
}

TEST_CASE("E1: a leader paused past its lease serves nothing when it resumes, while the new one serves") {
  ModelEtcd etcd;
  Member a("a:1"), b("b:1");
  a.name = "a:1";
  b.name = "b:1";
  int64_t now = 0;
  for (; now < 500; now += 5) {
    a.step(etcd, now, 2);
    b.step(etcd, now, 2);
  }
  Member& old = a.core.serving(now) ? a : b;
  Member& next = a.core.serving(now) ? b : a;
  // SIGSTOP: `old` takes no step for 3 s; at every instant at most one of them serves.
  const int64_t resume = now + 3000;
  for (; now < resume; now += 5) {
    next.step(etcd, now, 2);
    CHECK_FALSE((old.core.serving(now) && next.core.serving(now)));
  }
  CHECK(next.core.serving(now));
  CHECK_FALSE(old.core.serving(now));  // before it takes a step: the check needs no etcd answer
  for (int64_t end = now + 2000; now < end; now += 5) {
    old.step(etcd, now, 2);
    next.step(etcd, now, 2);
    CHECK_FALSE(old.core.serving(now));
  }
  CHECK(old.core.role() == ElectionCore::Role::kStandby);
  CHECK(old.core.step_downs() == 1);
  CHECK(old.core.term() == next.core.term());
}

TEST_CASE("E1: with etcd unreachable the leader serves until its lease could have ended, then steps down") {
  ModelEtcd etcd;
  Member a("a:1");
  a.name = "a:1";
  int64_t now = 0;
  for (; now < 300; now += 5) a.step(etcd, now, 2);
  REQUIRE(a.core.serving(now));
  int64_t last_ok = now;
  for (; now < 1000; now += 5) a.step(etcd, now, 2);
  last_ok = now;
  int64_t stopped = -1;
  for (; now < last_ok + 3000; now += 5) {
    a.step(etcd, now, 2, /*reachable=*/false);
    if (!a.core.serving(now) && stopped < 0) stopped = now;
  }
  REQUIRE(stopped > 0);
  CHECK(stopped <= last_ok + 1000);   // never past the lease it last renewed
  CHECK(stopped >= last_ok + 500);    // and not at the first failed call
  CHECK(a.core.step_downs() == 1);
  // etcd back: it campaigns again (its old lease expired there) and leads at a newer term.
  const uint64_t before = a.core.term();
  for (int64_t end = now + 3000; now < end; now += 5) a.step(etcd, now, 2);
  CHECK(a.core.serving(now));
  CHECK(a.core.term() > before);
}

TEST_CASE("E1: a keepalive etcd answers 'gone' ends the leadership at once, stop() resigns the key") {
  ModelEtcd etcd;
  Member a("a:1");
  a.name = "a:1";
  int64_t now = 0;
  for (; now < 300; now += 5) a.step(etcd, now, 2);
  REQUIRE(a.core.serving(now));
  etcd.lease_until.clear();  // revoked behind its back (an operator, or etcd restored from a snapshot)
  etcd.key.reset();
  for (int i = 0; i < 400 && a.core.serving(now); ++i, now += 5) a.step(etcd, now, 2);
  CHECK_FALSE(a.core.serving(now));
  for (int64_t end = now + 1000; now < end; now += 5) a.step(etcd, now, 2);
  REQUIRE(a.core.serving(now));
  a.core.stop();
  CHECK_FALSE(a.core.serving(now));
  a.step(etcd, now, 2);
  CHECK_FALSE(etcd.key.has_value());  // resigned: a standby need not wait out the lease
  CHECK(a.core.stopped());
}

TEST_CASE("etcd helpers: base64 both ways, endpoints that name what is wrong") {
  for (const std::string& s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", "/fluxon/c/leader", std::string("\0\xff\x10", 3)}) {
    auto d = base64_decode(base64_encode(s));
    REQUIRE(d.ok());
    CHECK(*d == s);
  }
  CHECK(base64_encode("/fluxon") == "L2ZsdXhvbg==");
  CHECK_FALSE(base64_decode("L2Z*").ok());
  auto ok = parse_http_endpoint("http://127.0.0.1:2379");
  REQUIRE(ok.ok());
  CHECK(ok->first == "127.0.0.1");
  CHECK(ok->second == 2379);
  CHECK(parse_http_endpoint("https://h:1").status().message().find("https is not supported") != std::string::npos);
  CHECK_FALSE(parse_http_endpoint("127.0.0.1:2379").ok());
  CHECK_FALSE(parse_http_endpoint("http://h:0").ok());
  CHECK_FALSE(parse_http_endpoint("http://h:99999").ok());
}

TEST_CASE("etcd client: a malformed answer is an error naming what was wrong, never a crash") {
  // A one-shot HTTP server per answer on loopback: what a broken gateway or a wrong port sends.
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(lfd, 8) == 0);
  socklen_t len = sizeof a;
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  auto with_body = [](const std::string& status, const std::string& body, int declared = -1) {
    return "HTTP/1.1 " + status + "\r\nContent-Length: " + std::to_string(declared < 0 ? body.size() : size_t(declared)) +
           "\r\n\r\n" + body;
  };
  const std::vector<std::string> answers = {
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",  // a bad chunk size
      with_body("200 OK", "{\"ID\":\"1\\uZZZZ\"}"),                           // a bad \u escape
      with_body("200 OK", "{\"ID\":\"1\""),                                     // truncated JSON
      "SSH-2.0-OpenSSH\r\n\r\n",                                            // not HTTP at all
      with_body("503 Service Unavailable", "{\"code\":14}"),                   // an HTTP error
      with_body("200 OK", "{\"TTL\":\"1\"}"),                                   // no lease ID
      with_body("200 OK", "{\"ID\":\"7\"}", 100),                              // the body cut short
      with_body("200 OK", "{\"ID\":\"42\",\"TTL\":\"1\"}"),                     // a good answer
  };
  std::thread server([&] {
    for (const auto& ans : answers) {
      int c = accept(lfd, nullptr, nullptr);
      char buf[4096];
      (void)recv(c, buf, sizeof buf, 0);
      (void)send(c, ans.data(), ans.size(), MSG_NOSIGNAL);
      close(c);
    }
  });
  EtcdClient etcd({"http://127.0.0.1:" + std::to_string(ntohs(a.sin_port))}, 2000);
  const std::vector<std::string> want = {"bad chunk size", "bad JSON", "bad JSON", "not an HTTP answer",
                                         "HTTP 503", "no lease ID", "connection closed mid-answer"};
  for (const auto& w : want) {
    auto r = etcd.grant(1);
    REQUIRE_FALSE(r.ok());
    CHECK_MESSAGE(r.status().message().find(w) != std::string::npos, r.status().message());
  }
  auto ok = etcd.grant(1);
  REQUIRE(ok.ok());
  CHECK(*ok == 42);
  server.join();
  close(lfd);
}

namespace {
// A chunked stream of lines as etcd's gateway sends a watch: one JSON message per line, the lines
// cut into chunks of 1..17 bytes.
std::string chunked(const std::string& body, std::mt19937& rng) {
  std::string out;
  for (size_t at = 0; at < body.size();) {
    const size_t n = std::min<size_t>(body.size() - at, 1 + rng() % 17);
    char size[16];
    std::snprintf(size, sizeof size, "%zx", n);
    out += std::string(size) + "\r\n" + body.substr(at, n) + "\r\n";
    at += n;
  }
  return out;
}
const std::string kWatchLines =
    "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n"
    "{\"result\":{\"header\":{\"revision\":\"6\"},\"events\":[{\"kv\":{\"key\":\"" + base64_encode("/fluxon/c/leader") +
    "\",\"create_revision\":\"6\",\"mod_revision\":\"6\",\"value\":\"" + base64_encode("127.0.0.1:7600") +
    "\",\"lease\":\"9\"}}]}}\n"
    "{\"result\":{\"header\":{\"revision\":\"7\"},\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"" +
    base64_encode("/fluxon/c/leader") + "\",\"mod_revision\":\"7\"}}]}}\n";
}  // namespace

TEST_CASE("etcd watch: a stream cut anywhere gives the same events in order, a cancelled or broken one is an error") {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const std::string bytes = chunked(kWatchLines, rng);
    auto w = EtcdWatch::unconnected();
    std::vector<EtcdEvent> got;
    for (size_t at = 0; at < bytes.size();) {  // the network's own cuts, independent of the chunks
      const size_t n = std::min<size_t>(bytes.size() - at, 1 + rng() % 23);
      auto ev = w->feed(bytes.substr(at, n));
      REQUIRE(ev.ok());
      got.insert(got.end(), ev->begin(), ev->end());
      at += n;
    }
    CHECK(w->created());
    REQUIRE(got.size() == 2);
    CHECK_FALSE(got[0].deleted);
    CHECK(got[0].kv.value == "127.0.0.1:7600");
    CHECK(got[0].kv.create_revision == 6);
    CHECK(got[1].deleted);
    CHECK(got[1].kv.key == "/fluxon/c/leader");
    CHECK(got[1].kv.mod_revision == 7);
  }
  auto one_chunk = [](const std::string& body) {
    char size[16];
    std::snprintf(size, sizeof size, "%zx", body.size());
    return std::string(size) + "\r\n" + body + "\r\n";
  };
  auto cancelled = EtcdWatch::unconnected()->feed(
      one_chunk("{\"result\":{\"canceled\":true,\"compact_revision\":\"3\",\"cancel_reason\":\"x\"}}\n"));
  REQUIRE_FALSE(cancelled.ok());
  CHECK(cancelled.status().message().find("compacted at 3") != std::string::npos);
  auto ended = EtcdWatch::unconnected()->feed("0\r\n\r\n");
  REQUIRE_FALSE(ended.ok());
  CHECK(ended.status().message().find("stream ended") != std::string::npos);
  auto bad = EtcdWatch::unconnected()->feed("q1\r\n{\r\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("bad chunk size") != std::string::npos);
  auto garbage = EtcdWatch::unconnected()->feed(one_chunk("{x}\n"));
  REQUIRE_FALSE(garbage.ok());
  CHECK(garbage.status().message().find("bad JSON") != std::string::npos);
}

TEST_CASE("etcd watch: opened over a socket, the events that came with the head first, then the stream's end") {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(lfd, 4) == 0);
  socklen_t len = sizeof a;
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::string asked;
  std::thread server([&] {
    int c = accept(lfd, nullptr, nullptr);
    char buf[4096];
    const ssize_t n = recv(c, buf, sizeof buf, 0);
    if (n > 0) asked.assign(buf, size_t(n));
    std::mt19937 rng(3);
    const std::string all = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                            chunked(kWatchLines, rng);
    const size_t cut = all.find("\r\n\r\n") + 30;  // the head and part of the first chunks together
    (void)send(c, all.data(), cut, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)send(c, all.data() + cut, all.size() - cut, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    close(c);  // the stream ends
  });
  auto w = EtcdWatch::open({"http://127.0.0.1:" + std::to_string(ntohs(a.sin_port))}, "/fluxon/c/leader", 6, 2000);
  REQUIRE(w.ok());
  std::vector<EtcdEvent> got;
  Status end = Status::ok();
  for (int i = 0; i < 100 && end.ok(); ++i) {
    auto ev = (*w)->next(100);
    if (!ev.ok()) end = ev.status();
    else got.insert(got.end(), ev->begin(), ev->end());
  }
  server.join();
  close(lfd);
  CHECK(asked.find("POST /v3/watch HTTP/1.1") == 0);
  CHECK(asked.find("\"start_revision\":\"6\"") != std::string::npos);
  CHECK(asked.find(base64_encode("/fluxon/c/leader")) != std::string::npos);
  REQUIRE(got.size() == 2);
  CHECK(got[0].kv.value == "127.0.0.1:7600");
  CHECK(got[1].deleted);
  CHECK(end.message().find("stream ended") != std::string::npos);
}

TEST_CASE("E1: a standby told by its watch that the leader's key changed reads it at once, not at its next poll") {
  ElectionCore core(ElectionCore::Options{1000, 60000, "b"});
  CHECK(core.next(0).what == Do::kGrant);
  core.granted(5, 0);
  CHECK(core.next(0).what == Do::kCampaign);
  core.campaigned(false, LeaderRecord{"a", 3}, 0);  // a leads: b stands by, its next read a minute away
  CHECK(core.next(10).what == Do::kWait);
  CHECK(core.next(10).until == 60000);
  core.leader_changed(500);  // the watch saw a's key go
  CHECK(core.next(500).what == Do::kReadLeader);
  core.read_leader(std::nullopt, 501);  // gone indeed: campaign
  const auto a = core.next(501);
  CHECK((a.what == Do::kCampaign || a.what == Do::kGrant));
}

TEST_CASE("E1: a candidate whose etcd call failed tries again within TTL/10, whatever its poll period") {
  ElectionCore core(ElectionCore::Options{1000, 60000, "b"});
  CHECK(core.next(0).what == Do::kGrant);
  core.failed(5);  // etcd still electing its own leader, say
  const auto a = core.next(5);
  REQUIRE(a.what == Do::kWait);
  CHECK(a.until == 105);
  CHECK(core.next(105).what == Do::kGrant);
}
