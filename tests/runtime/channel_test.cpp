// The same-host channel: its rings (wrap-around, full, oversized, garbage from the other process)
// and the owner's listener with real sockets, threads and a killed client process.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "fluxon/runtime/channel.hpp"

using namespace fluxon;
using namespace fluxon::channel;

namespace {

struct LocalRing {
  RingCtl ctl{};
  std::vector<uint8_t> data;
  explicit LocalRing(uint32_t cap) : data(cap) {}
  Producer producer() { return Producer(&ctl, data.data(), uint32_t(data.size())); }
  Consumer consumer() { return Consumer(&ctl, data.data(), uint32_t(data.size())); }
};

Bytes pattern(uint32_t n, uint32_t seed) {
  Bytes b(n);
  for (uint32_t i = 0; i < n; ++i) b[i] = uint8_t(seed * 131 + i * 7);
  return b;
}

std::string unique_name(const char* what) {
  static std::atomic<int> n{0};
  return std::string("fluxon-test-") + what + "." + std::to_string(getpid()) + "." + std::to_string(n++);
}

template <class F>
bool eventually(F f, int ms = 5000) {
  for (int i = 0; i < ms; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return f();
}

}  // namespace

TEST_CASE("channel ring: entries of every size come out whole across many wrap-arounds") {
  LocalRing r(4096);
  auto p = r.producer();
  auto c = r.consumer();
  std::mt19937 rng(7);
  uint64_t pushed = 0, popped = 0;
  std::vector<Bytes> sent;
  for (int round = 0; round < 2000; ++round) {
    const uint32_t n = rng() % 700;
    Bytes b = pattern(n, uint32_t(round));
    bool wake = false;
    auto res = p.push(Kind::kCall, uint64_t(round), b.data(), n, &wake);
    if (res == Producer::Push::kFull) {  // drain, then it fits
      Entry e;
      while (c.pop(e, nullptr) == Consumer::Pop::kEntry) {
        CHECK(e.payload == sent[popped]);
        CHECK(e.id == popped);
        ++popped;
      }
      res = p.push(Kind::kCall, uint64_t(round), b.data(), n, &wake);
    }
    REQUIRE(res == Producer::Push::kOk);
    CHECK_FALSE(wake);  // nobody sleeps: no wake-up
    sent.push_back(b);
    ++pushed;
  }
  Entry e;
  while (c.pop(e, nullptr) == Consumer::Pop::kEntry) {
    CHECK(e.payload == sent[popped]);
    ++popped;
  }
  CHECK(popped == pushed);
  CHECK(r.ctl.tail.load() > 100 * 4096);  // went round the ring many times
}

TEST_CASE("channel ring: a full ring refuses, an oversized entry is refused, a sleeper is woken") {
  LocalRing r(4096);
  auto p = r.producer();
  auto c = r.consumer();
  bool wake = false;
  Bytes big(max_payload(4096) + 1);
  CHECK(p.push(Kind::kCall, 1, big.data(), uint32_t(big.size()), &wake) == Producer::Push::kTooLarge);
  Bytes half(max_payload(4096));
  CHECK(p.push(Kind::kCall, 1, half.data(), uint32_t(half.size()), &wake) == Producer::Push::kOk);
  CHECK(p.push(Kind::kCall, 2, half.data(), uint32_t(half.size()), &wake) == Producer::Push::kOk);
  CHECK(p.push(Kind::kCall, 3, half.data(), 1, &wake) == Producer::Push::kFull);
  Entry e;
  REQUIRE(c.pop(e, nullptr) == Consumer::Pop::kEntry);
  CHECK(p.push(Kind::kCall, 3, half.data(), 1, &wake) == Producer::Push::kOk);
  REQUIRE(c.pop(e, nullptr) == Consumer::Pop::kEntry);
  REQUIRE(c.pop(e, nullptr) == Consumer::Pop::kEntry);
  CHECK(e.id == 3);
  uint32_t seq = 0;
  REQUIRE(c.prepare_sleep(&seq));  // empty: it may sleep
  CHECK(p.push(Kind::kCall, 4, half.data(), 1, &wake) == Producer::Push::kOk);
  CHECK(wake);  // the producer saw the sleeper
  CHECK(r.ctl.seq.load() != seq);  // and moved the futex word: a wait on `seq` returns at once
  c.awake();
  CHECK_FALSE(c.prepare_sleep(&seq));  // not empty: no sleep
}

TEST_CASE("channel ring: garbage from the other process is refused and named, never trusted") {
  auto corrupt = [](auto poke) {
    LocalRing r(4096);
    auto p = r.producer();
    bool wake;
    Bytes b = pattern(40, 1);
    REQUIRE(p.push(Kind::kCall, 9, b.data(), 40, &wake) == Producer::Push::kOk);
    poke(r);
    auto c = r.consumer();
    Entry e;
    std::string why;
    auto res = c.pop(e, &why);
    CHECK(res == Consumer::Pop::kCorrupt);
    return why;
  };
  CHECK(corrupt([](LocalRing& r) { r.data[4] = 77; }).find("unknown entry kind") != std::string::npos);
  CHECK(corrupt([](LocalRing& r) { std::memset(r.data.data(), 0xff, 4); }).find("above the ring") != std::string::npos);
  CHECK(corrupt([](LocalRing& r) { r.data[0] = 200; }).find("past the published end") != std::string::npos);
  CHECK(corrupt([](LocalRing& r) { r.ctl.tail.store(1ull << 40); }).find("out of range") != std::string::npos);
  CHECK(corrupt([](LocalRing& r) { r.ctl.tail.store(8); }).find("partial entry header") != std::string::npos);
  // The producer checks the consumer's head too.
  LocalRing r(4096);
  auto p = r.producer();
  bool wake;
  r.ctl.head.store(12345);
  CHECK(p.push(Kind::kReply, 1, nullptr, 0, &wake) == Producer::Push::kCorrupt);
}

namespace {

// An echo owner: every call is answered with its payload reversed, from another thread (as the
// owner actor answers).
struct EchoOwner {
  std::string name = unique_name("echo");
  std::mutex m;
  std::vector<std::pair<uint64_t, std::string>> closed;
  std::atomic<uint64_t> notes{0};
  struct Reply {
    uint64_t ch, id;
    Bytes out;
  };
  std::deque<Reply> replies;  // answered in order by one thread, as the owner actor answers
  std::condition_variable cv;
  bool stop = false;
  std::thread replier;
  std::unique_ptr<Server> server;
  explicit EchoOwner(ServerOptions opt = {}) {
    Server::Callbacks cb;
    cb.on_entry = [this](uint64_t ch, uint64_t, Entry&& e) {
      if (e.kind == Kind::kNote) {
        ++notes;
        return;
      }
      std::lock_guard<std::mutex> g(m);
      replies.push_back(Reply{ch, e.id, Bytes(e.payload.rbegin(), e.payload.rend())});
      cv.notify_one();
    };
    cb.on_closed = [this](uint64_t, uint64_t session, const std::string& why) {
      std::lock_guard<std::mutex> g(m);
      closed.emplace_back(session, why);
    };
    auto s = Server::start(name, 42, opt, std::move(cb));
    REQUIRE(s.ok());
    server = std::move(s.value());
    replier = std::thread([this] {
      std::unique_lock<std::mutex> l(m);
      for (;;) {
        cv.wait(l, [&] { return stop || !replies.empty(); });
        if (stop) return;
        Reply r = std::move(replies.front());
        replies.pop_front();
        l.unlock();
        server->reply(r.ch, r.id, r.out);
        l.lock();
      }
    });
  }
  ~EchoOwner() {  // the replier ends before the server goes
    {
      std::lock_guard<std::mutex> g(m);
      stop = true;
    }
    cv.notify_all();
    replier.join();
    server.reset();
  }
  size_t closed_count() {
    std::lock_guard<std::mutex> g(m);
    return closed.size();
  }
};

}  // namespace

TEST_CASE("channel: calls from many threads get their own replies, notes arrive, the owner learns the close") {
  EchoOwner owner;
  {
    auto c = Client::connect(owner.name, 7, 42, 20);
    REQUIRE(c.ok());
    std::vector<std::thread> ts;
    std::atomic<int> bad{0};
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < 300; ++i) {
          Bytes b = pattern(uint32_t(1 + (i * 37 + t) % 3000), uint32_t(t * 1000 + i));
          auto r = (*c)->call(b, 10000);
          if (!r.ok() || *r != Bytes(b.rbegin(), b.rend())) ++bad;
        }
      });
    for (auto& t : ts) t.join();
    CHECK(bad == 0);
    CHECK((*c)->notify(pattern(10, 1)).is_ok());
    CHECK(eventually([&] { return owner.notes == 1; }));
    CHECK(owner.server->stats().calls == 1200);
    CHECK(owner.server->stats().open == 1);
  }
  REQUIRE(eventually([&] { return owner.closed_count() == 1; }));
  CHECK(owner.closed[0].first == 7);
  CHECK(owner.server->stats().open == 0);
}

