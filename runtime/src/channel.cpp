// The same-host control channel (channel.hpp): rings, the owner's listener and poller, the client.
#include "fluxon/runtime/channel.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <optional>
#include <unordered_map>

namespace fluxon::channel {

namespace {

using Clock = std::chrono::steady_clock;

// One step of a bounded spin: a pause, and the core to whoever else is runnable (with few cores the
// other side of the channel, or the owner actor, may be waiting for this one).
inline void spin_step() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
  std::this_thread::yield();
}

long futex(std::atomic<uint32_t>* w, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), op, val, ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* w) { futex(w, FUTEX_WAKE, INT32_MAX, nullptr); }

void futex_wait(std::atomic<uint32_t>* w, uint32_t seen, uint32_t max_us) {
  timespec ts{time_t(max_us / 1000000), long(max_us % 1000000) * 1000};
  futex(w, FUTEX_WAIT, seen, &ts);
}

// Copies into / out of the ring at a position, wrapping at the end.
void ring_write(uint8_t* data, uint32_t cap, uint64_t pos, const void* src, uint32_t n) {
  const uint32_t at = uint32_t(pos % cap);
  const uint32_t first = std::min(n, cap - at);
  std::memcpy(data + at, src, first);
  if (first < n) std::memcpy(data, static_cast<const uint8_t*>(src) + first, n - first);
}

void ring_read(const uint8_t* data, uint32_t cap, uint64_t pos, void* dst, uint32_t n) {
  const uint32_t at = uint32_t(pos % cap);
  const uint32_t first = std::min(n, cap - at);
  std::memcpy(dst, data + at, first);
  if (first < n) std::memcpy(static_cast<uint8_t*>(dst) + first, data, n - first);
}

struct EntryHead {
  uint32_t len;
  uint32_t kind;
  uint64_t id;
};
static_assert(sizeof(EntryHead) == kEntryHeader);

uint8_t* req_data(Header* h) { return reinterpret_cast<uint8_t*>(h) + sizeof(Header); }
uint8_t* resp_data(Header* h) { return req_data(h) + h->ring_bytes; }

struct Challenge {
  uint64_t magic;
  uint32_t version, pad;
  Nonce nonce;
};
struct Hello {
  uint64_t magic, session, generation;
  uint32_t version, pid;
  Nonce nonce;
  Proof proof;  // with the cluster key (zero without)
};
struct Welcome {
  uint64_t magic;
  uint32_t version, ring_bytes;
  int32_t status;  // 0 ok; else refused (an errno-like code; EACCES: the key was not proven)
  uint32_t pad;
  Proof proof;  // with the cluster key: the owner's
};
static_assert(sizeof(Challenge) == 32 && sizeof(Hello) == 80 && sizeof(Welcome) == 56);

constexpr std::string_view kChannelName = "channel";
// Who the hello speaks for: its session and generation, and the pid the kernel vouches for.
std::string hello_identity(uint64_t session, uint64_t generation, uint32_t pid) {
  std::string s(20, '\0');
  std::memcpy(s.data(), &session, 8);
  std::memcpy(s.data() + 8, &generation, 8);
  std::memcpy(s.data() + 16, &pid, 4);
  return s;
}

int abstract_address(const std::string& name, sockaddr_un* a, socklen_t* len) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(a->sun_path)) return -1;
  a->sun_path[0] = '\0';
  std::memcpy(a->sun_path + 1, name.data(), name.size());
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return 0;
}

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

uint64_t mapping_bytes(uint32_t ring_bytes) { return sizeof(Header) + 2ull * ring_bytes; }

std::string socket_name(const std::string& cluster, uint32_t node_id, uint64_t generation) {
  return "fluxon-channel." + cluster + "." + std::to_string(node_id) + "." + std::to_string(generation);
}

// ---- rings ----------------------------------------------------------------------------------------