TEST_CASE("channel: another generation and a full house are refused at connect") {
  ServerOptions opt;
  opt.max_channels = 1;
  EchoOwner owner(opt);
  auto stale = Client::connect(owner.name, 1, 41, 0);
  CHECK(stale.status().code() == Code::kClosed);
  auto first = Client::connect(owner.name, 1, 42, 0);
  REQUIRE(first.ok());
  auto second = Client::connect(owner.name, 2, 42, 0);
  CHECK(second.status().code() == Code::kNoSpace);
  CHECK(owner.server->stats().refused_channels == 2);
  auto nobody = Client::connect(unique_name("nobody"), 1, 42, 0);
  CHECK(nobody.status().code() == Code::kClosed);
}

TEST_CASE("channel: a waiting call ends with Closed when the owner goes, not at its timeout") {
  Server::Callbacks cb;  // a server that never replies
  const std::string name = unique_name("silent");
  auto s = Server::start(name, 42, {}, std::move(cb));
  REQUIRE(s.ok());
  auto c = Client::connect(name, 1, 42, 0);
  REQUIRE(c.ok());
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s.value().reset();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r = (*c)->call(pattern(8, 1), 30000);
  stopper.join();
  CHECK(r.status().code() == Code::kClosed);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("channel: a killed client process is seen at once, and a client writing garbage is cut off and counted") {
  EchoOwner owner;
  pid_t child = fork();
  if (child == 0) {
    auto c = Client::connect(owner.name, 99, 42, 0);
    if (!c.ok()) _exit(2);
    auto r = (*c)->call(pattern(16, 3), 5000);
    if (!r.ok()) _exit(3);
    write(1, "", 0);
    pause();  // killed here, mid-session
    _exit(0);
  }
  REQUIRE(eventually([&] { return owner.server->stats().replies == 1; }, 10000));
  kill(child, SIGKILL);
  int st = 0;
  waitpid(child, &st, 0);
  REQUIRE(eventually([&] { return owner.closed_count() == 1; }));
  CHECK(owner.closed[0].first == 99);
  CHECK(owner.closed[0].second.find("socket closed") != std::string::npos);

  // Garbage: the mapping is the client's to write. Each of these entries closes its channel, is
  // counted, and the owner keeps serving the others.
  auto healthy = Client::connect(owner.name, 6, 42, 0);
  REQUIRE(healthy.ok());
  const std::pair<uint32_t, uint32_t> bad[] = {{77, 8}, {1, 1u << 30}, {3, 8}};  // kind, length field
  uint64_t n = 0;
  for (auto [kind, len] : bad) {
    auto c = Client::connect(owner.name, 10 + n, 42, 0);
    REQUIRE(c.ok());
    REQUIRE((*c)->call(pattern(4, 1), 5000).ok());
    (*c)->inject_for_test(kind, len, pattern(8, 2));
    ++n;
    REQUIRE(eventually([&] { return owner.server->stats().refused_entries == n; }));
    auto r = (*c)->call(pattern(4, 1), 2000);
    CHECK(r.status().code() == Code::kClosed);  // the owner closed it
    auto h = (*healthy)->call(pattern(6, 1), 5000);
    CHECK(h.ok());
  }
  CHECK(owner.closed_count() == 1 + n);
}

TEST_CASE("channel: a silent connection blocks nobody, and new clients get in while the owner is busy") {
  EchoOwner owner;
  // A local process that connects and never says hello.
  int silent = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, owner.name.data(), owner.name.size());
  REQUIRE(::connect(silent, reinterpret_cast<sockaddr*>(&a),
                    socklen_t(offsetof(sockaddr_un, sun_path) + 1 + owner.name.size())) == 0);
  // A client that streams calls without a pause: the poller never has a reason to sleep.
  auto busy = Client::connect(owner.name, 1, 42, 0);
  REQUIRE(busy.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread load([&] {
    while (!stop)
      if (!(*busy)->call(pattern(64, 1), 5000).ok()) ++bad;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto late = Client::connect(owner.name, 2, 42, 0);
  REQUIRE(late.ok());
  CHECK((*late)->call(pattern(8, 2), 5000).ok());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(900));  // not behind the silent one
  // The silent connection is refused after its second.
  char buf[64];
  timeval tv{5, 0};
  ::setsockopt(silent, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  CHECK(::recv(silent, buf, 32, MSG_WAITALL) == 32);  // the challenge, at once
  CHECK(::recv(silent, buf, sizeof buf, 0) >= 0);      // a refusal, then the end
  stop = true;
  load.join();
  CHECK(bad == 0);
  ::close(silent);
  CHECK(owner.server->stats().refused_channels == 1);
}

TEST_CASE("channel with the key: a client proving it gets in, no key or a wrong one is refused with PermissionDenied and counted") {
  auto make_key = [](const char* tag) {
    const std::string path = "/tmp/fluxon-ch-key-" + std::string(tag) + "-" + std::to_string(getpid());
    ::unlink(path.c_str());
    REQUIRE(write_key_file(path).is_ok());
    auto k = load_key_file(path);
    ::unlink(path.c_str());
    REQUIRE(k.ok());
    return *k;
  };
  ServerOptions opt;
  opt.key = make_key("good");
  EchoOwner owner(opt);
  auto none = Client::connect(owner.name, 1, 42, 0);
  CHECK(none.status().code() == Code::kPermissionDenied);
  auto wrong = Client::connect(owner.name, 2, 42, 0, make_key("wrong"));
  CHECK(wrong.status().code() == Code::kPermissionDenied);
  CHECK(owner.server->stats().refused_auth == 2);
  CHECK(owner.server->stats().open == 0);
  auto good = Client::connect(owner.name, 3, 42, 0, opt.key);
  REQUIRE(good.ok());
  CHECK((*good)->call(pattern(16, 3), 5000).ok());
  // A client with the key at an owner without one: the owner cannot prove it, refused.
  EchoOwner open_owner;
  auto doubtful = Client::connect(open_owner.name, 4, 42, 0, opt.key);
  CHECK(doubtful.status().code() == Code::kPermissionDenied);
}