Producer::Push Producer::push(Kind kind, uint64_t id, const uint8_t* p, uint32_t n, bool* wake) {
  *wake = false;
  if (n > max_payload(cap_)) return Push::kTooLarge;
  const uint64_t head = ctl_->head.load(std::memory_order_acquire);
  if (head > tail_ || tail_ - head > cap_) return Push::kCorrupt;  // the consumer's position is not believable
  const uint64_t need = entry_bytes(n);
  if (need > cap_ - (tail_ - head)) return Push::kFull;
  EntryHead eh{n, uint32_t(kind), id};
  ring_write(data_, cap_, tail_, &eh, sizeof(eh));
  if (n) ring_write(data_, cap_, tail_ + sizeof(eh), p, n);
  tail_ += need;
  ctl_->tail.store(tail_, std::memory_order_seq_cst);
  // Paired with prepare_sleep: either the consumer sees the new tail, or this sees it waiting.
  if (ctl_->waiting.load(std::memory_order_seq_cst)) {
    ctl_->seq.fetch_add(1, std::memory_order_seq_cst);
    *wake = true;
  }
  return Push::kOk;
}

Consumer::Pop Consumer::pop(Entry& out, std::string* why) {
  const uint64_t tail = ctl_->tail.load(std::memory_order_acquire);
  if (tail == head_) return Pop::kEmpty;
  auto corrupt = [&](std::string w) {
    if (why) *why = std::move(w);
    return Pop::kCorrupt;
  };
  if (tail < head_ || tail - head_ > cap_)
    return corrupt("ring position out of range (tail " + std::to_string(tail) + ", head " + std::to_string(head_) +
                   ", capacity " + std::to_string(cap_) + ")");
  const uint64_t avail = tail - head_;
  if (avail < kEntryHeader) return corrupt("partial entry header (" + std::to_string(avail) + " bytes)");
  EntryHead eh;
  ring_read(data_, cap_, head_, &eh, sizeof(eh));
  if (eh.kind < uint32_t(Kind::kCall) || eh.kind > uint32_t(Kind::kReply))
    return corrupt("unknown entry kind " + std::to_string(eh.kind));
  if (eh.len > max_payload(cap_))
    return corrupt("entry of " + std::to_string(eh.len) + " bytes, above the ring's " +
                   std::to_string(max_payload(cap_)));
  const uint64_t need = entry_bytes(eh.len);
  if (need > avail)
    return corrupt("entry of " + std::to_string(eh.len) + " bytes runs past the published end");
  out.kind = Kind(eh.kind);
  out.id = eh.id;
  out.payload.resize(eh.len);
  if (eh.len) ring_read(data_, cap_, head_ + kEntryHeader, out.payload.data(), eh.len);
  head_ += need;
  ctl_->head.store(head_, std::memory_order_release);
  return Pop::kEntry;
}

bool Consumer::prepare_sleep(uint32_t* seq) {
  ctl_->waiting.store(1, std::memory_order_seq_cst);
  *seq = ctl_->seq.load(std::memory_order_seq_cst);
  if (ctl_->tail.load(std::memory_order_seq_cst) != head_) {
    ctl_->waiting.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

Drained drain_requests(Consumer& ring, size_t max, const std::function<void(Entry&&)>& on_entry) {
  Drained d;
  Entry e;
  std::string why;
  while (d.entries < max) {
    auto r = ring.pop(e, &why);
    if (r == Consumer::Pop::kEmpty) break;
    if (r == Consumer::Pop::kCorrupt) {
      d.refused = "malformed entry: " + why;
      break;
    }
    if (e.kind == Kind::kReply) {
      d.refused = "a reply entry from a client";
      break;
    }
    ++d.entries;
    on_entry(std::move(e));
  }
  return d;
}

// ---- owner side -----------------------------------------------------------------------------------

namespace {

struct Mapping {
  Header* h = nullptr;
  uint64_t len = 0;
  ~Mapping() {
    if (h) ::munmap(h, len);
  }
};

}  // namespace

struct Server::Impl {
  struct Channel {
    uint64_t id = 0, session = 0;
    uint32_t pid = 0;
    int sock = -1, efd = -1;
    Mapping map;
    Consumer req;
    std::mutex out_m;  // the response ring's producer side (any thread replies)
    Producer resp;
    bool dead = false;  // guarded by out_m
    ~Channel() {
      if (sock >= 0) ::close(sock);
      if (efd >= 0) ::close(efd);
    }
  };

  ServerOptions opt;
  uint64_t generation = 0;
  Callbacks cb;
  int listen_fd = -1, ep = -1, stop_fd = -1;
  std::thread poller;
  std::atomic<bool> stop{false};
  mutable std::mutex m;  // channels and stats
  std::unordered_map<uint64_t, std::shared_ptr<Channel>> channels;
  std::unordered_map<int, uint64_t> by_fd;  // the poller's: socket or eventfd -> channel
  uint64_t next_id = 1;
  ServerStats st;
  bool changed = true;  // the poller's: rebuild its list of channels
  // When the last reply went out: the poller spins spin_us after it too (the client's next request
  // usually follows its reply).
  std::atomic<int64_t> last_reply{0};

  ~Impl() {
    stop = true;
    if (stop_fd >= 0) {
      uint64_t one = 1;
      (void)!::write(stop_fd, &one, sizeof(one));
    }
    if (poller.joinable()) poller.join();
    for (auto& [id, c] : channels) {
      c->map.h->closed.store(1);
      futex_wake(&c->map.h->resp.seq);
    }
    channels.clear();
    for (const auto& [fd, since] : pending) ::close(fd);
    if (listen_fd >= 0) ::close(listen_fd);
    if (ep >= 0) ::close(ep);
    if (stop_fd >= 0) ::close(stop_fd);
  }

  void close_channel(const std::shared_ptr<Channel>& c, const std::string& why) {
    {
      std::lock_guard<std::mutex> g(c->out_m);
      if (c->dead) return;
      c->dead = true;
    }
    c->map.h->closed.store(1);
    futex_wake(&c->map.h->resp.seq);
    ::epoll_ctl(ep, EPOLL_CTL_DEL, c->sock, nullptr);
    ::epoll_ctl(ep, EPOLL_CTL_DEL, c->efd, nullptr);
    by_fd.erase(c->sock);
    by_fd.erase(c->efd);
    {
      std::lock_guard<std::mutex> g(m);
      channels.erase(c->id);
      changed = true;
      ++st.closed;
      st.open = channels.size();
    }
    if (cb.on_closed) cb.on_closed(c->id, c->session, why);
  }

  void refuse(int fd, int32_t code) {
    {
      // Counted before the peer can read the refusal: whoever sees it sees it counted.
      std::lock_guard<std::mutex> g(m);
      ++st.refused_channels;
    }
    Welcome w{kMagic, kVersion, 0, code, 0, {}};
    write_all(fd, &w, sizeof(w));
    ::close(fd);
  }

  // Connections whose hello has not come yet (fd -> when accepted, the challenge sent). A
  // connection never blocks the poller: its hello is read when it is there, and one still missing
  // after a second is refused.
  struct Pending {
    Clock::time_point since;
    Nonce nonce;
  };
  std::unordered_map<int, Pending> pending;

  void accept_pending() {
    while (true) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      const Challenge ch{kMagic, kVersion, 0, random_nonce()};
      // A fresh socket's buffer takes 32 bytes at once; a peer that cannot take them is refused.
      if (::send(fd, &ch, sizeof(ch), MSG_NOSIGNAL | MSG_DONTWAIT) != ssize_t(sizeof(ch))) {
        ::close(fd);
        continue;
      }
      if (pending.size() >= 64) {  // bounded: a flood of silent connections is refused at once
        refuse(fd, EBUSY);
        continue;
      }
      pending.emplace(fd, Pending{Clock::now(), ch.nonce});
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
  }

  void drop_pending(int fd) {
    ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    pending.erase(fd);
  }

  void sweep_pending() {
    const auto now = Clock::now();
    std::vector<int> late;
    for (const auto& [fd, p] : pending)
      if (now - p.since > std::chrono::seconds(1)) late.push_back(fd);
    for (int fd : late) {
      drop_pending(fd);
      refuse(fd, ETIMEDOUT);
    }
  }

  // The hello of a pending connection is readable (or the peer went).
  void hello_ready(int fd) {
    Hello hello{};
    const ssize_t got = ::recv(fd, &hello, sizeof(hello), MSG_PEEK | MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (got > 0 && got < ssize_t(sizeof(hello))) return;  // the rest is on its way (or the sweep ends it)
    const auto pit = pending.find(fd);
    const Nonce challenge = pit != pending.end() ? pit->second.nonce : Nonce{};
    drop_pending(fd);
    if (got != ssize_t(sizeof(hello)) || ::recv(fd, &hello, sizeof(hello), MSG_DONTWAIT) != ssize_t(sizeof(hello)) ||
        hello.magic != kMagic || hello.version != kVersion)
      return refuse(fd, EPROTO);
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // the welcome is written whole
    welcome(fd, hello, challenge);
  }

  void welcome(int fd, const Hello& hello, const Nonce& challenge) {
    if (hello.generation != generation) return refuse(fd, ESTALE);
    ucred cred{};
    socklen_t cl = sizeof(cred);
    ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
    const std::string who = hello_identity(hello.session, hello.generation, uint32_t(cred.pid));
    Proof mine{};
    if (opt.key) {
      const Proof want = client_proof(*opt.key, kChannelName, challenge, hello.nonce, who);
      if (!equal_ct(want.data(), hello.proof.data(), kProofBytes)) {
        {
          std::lock_guard<std::mutex> g(m);
          ++st.refused_auth;
        }
        return refuse(fd, EACCES);
      }
      mine = server_proof(*opt.key, kChannelName, challenge, hello.nonce, who);
    }
    {
      std::lock_guard<std::mutex> g(m);
      if (channels.size() >= opt.max_channels) {
        ++st.refused_channels;
        Welcome w{kMagic, kVersion, 0, EMFILE, 0, {}};
        write_all(fd, &w, sizeof(w));
        ::close(fd);
        return;
      }
    }
    auto c = std::make_shared<Channel>();
    c->sock = fd;
    c->session = hello.session;
    c->pid = uint32_t(cred.pid);
    const uint64_t len = mapping_bytes(opt.ring_bytes);
    int mfd = int(::syscall(SYS_memfd_create, "fluxon-channel", 1u /*MFD_CLOEXEC*/));
    c->efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (mfd < 0 || c->efd < 0 || ::ftruncate(mfd, off_t(len)) != 0) {
      if (mfd >= 0) ::close(mfd);
      return refuse(fd, ENOMEM);
    }
    void* a = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (a == MAP_FAILED) {
      ::close(mfd);
      return refuse(fd, ENOMEM);
    }
    c->map.h = static_cast<Header*>(a);
    c->map.len = len;
    Header* h = c->map.h;
    new (h) Header{};
    h->magic = kMagic;
    h->version = kVersion;
    h->ring_bytes = opt.ring_bytes;
    h->session = hello.session;
    h->generation = generation;
    h->owner_pid = uint32_t(::getpid());
    h->client_pid = c->pid;
    c->req = Consumer(&h->req, req_data(h), opt.ring_bytes);
    c->resp = Producer(&h->resp, resp_data(h), opt.ring_bytes);
    // The welcome carries the mapping and the doorbell.
    Welcome w{kMagic, kVersion, opt.ring_bytes, 0, 0, mine};
    iovec iov{&w, sizeof(w)};
    char ctrl[CMSG_SPACE(2 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = {mfd, c->efd};
    std::memcpy(CMSG_DATA(cm), fds, sizeof(fds));
    const bool sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL) == ssize_t(sizeof(w));
    ::close(mfd);  // the mapping keeps it
    if (!sent) return;  // c's destructor closes the socket
    {
      std::lock_guard<std::mutex> g(m);
      c->id = next_id++;
      channels.emplace(c->id, c);
      changed = true;
      ++st.opened;
      st.open = channels.size();
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c->sock;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, c->sock, &ev);
    ev.events = EPOLLIN;
    ev.data.fd = c->efd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, c->efd, &ev);
    by_fd[c->sock] = c->id;
    by_fd[c->efd] = c->id;
  }

  std::vector<std::shared_ptr<Channel>> snapshot() {
    std::lock_guard<std::mutex> g(m);
    std::vector<std::shared_ptr<Channel>> v;
    v.reserve(channels.size());
    for (auto& [id, c] : channels) v.push_back(c);
    return v;
  }

  // Drains every channel's request ring; true when an entry came.
  bool drain(const std::vector<std::shared_ptr<Channel>>& all) {
    bool any = false;
    for (const auto& c : all) {
      // Fairness: at most 64 entries of one channel per pass.
      Drained d = drain_requests(c->req, 64, [&](Entry&& e) {
        {
          std::lock_guard<std::mutex> g(m);
          ++(e.kind == Kind::kCall ? st.calls : st.notes);
        }
        if (cb.on_entry) cb.on_entry(c->id, c->session, std::move(e));
      });
      any |= d.entries > 0;
      if (d.refused) {
        {
          std::lock_guard<std::mutex> g(m);
          ++st.refused_entries;
        }
        close_channel(c, *d.refused);
      }
    }
    return any;
  }

  Clock::time_point last_events{};

  // Socket and doorbell events: new connections, hellos, doorbells, clients gone.
  void events(int timeout_ms) {
    last_events = Clock::now();
    epoll_event evs[32];
    const int n = ::epoll_wait(ep, evs, 32, timeout_ms);
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == listen_fd) {
        accept_pending();
        continue;
      }
      if (fd == stop_fd) continue;
      if (pending.count(fd)) {
        hello_ready(fd);
        continue;
      }
      auto it = by_fd.find(fd);
      if (it == by_fd.end()) continue;
      std::shared_ptr<Channel> c;
      {
        std::lock_guard<std::mutex> g(m);
        auto ci = channels.find(it->second);
        if (ci != channels.end()) c = ci->second;
      }
      if (!c) continue;
      if (fd == c->efd) {
        uint64_t v;
        (void)!::read(c->efd, &v, sizeof(v));
      } else if (evs[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR | EPOLLIN)) {
        char b[64];
        ssize_t r = ::recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
          const std::vector<std::shared_ptr<Channel>> one(1, c);
          drain(one);  // what it sent before it went still counts
          close_channel(c, "the client's socket closed");
        }
      }
    }
    if (!pending.empty()) sweep_pending();
  }

  void run() {
    auto last = Clock::now();
    std::vector<std::shared_ptr<Channel>> all;
    while (!stop) {
      if (changed) {  // channels come and go on this thread only
        changed = false;
        all = snapshot();
      }
      if (drain(all)) {
        last = Clock::now();
        // Busy: sockets (new clients, dead ones) are still looked at every millisecond.
        if (last - last_events > std::chrono::milliseconds(1)) events(0);
        continue;
      }
      const auto replied = Clock::time_point(Clock::duration(last_reply.load(std::memory_order_relaxed)));
      if (Clock::now() - std::max(last, replied) < std::chrono::microseconds(opt.spin_us)) {
        spin_step();
        continue;
      }
      // Sleep: every ring says so, then one more look; a client that publishes after this rings.
      bool ready = false;
      uint32_t seq;
      for (const auto& c : all) ready |= !c->req.prepare_sleep(&seq);
      if (!ready) events(200);
      for (const auto& c : all) c->req.awake();
      last = Clock::now() - std::chrono::microseconds(opt.spin_us);  // no spin after a wake-up without work
    }
  }
};

Result<std::unique_ptr<Server>> Server::start(const std::string& name, uint64_t generation, ServerOptions opt,
                                              Callbacks cb) {
  if (opt.ring_bytes < kMinRingBytes || opt.ring_bytes > kMaxRingBytes || opt.ring_bytes % 4096)
    return invalid_argument("channel ring_bytes: must be a multiple of 4096 in [4 KiB, 64 MiB]");
  std::unique_ptr<Server> s(new Server(name));
  s->impl_ = std::make_unique<Impl>();
  auto& I = *s->impl_;
  I.opt = opt;
  I.generation = generation;
  I.cb = std::move(cb);
  sockaddr_un a;
  socklen_t alen;
  if (abstract_address(name, &a, &alen) != 0) return invalid_argument("channel name too long: " + name);
  I.listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (I.listen_fd < 0 || ::bind(I.listen_fd, reinterpret_cast<sockaddr*>(&a), alen) != 0 ||
      ::listen(I.listen_fd, 64) != 0)
    return Status(Code::kInternal, "channel listener @" + name + ": " + std::strerror(errno));
  I.ep = ::epoll_create1(EPOLL_CLOEXEC);
  I.stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (I.ep < 0 || I.stop_fd < 0) return Status(Code::kInternal, std::string("channel poller: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = I.listen_fd;
  ::epoll_ctl(I.ep, EPOLL_CTL_ADD, I.listen_fd, &ev);
  ev.data.fd = I.stop_fd;
  ::epoll_ctl(I.ep, EPOLL_CTL_ADD, I.stop_fd, &ev);
  I.poller = std::thread([&I] { I.run(); });
  return s;
}

Server::Server(std::string name) : name_(std::move(name)) {}
Server::~Server() = default;

bool Server::reply(uint64_t channel, uint64_t id, const Bytes& payload) {
  std::shared_ptr<Impl::Channel> c;
  {
    std::lock_guard<std::mutex> g(impl_->m);
    auto it = impl_->channels.find(channel);
    if (it != impl_->channels.end()) c = it->second;
  }
  bool ok = false, wake = false;
  if (c) {
    std::lock_guard<std::mutex> g(c->out_m);
    if (!c->dead) {
      // A full ring: the client is not reading (stalled or gone); its call times out. Never block.
      auto r = c->resp.push(Kind::kReply, id, payload.data(), uint32_t(payload.size()), &wake);
      ok = r == Producer::Push::kOk;
    }
  }
  if (wake) futex_wake(&c->map.h->resp.seq);
  impl_->last_reply.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(impl_->m);
  ++(ok ? impl_->st.replies : impl_->st.dropped_replies);
  if (wake) ++impl_->st.wakeups_sent;
  return ok;
}

ServerStats Server::stats() const {
  std::lock_guard<std::mutex> g(impl_->m);
  return impl_->st;
}

// ---- client side ----------------------------------------------------------------------------------

struct Client::Impl {
  int sock = -1, efd = -1;
  Mapping map;
  uint32_t spin_us = 20;
  std::mutex in_m;  // the request ring's producer
  Producer req;
  std::mutex m;  // waiters, the reader role
  std::condition_variable cv;
  Consumer resp;
  bool reading = false;
  std::unordered_map<uint64_t, std::optional<Bytes>> waiting;  // call id -> reply when it came
  uint64_t next_id = 1;
  mutable std::atomic<bool> down{false};

  ~Impl() {
    if (map.h) {
      map.h->closed.store(1);
    }
    if (sock >= 0) ::close(sock);
    if (efd >= 0) ::close(efd);
  }

  // The owner's pid is looked at once per 10 ms at most (a system call); the flags every time.
  mutable std::atomic<int64_t> pid_checked{0};
  bool owner_gone() const {
    if (down.load() || map.h->closed.load(std::memory_order_relaxed)) return true;
    const int64_t now = Clock::now().time_since_epoch().count();
    if (now - pid_checked.load(std::memory_order_relaxed) < 10'000'000) return false;
    pid_checked.store(now, std::memory_order_relaxed);
    if (::kill(pid_t(map.h->owner_pid), 0) != 0 && errno == ESRCH) {
      down = true;
      return true;
    }
    return false;
  }

  Status send(Kind kind, uint64_t id, const Bytes& b, Clock::time_point deadline) {
    while (true) {
      bool wake = false;
      Producer::Push r;
      {
        std::lock_guard<std::mutex> g(in_m);
        r = req.push(kind, id, b.data(), uint32_t(b.size()), &wake);
      }
      if (r == Producer::Push::kOk) {
        if (wake) {
          uint64_t one = 1;
          (void)!::write(efd, &one, sizeof(one));
        }
        return Status::ok();
      }
      if (r != Producer::Push::kFull) return Status(Code::kInvalidArgument, "channel: entry refused by the ring");
      if (owner_gone()) return Status(Code::kClosed, "owner channel closed");
      if (Clock::now() > deadline) return Status(Code::kTimeout, "owner channel: request ring full");
      std::this_thread::yield();
    }
  }

  // Reads the response ring until `id`'s reply is there or the deadline; others' replies are
  // handed to their waiters. Called with `m` held and the reader role taken.
  void read_until(std::unique_lock<std::mutex>& g, uint64_t id, Clock::time_point deadline) {
    g.unlock();
    auto spin_end = Clock::now() + std::chrono::microseconds(spin_us);
    bool mine = false;
    while (!mine) {
      Entry e;
      auto r = resp.pop(e, nullptr);
      if (r == Consumer::Pop::kEntry) {
        std::lock_guard<std::mutex> lg(m);
        auto it = waiting.find(e.id);
        if (it != waiting.end()) {
          it->second = std::move(e.payload);
          if (e.id == id) mine = true;
          else cv.notify_all();
        }
        spin_end = Clock::now() + std::chrono::microseconds(spin_us);
        continue;
      }
      if (r == Consumer::Pop::kCorrupt) {
        down = true;
        break;
      }
      const auto now = Clock::now();
      if (now >= deadline || owner_gone()) break;
      if (now < spin_end) {
        spin_step();
        continue;
      }
      uint32_t seq;
      if (resp.prepare_sleep(&seq)) {
        const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
        futex_wait(&map.h->resp.seq, seq, uint32_t(std::clamp<int64_t>(left, 1, 50000)));
      }
      resp.awake();
    }
    g.lock();
  }
};

Result<std::unique_ptr<Client>> Client::connect(const std::string& name, uint64_t session, uint64_t generation,
                                                uint32_t spin_us, AuthKeyPtr key) {
  sockaddr_un a;
  socklen_t alen;
  if (abstract_address(name, &a, &alen) != 0) return invalid_argument("channel name too long: " + name);
  auto I = std::make_unique<Impl>();
  I->spin_us = spin_us;
  I->sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (I->sock < 0) return Status(Code::kClosed, std::string("channel socket: ") + std::strerror(errno));
  if (::connect(I->sock, reinterpret_cast<sockaddr*>(&a), alen) != 0)
    return Status(Code::kClosed, "no owner channel at @" + name + ": " + std::strerror(errno));
  Challenge ch{};
  {
    pollfd p{I->sock, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1 || ::recv(I->sock, &ch, sizeof(ch), MSG_WAITALL) != ssize_t(sizeof(ch)))
      return Status(Code::kTimeout, "channel: no challenge from the owner at @" + name);
    if (ch.magic != kMagic || ch.version != kVersion)
      return Status(Code::kClosed, "channel: the owner at @" + name + " speaks another channel version");
  }
  const uint32_t pid = uint32_t(::getpid());
  const std::string who = hello_identity(session, generation, pid);
  Hello hello{kMagic, session, generation, kVersion, pid, random_nonce(), {}};
  if (key) hello.proof = client_proof(*key, kChannelName, ch.nonce, hello.nonce, who);
  if (!write_all(I->sock, &hello, sizeof(hello))) return Status(Code::kClosed, "channel hello: not sent");
  Welcome w{};
  iovec iov{&w, sizeof(w)};
  char ctrl[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  pollfd p{I->sock, POLLIN, 0};
  if (::poll(&p, 1, 5000) != 1) return Status(Code::kTimeout, "channel: the owner did not answer the hello");
  ssize_t got = ::recvmsg(I->sock, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  int fds[2] = {-1, -1};
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(fds)))
      std::memcpy(fds, CMSG_DATA(cm), sizeof(fds));
  I->efd = fds[1];
  auto close_mfd = [&] {
    if (fds[0] >= 0) ::close(fds[0]);
  };
  if (got != ssize_t(sizeof(w)) || w.magic != kMagic || w.version != kVersion) {
    close_mfd();
    return Status(Code::kClosed, "channel: the owner's answer is not a welcome");
  }
  if (w.status != 0) {
    close_mfd();
    if (w.status == EACCES)
      return Status(Code::kPermissionDenied,
                    "channel refused by the owner: this process did not prove the cluster key (auth.key_file)");
    return Status(w.status == EMFILE ? Code::kNoSpace : Code::kClosed,
                  std::string("channel refused by the owner: ") + std::strerror(w.status));
  }
  if (key) {
    const Proof want = server_proof(*key, kChannelName, ch.nonce, hello.nonce, who);
    if (!equal_ct(want.data(), w.proof.data(), kProofBytes)) {
      close_mfd();
      return Status(Code::kPermissionDenied, "channel: the owner at @" + name + " does not hold this cluster's key");
    }
  }
  struct stat sb{};
  if (fds[0] < 0 || fds[1] < 0 || ::fstat(fds[0], &sb) != 0 || w.ring_bytes < kMinRingBytes ||
      w.ring_bytes > kMaxRingBytes || uint64_t(sb.st_size) != mapping_bytes(w.ring_bytes)) {
    close_mfd();
    return Status(Code::kClosed, "channel: the mapping does not match its ring size");
  }
  const uint64_t len = mapping_bytes(w.ring_bytes);
  void* m = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  close_mfd();
  if (m == MAP_FAILED) return Status(Code::kClosed, std::string("channel mmap: ") + std::strerror(errno));
  I->map.h = static_cast<Header*>(m);
  I->map.len = len;
  Header* h = I->map.h;
  if (h->magic != kMagic || h->ring_bytes != w.ring_bytes || h->session != session || h->generation != generation)
    return Status(Code::kClosed, "channel: the mapping's header does not match");
  I->req = Producer(&h->req, req_data(h), w.ring_bytes);
  I->resp = Consumer(&h->resp, resp_data(h), w.ring_bytes);
  std::unique_ptr<Client> c(new Client());
  c->ring_bytes_ = w.ring_bytes;
  c->impl_ = std::move(I);
  return c;
}

Client::Client() = default;
Client::~Client() = default;

bool Client::down() const { return impl_->owner_gone(); }

void Client::mark_down() {
  impl_->down = true;
  futex_wake(&impl_->map.h->resp.seq);
  std::lock_guard<std::mutex> g(impl_->m);
  impl_->cv.notify_all();
}

void Client::inject_for_test(uint32_t kind, uint32_t len_field, const Bytes& payload) {
  auto& I = *impl_;
  std::lock_guard<std::mutex> g(I.in_m);
  Header* h = I.map.h;
  const uint64_t tail = h->req.tail.load();
  EntryHead eh{len_field, kind, 0};
  ring_write(req_data(h), h->ring_bytes, tail, &eh, sizeof(eh));
  ring_write(req_data(h), h->ring_bytes, tail + sizeof(eh), payload.data(), uint32_t(payload.size()));
  h->req.tail.store(tail + entry_bytes(uint32_t(payload.size())));
  I.req = Producer(&h->req, req_data(h), h->ring_bytes);  // later entries go after it
  uint64_t one = 1;
  (void)!::write(I.efd, &one, sizeof(one));
}

Status Client::notify(const Bytes& note) {
  auto& I = *impl_;
  if (I.owner_gone()) return Status(Code::kClosed, "owner channel closed");
  return I.send(Kind::kNote, 0, note, Clock::now() + std::chrono::seconds(1));
}

Result<Bytes> Client::call(const Bytes& req, uint32_t timeout_ms) {
  auto& I = *impl_;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms ? timeout_ms : 60000);
  if (I.owner_gone()) return Status(Code::kClosed, "owner channel closed");
  std::unique_lock<std::mutex> g(I.m);
  const uint64_t id = I.next_id++;
  std::optional<Bytes>* slot = &I.waiting.emplace(id, std::nullopt).first->second;  // stable across rehashes
  g.unlock();
  Status s = I.send(Kind::kCall, id, req, deadline);
  g.lock();
  if (!s.is_ok()) {
    I.waiting.erase(id);
    return s;
  }
  while (!*slot) {
    if (I.owner_gone()) break;
    if (Clock::now() >= deadline) break;
    if (!I.reading) {
      I.reading = true;
      I.read_until(g, id, deadline);
      I.reading = false;
      I.cv.notify_all();  // another waiter takes the reader role
      continue;
    }
    I.cv.wait_until(g, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
  }
  if (*slot) {
    Bytes out = std::move(**slot);
    I.waiting.erase(id);
    return out;
  }
  I.waiting.erase(id);
  if (I.owner_gone()) return Status(Code::kClosed, "owner channel closed");
  return Status(Code::kTimeout, "owner did not answer within " + std::to_string(timeout_ms) + " ms");
}

// ---- baseline ------------------------------------------------------------------------------------

double futex_ping_pong_p50_us(int iters) {
  struct Shared {
    std::atomic<uint32_t> ping, pong;
  };
  void* a = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) return -1;
  auto* s = new (a) Shared{};
  pid_t child = ::fork();
  if (child == 0) {
    for (int i = 1; i <= iters; ++i) {
      while (s->ping.load() != uint32_t(i)) futex(&s->ping, FUTEX_WAIT, uint32_t(i - 1), nullptr);
      s->pong.store(uint32_t(i));
      futex(&s->pong, FUTEX_WAKE, 1, nullptr);
    }
    ::_exit(0);
  }
  std::vector<double> us;
  us.reserve(size_t(iters));
  for (int i = 1; i <= iters; ++i) {
    auto t0 = Clock::now();
    s->ping.store(uint32_t(i));
    futex(&s->ping, FUTEX_WAKE, 1, nullptr);
    while (s->pong.load() != uint32_t(i)) futex(&s->pong, FUTEX_WAIT, uint32_t(i - 1), nullptr);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  ::munmap(a, 4096);
  std::sort(us.begin(), us.end());
  return us.empty() ? -1 : us[us.size() / 2];
}

}  // namespace fluxon::channel
