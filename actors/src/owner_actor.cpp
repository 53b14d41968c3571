// The owner actor: a thin shell around OwnerCore. It owns the segment, turns CAF messages into
// core calls and the core's outbox into replies, notes and master requests.
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "caf_types.hpp"
#include "daemon_util.hpp"
#include "fluxon/actors/runtime.hpp"
#include "fluxon/owner/owner_core.hpp"
#include "fluxon/driver/owner_driver.hpp"
#include "fluxon/runtime/campaign.hpp"
#include "fluxon/runtime/channel.hpp"
#include "fluxon/runtime/metrics.hpp"
#include "fluxon/runtime/recorder.hpp"
#include "fluxon/runtime/segment.hpp"
#include "fluxon/runtime/transport.hpp"
#include "fluxon/runtime/log.hpp"

namespace fluxon::actors {

namespace {

constexpr auto kTick = std::chrono::milliseconds(10);

// A bounded queue served by worker threads of its own: the owner actor only pushes (P1), and a
// push past `capacity` is refused (the caller decides what that means). Work not started when the
// queue is stopped is dropped; `stopping()` lets long work end early.
template <class T>
class Workers {
 public:
  Workers(uint32_t threads, size_t capacity, std::function<void(T&, const std::atomic<bool>& stopping)> work)
      : work_(std::move(work)), capacity_(capacity) {
    for (uint32_t i = 0; i < std::max<uint32_t>(threads, 1); ++i) threads_.emplace_back([this] { run(); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  bool push(T item) {
    {
      std::lock_guard<std::mutex> g(m_);
      if (q_.size() >= capacity_) return false;
      q_.push_back(std::move(item));
    }
    cv_.notify_one();
    return true;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> g(m_);
    while (true) {
      cv_.wait(g, [&] { return stop_.load() || !q_.empty(); });
      if (stop_) return;
      T item = std::move(q_.front());
      q_.pop_front();
      g.unlock();
      work_(item, stop_);
      g.lock();
    }
  }
  std::function<void(T&, const std::atomic<bool>&)> work_;
  size_t capacity_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<T> q_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Bounds of the actor's own queues.
constexpr size_t kPopulateQueue = 4096;  // grants waiting to be faulted in (past it: first use faults them)
constexpr size_t kFetchQueue = 65536;    // fetch batches waiting for a thread (past it: the batch fails)

// Faults newly carved grants in: the reservation becomes real memory without stalling the owner
// actor, and first writes by clients run at memory speed. In 4 MiB steps, so a stop is quick; each
// range done is reported to the owner actor (warm-up progress: readiness).
std::unique_ptr<Workers<std::pair<uint64_t, uint64_t>>> make_populator(std::shared_ptr<Segment> seg,
                                                                       caf::actor_addr owner) {
  return std::make_unique<Workers<std::pair<uint64_t, uint64_t>>>(
      1, kPopulateQueue, [seg, owner](std::pair<uint64_t, uint64_t>& r, const std::atomic<bool>& stopping) {
        uint64_t o = 0;
        for (; o < r.second && !stopping; o += 4 << 20)
          seg->populate(r.first + o, std::min<uint64_t>(4 << 20, r.second - o));
        if (o < r.second) return;  // stopping
        if (auto a = caf::actor_cast<caf::actor>(owner)) caf::anon_send(a, populated_atom::value, r.second);
      });
}

struct Fetch {
  TransferBatch batch;
  bool fail = false;  // an injected fault: the bytes come, the batch still fails
};

// Data-plane fetches, one peer batch per thread at a time; each finished batch is reported to the
// owner actor (weakly held: it may have stopped).
std::unique_ptr<Workers<Fetch>> make_fetcher(std::shared_ptr<Segment> seg, caf::actor_addr owner, uint32_t threads,
                                             uint32_t timeout_ms, DataIdentity id) {
  auto tcp = std::make_shared<TcpFetcher>(timeout_ms, std::move(id));
  return std::make_unique<Workers<Fetch>>(threads, kFetchQueue, [seg, owner, tcp](Fetch& f, const std::atomic<bool>&) {
    const TransferBatch& b = f.batch;
    std::vector<ReadRange> ranges;
    ranges.reserve(b.items.size());
    Status st = Status::ok();
    for (const auto& it : b.items) {
      if (it.dst_offset > seg->size() || it.len > seg->size() - it.dst_offset) {
        st = Status(Code::kInternal, "fetch target outside the segment");
        break;
      }
      const bool granted = it.grant.size() == kGrantBytes;
      ranges.push_back(ReadRange{it.src_offset, it.len, seg->base() + it.dst_offset,
                                 granted ? reinterpret_cast<const uint8_t*>(it.grant.data()) : nullptr});
    }
    if (st.is_ok()) st = tcp->read(b.host, b.port, b.source_generation, ranges, b.read ? kDataFlagRead : 0);
    if (st.is_ok() && f.fail) st = Status(Code::kTimeout, "injected fetch failure");
    if (auto a = caf::actor_cast<caf::actor>(owner))
      caf::anon_send(a, fetched_atom::value, b.id, uint8_t(st.code()), st.message());
  });
}

struct OwnerState;
using Self = caf::stateful_actor<OwnerState>;

// The actor's ports: CAF messages, the fetch threads and the populator.
class ActorPorts : public OwnerPorts {
 public:
  explicit ActorPorts(Self* self) : self_(self) {}
  void reply(uint64_t token, Envelope& env) override;
  void note(uint64_t session, Envelope& env) override;
  void to_master(uint64_t token, SharedBytes bytes, Millis delay) override;
  void master_reply_later(uint64_t token, SharedBytes bytes, Millis delay) override;
  void fetch(TransferBatch batch, bool fail, Millis delay) override;
  void populate(uint64_t offset, uint64_t len) override;
  void release(uint64_t offset, uint64_t len) override;
  void flush_soon() override;

 private:
  // Runs `f` now on the actor's thread; on the poller (serving in place) queues it for the actor.
  template <class F>
  void in_actor(F&& f);
  Self* self_;
};

struct OwnerState {
  // Not an aggregate: CAF 0.17 constructs a state from the actor pointer when it can, and C++20's
  // parenthesized aggregate initialization would let a leading bool take that pointer (as true).
  OwnerState() = default;
  // The channel's poller serves inside `mu` and reads the members below: it stops first.
  ~OwnerState() { channel.reset(); }
  // The driver, the core and what the ports touch are used by one thread at a time: the actor's
  // handlers, or the channel's poller serving a same-host client's call where it reads it (no hop
  // through the actor's mailbox: that wake-up was most of a local call). The core stays
  // single-threaded in effect, and there is still one path to it: the driver.
  std::mutex mu;
  // Set while the poller serves (under mu): effects that need the actor's context — CAF sends,
  // requests, promises — are queued in `deferred`, and the actor runs them, in order, before
  // anything else it does next (deferred_atom wakes it once per batch).
  bool inline_serving = false;
  std::vector<std::function<void(caf::stateful_actor<OwnerState>*)>> deferred;
  bool deferred_kick = false;
  FaultPlan fault_plan;
  std::mt19937_64 fault_rng;
  std::shared_ptr<Segment> segment;
  std::unique_ptr<Workers<std::pair<uint64_t, uint64_t>>> populator;
  std::shared_ptr<DataServer> data_server;  // after the segment: stops before it is unmapped
  std::unique_ptr<Workers<Fetch>> fetcher;
  std::unique_ptr<OwnerCore> core;
  std::unique_ptr<ActorPorts> ports;
  std::unique_ptr<OwnerDriver> driver;
  std::unique_ptr<channel::Server> channel;  // same-host clients' shared-memory channel (daemons)
  caf::actor master;
  std::string master_host;  // daemon mode: where to reconnect when the master goes away
  uint16_t master_port = 0;
  // A client request waiting for its reply: a CAF promise, or a call on a channel.
  struct Waiter {
    caf::response_promise rp;
    uint64_t channel = 0, call = 0;  // channel != 0: the reply goes to that channel
  };
  std::unordered_map<uint64_t, Waiter> pending;                   // client token -> waiter
  std::unordered_map<uint64_t, caf::actor> sessions;             // session -> its session actor
  std::map<caf::actor_addr, uint64_t> session_of;
  uint32_t master_timeout_ms = 5000;
  bool reconnecting = false;
  uint64_t connect_epoch = 0;  // a connect begun for an older leader's address is ignored
  uint64_t leader_term = 0;    // HA: the term etcd named with master_host:master_port (0: not the HA mode)
  AuthKeyPtr key;              // the cluster key (null: no auth)
  std::shared_ptr<GateStats> gate_stats;  // the gate in front of this owner (daemons)
  std::string master_refusal;  // the last key handshake failure with the master (logged once)
  std::unique_ptr<TrafficRecorder> recorder;  // FLUXON_RECORD: clients' requests, for the fuzzers' corpus
  std::unique_ptr<Metrics> metrics;
  int64_t last_metrics = 0;
  uint64_t metrics_refreshes = 0;
  static inline const char* name = "fluxon_owner";
};

static_assert(!std::is_constructible_v<OwnerState, Self*>, "CAF would build the state from the actor pointer");

// What the poller deferred, in order (under mu).
void run_deferred(Self* self) {
  auto& st = self->state;
  st.deferred_kick = false;
  if (st.deferred.empty()) return;
  auto work = std::move(st.deferred);
  st.deferred.clear();
  for (auto& f : work) f(self);
}

// Every entry into the driver from the actor's side: the lock, then what the poller left to do.
class Turn {
 public:
  explicit Turn(Self* self) : g_(self->state.mu) { run_deferred(self); }

 private:
  std::lock_guard<std::mutex> g_;
};

void export_metrics(OwnerState& st) {
  if (!st.metrics) return;
  auto& m = *st.metrics;
  register_gauges(m, st.core->stats());
  register_counters(m, st.core->counters());
  st.driver->faults().for_each([&](std::string_view point, std::string_view fault, uint64_t n) {
    m.counter("fluxon_owner_faults_injected_total", "Faults injected at a fault point (fault_injection)", n,
              {{"point", std::string(point)}, {"fault", std::string(fault)}});
  });
  if (st.data_server) {
    m.counter("fluxon_owner_data_served_bytes_total", "Bytes this owner served to peers",
              st.data_server->bytes_served());
    m.counter("fluxon_owner_data_served_requests_total", "Fetch requests this owner served",
              st.data_server->requests_served());
    m.counter("fluxon_owner_data_refused_requests_total", "Fetch requests refused (generation, range, protocol)",
              st.data_server->requests_refused());
  }
  {
    const MappingPages pg = mapping_pages(st.segment->base());
    m.gauge("fluxon_owner_segment_page_bytes", "Page size backing most of the segment (2 MiB once huge pages do)",
            double(pg.effective_page_bytes(st.segment->size())));
    m.gauge("fluxon_owner_segment_huge_bytes", "Segment bytes mapped with huge pages now", double(pg.huge_bytes));
  }
  if (st.key) {
    const char* help = "Connections that failed to prove the cluster key, by channel (caf: the control port, "
                       "channel: same-host clients, data: the data plane)";
    m.counter("fluxon_owner_auth_failed_handshakes_total", help, st.gate_stats ? st.gate_stats->handshakes_failed.load() : 0,
              {{"channel", "caf"}});
    m.counter("fluxon_owner_auth_failed_handshakes_total", help, st.channel ? st.channel->stats().refused_auth : 0,
              {{"channel", "channel"}});
    m.counter("fluxon_owner_auth_failed_handshakes_total", help, st.data_server->handshakes_refused(),
              {{"channel", "data"}});
    m.counter("fluxon_owner_auth_handshakes_total", "Connections that proved the cluster key on the control port",
              st.gate_stats ? st.gate_stats->handshakes_ok.load() : 0);
    const char* rhelp = "What was refused for want of the cluster key or a grant (request: a control request from an "
                        "unproven node; note; data_range: a data-plane request for a range the master did not grant)";
    m.counter("fluxon_owner_auth_refused_total", rhelp, st.gate_stats ? st.gate_stats->refused_calls.load() : 0,
              {{"what", "request"}});
    m.counter("fluxon_owner_auth_refused_total", rhelp, st.gate_stats ? st.gate_stats->refused_notes.load() : 0,
              {{"what", "note"}});
    m.counter("fluxon_owner_auth_refused_total", rhelp, st.data_server->requests_denied(), {{"what", "data_range"}});
  }
  if (st.gate_stats)
    m.counter("fluxon_owner_gate_dropped_total", "Messages of no public kind sent to the control port (dropped)",
              st.gate_stats->refused_other.load());
  if (st.channel) {
    const auto cs = st.channel->stats();
    m.gauge("fluxon_owner_channel_sessions", "Same-host clients on the shared-memory channel now", double(cs.open));
    m.counter("fluxon_owner_channel_opened_total", "Shared-memory channels opened", cs.opened);
    m.counter("fluxon_owner_channel_closed_total", "Shared-memory channels closed (client gone or cut off)", cs.closed);
    m.counter("fluxon_owner_channel_refused_total", "Channel connections refused (generation, protocol, full house)",
              cs.refused_channels);
    m.counter("fluxon_owner_channel_calls_total", "Requests that came over the channel", cs.calls);
    m.counter("fluxon_owner_channel_notes_total", "One-way notes that came over the channel", cs.notes);
    m.counter("fluxon_owner_channel_refused_entries_total",
              "Malformed or oversized channel entries (each closes its channel)", cs.refused_entries);
    m.counter("fluxon_owner_channel_dropped_replies_total",
              "Replies the channel could not take (its client stopped reading)", cs.dropped_replies);
  }
  // Last, so a scraper that saw it move sees everything this refresh wrote (tests wait for it: once a second).
  m.counter("fluxon_owner_metrics_refreshes_total", "Times this page was refreshed from the owner's state",
            ++st.metrics_refreshes);
}

// Once a second: what the master's status page shows of this owner (OwnerReport; its answer
// matters to no one - a master that does not know this generation yet says so, and the next
// report, after the registration, is taken).
void report_to_master(Self* self) {
  auto& st = self->state;
  if (!st.master || !st.core || !st.core->registered()) return;
  wire::OwnerReportT r;
  r.node_id = st.core->node_id();
  r.generation = st.core->generation();
  auto add = [&](std::string_view name, uint64_t v) {
    auto nv = std::make_unique<wire::NamedValueT>();
    nv->name = std::string(name);
    nv->value = v;
    r.values.push_back(std::move(nv));
  };
  for_each_gauge(st.core->stats(), [&](std::string_view name, std::string_view, std::string_view, std::string_view,
                                       uint64_t v) { add(name, v); });
  const auto& c = st.core->counters();
  add("put_keys_total", c.put_keys_total);
  add("get_keys_total", c.get_keys_total);
  add("get_hit_keys_total", c.get_hit_keys_total);
  add("evicted_keys_total", c.evicted_keys_total);
  add("evicted_bytes_total", c.evicted_bytes_total);
  add("demoted_keys_total", c.demoted_keys_total);
  add("transfer_bytes_total", c.transfer_bytes_total);
  add("errors_total", c.errors_total);
  add("malformed_total", c.malformed_total);
  if (st.segment) {
    const MappingPages pg = mapping_pages(st.segment->base());
    add("segment_bytes", st.segment->size());
    add("segment_page_bytes", pg.effective_page_bytes(st.segment->size()));
    add("segment_huge_bytes", pg.huge_bytes);
  }
  if (st.data_server) {
    add("data_served_bytes_total", st.data_server->bytes_served());
    add("data_served_requests_total", st.data_server->requests_served());
  }
  if (st.channel) add("channel_sessions", st.channel->stats().open);
  self->request(st.master, std::chrono::seconds(2), Blob{encode(make_envelope(std::move(r)))})
      .then([](Blob&) {}, [](caf::error&) {});
}

void request_master(Self* self, uint64_t token, Blob blob) {
  auto& st = self->state;
  if (!st.master) return;  // disconnected: the job re-sends from its timer once the master is back
  st.master_timeout_ms = std::max<uint32_t>(st.master_timeout_ms, 1);
  self->request(st.master, std::chrono::milliseconds(st.master_timeout_ms), std::move(blob))
      .then(
          [=](Blob& rep) {
            Turn t(self);
            self->state.driver->master_replied(token, std::make_shared<const Bytes>(std::move(rep.bytes)));
          },
          [=](caf::error&) {
            Turn t(self);
            self->state.driver->master_failed(token);
          });
}

template <class F>
void ActorPorts::in_actor(F&& f) {
  if (self_->state.inline_serving) self_->state.deferred.emplace_back(std::forward<F>(f));
  else f(self_);
}

void ActorPorts::reply(uint64_t token, Envelope& env) {
  auto& st = self_->state;
  auto it = st.pending.find(token);
  if (it == st.pending.end()) return;
  if (it->second.channel != 0) {
    if (st.channel) st.channel->reply(it->second.channel, it->second.call, encode(env));
    st.pending.erase(it);
    return;
  }
  // A CAF caller's reply (from the poller: a claim it served at last): the actor delivers it.
  std::optional<uint64_t> hello;
  if (auto* h = env.body.AsHelloReply()) hello = h->session_id;
  in_actor([token, hello, bytes = encode(env)](Self* self) mutable {
    auto& st = self->state;
    auto it = st.pending.find(token);
    if (it == st.pending.end()) return;
    if (hello) {
      // The Hello came from the client's session actor: notes for this session go there.
      auto sender = caf::actor_cast<caf::actor>(it->second.rp.source());
      if (sender) {
        st.sessions[*hello] = sender;
        st.session_of[sender.address()] = *hello;
        self->monitor(sender);
      }
    }
    it->second.rp.deliver(Blob{std::move(bytes)});
    st.pending.erase(it);
  });
}

void ActorPorts::note(uint64_t session, Envelope& env) {
  in_actor([session, bytes = encode(env)](Self* self) mutable {
    auto& st = self->state;
    auto it = st.sessions.find(session);
    if (it != st.sessions.end()) self->send(it->second, Note{std::move(bytes)});
  });
}

void ActorPorts::to_master(uint64_t token, SharedBytes bytes, Millis delay) {
  in_actor([token, bytes, delay](Self* self) {
    if (delay > 0) self->delayed_send(self, std::chrono::milliseconds(delay), delayed_atom::value, token, Blob{*bytes});
    else request_master(self, token, Blob{*bytes});
  });
}

void ActorPorts::master_reply_later(uint64_t token, SharedBytes bytes, Millis delay) {
  if (delay == 0) return self_->state.driver->on_master_reply(token, *bytes, now_ms());
  in_actor([token, bytes, delay](Self* self) {
    self->delayed_send(self, std::chrono::milliseconds(delay), mreply_atom::value, token, Blob{*bytes});
  });
}

void ActorPorts::fetch(TransferBatch batch, bool fail, Millis) {
  const uint64_t id = batch.id;
  if (self_->state.fetcher->push(Fetch{std::move(batch), fail})) return;
  // The queue is at its bound: this batch fails now (its keys are misses, nothing waits forever).
  in_actor([id](Self* self) {
    self->send(self, fetched_atom::value, id, uint8_t(Code::kTimeout),
               std::string("fetch queue full (") + std::to_string(kFetchQueue) + " batches)");
  });
}

void ActorPorts::populate(uint64_t offset, uint64_t len) {
  // Full: the first use faults the pages in; counted as done (nothing is left to wait for).
  if (self_->state.populator->push({offset, len})) return;
  in_actor([len](Self* self) { self->send(self, populated_atom::value, len); });
}

void ActorPorts::release(uint64_t offset, uint64_t len) { self_->state.segment->release(offset, len); }

void ActorPorts::flush_soon() {
  in_actor([](Self* self) { self->send(self, flush_atom::value); });
}

void master_up(Self* self, caf::actor m, bool reconnected) {
  Turn t(self);
  auto& st = self->state;
  st.reconnecting = false;
  st.master = m;
  self->monitor(m);
  st.driver->master_up(now_ms(), reconnected);
}

// Asks the middleman to connect (no blocking call, no thread); retries every 200 ms (50 ms in the
// HA mode, where a new leader is waited for).
void try_connect(Self* self, uint64_t epoch) {
  auto& st = self->state;
  if (epoch != st.connect_epoch) return;
  const auto retry = std::chrono::milliseconds(st.leader_term ? 50 : 200);
  auto mm = self->home_system().middleman().actor_handle();
  self->request(mm, std::chrono::seconds(5), caf::connect_atom::value, st.master_host, st.master_port)
      .then(
          [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            if (epoch != self->state.connect_epoch) return;  // the leader changed meanwhile
            if (!ptr) return self->delayed_send(self, retry, reconnect_atom::value, epoch);
            // The master's gate: this owner proves the cluster key first (nothing without it).
            auto m = caf::actor_cast<caf::actor>(ptr);
            const std::string peer = "the master at " + self->state.master_host + ":" +
                                     std::to_string(self->state.master_port);
            prove_key(self, m, self->state.key, std::chrono::seconds(5), peer, [=](Status proven) {
              auto& st = self->state;
              if (epoch != st.connect_epoch) return;
              if (proven.is_ok()) {
                st.master_refusal.clear();
                return master_up(self, m, /*reconnected=*/true);
              }
              if (proven.message() != st.master_refusal) {  // said once, not at every retry
                st.master_refusal = proven.message();
                logging::logf(logging::Level::kWarn, "owner", "%s (retrying)\n", proven.to_string().c_str());
              }
              self->delayed_send(self, std::max<std::chrono::milliseconds>(retry, std::chrono::seconds(1)),
                                 reconnect_atom::value, epoch);
            });
          },
          [=](caf::error&) {
            if (epoch == self->state.connect_epoch) self->delayed_send(self, retry, reconnect_atom::value, epoch);
          });
}

void start_reconnect(Self* self) {
  auto& st = self->state;
  if (st.reconnecting || st.master_port == 0) return;
  st.reconnecting = true;
  try_connect(self, st.connect_epoch);
}

// A client session is over (its session actor went down, or its channel's socket closed: the process
// died): its holdings are released, and its waiting requests are never answered. Once only.
void end_session(Self* self, uint64_t session) {
  auto& st = self->state;
  auto it = st.sessions.find(session);
  if (it == st.sessions.end()) return;
  st.session_of.erase(it->second.address());
  st.sessions.erase(it);
  for (uint64_t token : st.driver->close_session(session, now_ms())) st.pending.erase(token);
}

// An entry of a same-host client's channel, decoded and served as a CAF request would be (under mu).
void serve_channel_entry(Self* self, uint64_t ch, channel::Entry& e) {
  auto& st = self->state;
  if (e.kind == channel::Kind::kNote) {
    auto env = decode(e.payload);
    if (env.ok()) st.driver->on_client_note(**env, now_ms());
    return;
  }
  if (st.recorder) st.recorder->record(e.payload.data(), e.payload.size());
  const Status served = st.driver->on_client_bytes(e.payload.data(), e.payload.size(), now_ms(), [&](uint64_t token) {
    st.pending.emplace(token, OwnerState::Waiter{caf::response_promise{}, ch, e.id});
  });
  if (!served.is_ok() && st.channel) st.channel->reply(ch, e.id, encode(error_envelope(served)));
}

// The channel's poller serves each entry where it reads it, holding mu (see OwnerState::mu); what
// needs the actor waits for it in `deferred`.
std::unique_ptr<channel::Server> start_channel(Self* self, const std::string& cluster, const OwnerConfig& ocfg,
                                               uint64_t generation) {
  if (ocfg.client_channel_ring_bytes == 0) return nullptr;
  channel::ServerOptions opt;
  opt.key = self->state.key;
  opt.ring_bytes = ocfg.client_channel_ring_bytes;
  opt.max_channels = ocfg.client_channel_max_sessions;
  opt.spin_us = ocfg.client_channel_spin_us;
  channel::Server::Callbacks cb;
  const caf::actor_addr owner = self->address();
  // The state outlives the poller: ~OwnerState stops the channel first.
  cb.on_entry = [self, owner](uint64_t ch, uint64_t, channel::Entry&& e) {
    auto& st = self->state;
    bool kick = false;
    {
      std::lock_guard<std::mutex> g(st.mu);
      st.inline_serving = true;
      serve_channel_entry(self, ch, e);
      st.inline_serving = false;
      if (!st.deferred.empty() && !st.deferred_kick) kick = st.deferred_kick = true;
    }
    if (kick)
      if (auto a = caf::actor_cast<caf::actor>(owner)) caf::anon_send(a, deferred_atom::value);
  };
  cb.on_closed = [owner](uint64_t ch, uint64_t session, const std::string& why) {
    if (auto a = caf::actor_cast<caf::actor>(owner)) caf::anon_send(a, chclosed_atom::value, ch, session, why);
  };
  auto s = channel::Server::start(channel::socket_name(cluster, ocfg.node_id, generation), generation, opt,
                                  std::move(cb));
  if (!s.ok()) {
    logging::logf(logging::Level::kWarn, "owner", "client channel disabled: %s\n", s.status().to_string().c_str());
    return nullptr;
  }
  logging::logf(logging::Level::kInfo, "owner", "client channel @%s (rings of %u bytes, up to %u sessions)\n",
               (*s)->name().c_str(), opt.ring_bytes, opt.max_channels);
  return std::move(s.value());
}

caf::behavior owner_actor(Self* self, std::shared_ptr<Segment> seg, std::shared_ptr<DataServer> data,
                          OwnerConfig ocfg, uint64_t generation, caf::actor master, std::string master_host,
                          uint16_t master_port, bool metrics, std::string cluster, AuthKeyPtr key,
                          std::shared_ptr<GateStats> gate_stats) {
  const bool daemon = metrics;  // embedded owners serve their own process: no channel
  auto& st = self->state;
  st.key = key;
  st.gate_stats = std::move(gate_stats);
  // The actor owns the segment from here on: it is unlinked when the actor stops.
  st.core = std::make_unique<OwnerCore>(ocfg, generation, seg->name(), seg->size());
  st.core->set_data_address(ocfg.advertised_data_host(), data->port());
  st.segment = std::move(seg);
  st.populator = make_populator(st.segment, self->address());
  // The fetch threads go before the data server and the segment (state members die in reverse).
  st.data_server = std::move(data);
  st.fetcher = make_fetcher(st.segment, self->address(), ocfg.data_threads, ocfg.data_timeout_ms,
                            DataIdentity{key, ocfg.node_id, generation});
  st.master = master;
  st.master_host = std::move(master_host);
  st.master_port = master_port;
  st.master_timeout_ms = ocfg.master_rpc_timeout_ms;
  const auto& fi = ocfg.fault_injection;
  st.fault_plan.master_request = LinkFaults{fi.drop, fi.duplicate, 0, fi.max_delay_ms};
  st.fault_plan.fetch = LinkFaults{fi.fetch_fail, 0, 0, 0};
  st.fault_rng.seed(fi.seed);
  st.ports = std::make_unique<ActorPorts>(self);
  st.driver = std::make_unique<OwnerDriver>(*st.core, *st.ports, &st.fault_plan, &st.fault_rng);
  if (daemon) st.recorder = TrafficRecorder::from_env("owner_request");
  if (daemon) st.channel = start_channel(self, cluster, ocfg, generation);
  if (st.driver->faults().any())
    logging::logf(logging::Level::kWarn, "owner",
                 "fault injection: seed=%llu master requests drop=%.2f duplicate=%.2f delay<=%u ms; "
                 "fetches fail=%.2f\n",
                 (unsigned long long)fi.seed, fi.drop, fi.duplicate, fi.max_delay_ms, fi.fetch_fail);
  if (metrics && ocfg.metrics_port != 0) {
    try {
      st.metrics = std::make_unique<Metrics>(ocfg.listen_host, ocfg.metrics_port);
    } catch (const std::exception& e) {
      logging::logf(logging::Level::kWarn, "owner", "metrics on port %u disabled: %s\n", ocfg.metrics_port, e.what());
    }
  }
  if (st.master) master_up(self, st.master, /*reconnected=*/false);
  else start_reconnect(self);
  self->set_down_handler([=](caf::down_msg& dm) {
    Turn t(self);
    auto& st = self->state;
    if (st.master && dm.source == st.master.address()) {
      st.master = caf::actor{};
      st.driver->master_down();
      start_reconnect(self);
      return;
    }
    auto it = st.session_of.find(dm.source);
    if (it == st.session_of.end()) return;
    end_session(self, it->second);
  });
  self->send(self, tick_atom::value);
  return {
      [=](Blob& req) -> caf::response_promise {
        Turn t(self);
        auto& st = self->state;
        auto rp = self->make_response_promise();
        if (st.recorder) st.recorder->record(req.bytes.data(), req.bytes.size());
        const Status served = st.driver->on_client_bytes(req.bytes.data(), req.bytes.size(), now_ms(),
                                                         [&](uint64_t token) {
                                                           st.pending.emplace(token, OwnerState::Waiter{rp, 0, 0});
                                                         });
        // Malformed or truncated: an error reply, and the daemon carries on.
        if (!served.is_ok()) rp.deliver(Blob{encode(error_envelope(served))});
        return rp;
      },
      [=](Note& n) {
        Turn t(self);
        auto env = decode(n.bytes);
        if (!env.ok()) return;  // one-way: nobody to answer
        self->state.driver->on_client_note(**env, now_ms());
      },
      [=](deferred_atom) { Turn t(self); },
      [=](chclosed_atom, uint64_t, uint64_t session, const std::string&) {
        Turn t(self);
        end_session(self, session);
      },
      [=](delayed_atom, uint64_t token, Blob& blob) {
        Turn t(self);
        request_master(self, token, std::move(blob));
      },
      [=](mreply_atom, uint64_t token, Blob& blob) {
        Turn t(self);
        self->state.driver->on_master_reply(token, blob.bytes, now_ms());
      },
      [=](fetched_atom, uint64_t id, uint8_t code, const std::string& msg) {
        Turn t(self);
        Status result = code == 0 ? Status::ok() : Status(static_cast<Code>(code), msg);
        self->state.driver->on_transfer_done(id, result, now_ms());
      },
      [=](populated_atom, uint64_t len) {
        Turn t(self);
        self->state.driver->on_populated(len);
      },
      [=](reconnect_atom, uint64_t epoch) { try_connect(self, epoch); },
      [=](leader_atom, const std::string& address, uint64_t term) {
        // HA: etcd names the leader. Replies of older terms are refused from now on (E2); a new
        // address, or the same master at a new term (its state starts empty), means a reconnect and
        // the resync of every live route, as after a master restart.
        Turn t(self);
        auto& st = self->state;
        const size_t colon = address.rfind(':');
        if (colon == std::string::npos || term < st.leader_term) return;
        const std::string host = address.substr(0, colon);
        const auto port = uint16_t(std::atoi(address.c_str() + colon + 1));
        st.driver->see_master_term(term);
        if (host == st.master_host && port == st.master_port && term == st.leader_term) return;
        logging::logf(logging::Level::kInfo, "owner", "the leader is %s (term %llu)\n", address.c_str(), (unsigned long long)term);
        st.master_host = host;
        st.master_port = port;
        st.leader_term = term;
        if (st.master) {
          self->demonitor(st.master);
          st.master = caf::actor{};
          st.driver->master_down();
        }
        st.connect_epoch++;
        st.reconnecting = false;
        start_reconnect(self);
      },
      [=](flush_atom) {
        Turn t(self);
        self->state.driver->flush(now_ms());
      },
      [=](tick_atom) {
        Turn t(self);
        auto& st = self->state;
        const int64_t now = now_ms();
        // Peers' reads of this owner's copies since the last tick: the eviction order follows them.
        if (auto reads = st.data_server->take_reads(); !reads.empty())
          st.driver->on_peer_reads(reads, st.data_server->reads_dropped());
        st.driver->tick(now);
        if (now - st.last_metrics >= 1000) {
          st.last_metrics = now;
          export_metrics(st);
          report_to_master(self);
        }
        self->delayed_send(self, kTick, tick_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_owner(caf::actor_system& sys, const ClusterConfig& cfg, const OwnerConfig& ocfg, caf::actor master,
                       const std::string& master_host, uint16_t master_port, bool metrics, std::string* error,
                       AuthKeyPtr key, std::shared_ptr<GateStats> gate_stats) {
  const uint64_t generation = new_generation();
  // Segments of this cluster's dead owners (killed with their guardians) go before this one is made.
  for (const SegmentFile& f : sweep_dead_segments(cfg.cluster_name, true).dead)
    logging::logf(logging::Level::kInfo, "owner", "removed the segment of a dead owner: /dev/shm%s (%llu bytes)\n",
                 f.name.c_str(), (unsigned long long)f.bytes);
  auto seg = Segment::create(cfg.cluster_name, ocfg.node_id, generation, ocfg.dram_bytes);
  if (!seg.ok()) {
    if (error) *error = seg.status().to_string();
    return caf::actor{};
  }
  std::shared_ptr<Segment> shared(std::move(seg.value()));
  // The data plane: TCP always; RDMA only when asked for, and only where a device exists.
  const RdmaProbe rdma = rdma_probe();
  if (ocfg.data_transport == "rdma") {
    if (error)
      *error = "data_transport: rdma requested but " + rdma.detail +
               (rdma.available ? " (the RDMA data path is not built yet; use tcp or auto)" : "");
    return caf::actor{};
  }
  const std::string bind_host = ocfg.data_host.empty() ? ocfg.listen_host : ocfg.data_host;
  auto server = DataServer::start(bind_host, ocfg.data_port, shared->base(), shared->size(), generation, 64, key);
  // The control port is bound after this: an ephemeral data port must not take it (or the metrics
  // port). Held ports are never handed out twice, so one retry while holding the first suffices.
  if (server.ok() && ocfg.data_port == 0 &&
      ((*server)->port() == ocfg.port || (*server)->port() == ocfg.metrics_port)) {
    auto again = DataServer::start(bind_host, 0, shared->base(), shared->size(), generation, 64, key);
    server = std::move(again);
  }
  if (!server.ok()) {
    if (error) *error = server.status().to_string();
    return caf::actor{};
  }
  if (metrics) {  // daemons say which data plane they run and what backs the segment; embedded clients stay quiet
    logging::logf(logging::Level::kInfo, "owner", "data plane tcp on %s:%u (RDMA: %s)\n", ocfg.advertised_data_host().c_str(),
                 (*server)->port(), rdma.detail.c_str());
    const MappingPages pg = mapping_pages(shared->base());
    logging::logf(logging::Level::kInfo, "owner",
                 "segment of %llu bytes on %llu-byte pages; shmem huge pages: %s (mode '%s'; "
                 "advise, within_size or always give the segment 2 MiB pages as it fills)\n",
                 (unsigned long long)shared->size(), (unsigned long long)pg.page_bytes,
                 pg.shmem_thp == "advise" || pg.shmem_thp == "within_size" || pg.shmem_thp == "always" ||
                         pg.shmem_thp == "force"
                     ? "on"
                     : "off",
                 pg.shmem_thp.empty() ? "none" : pg.shmem_thp.c_str());
  }
  std::shared_ptr<DataServer> data(std::move(server.value()));
  return sys.spawn(owner_actor, std::move(shared), std::move(data), ocfg, generation, master, master_host,
                   master_port, metrics, cfg.cluster_name, std::move(key), std::move(gate_stats));
}

}  // namespace fluxon::actors

namespace fluxon {

int run_owner_daemon(const ClusterConfig& cfg, uint32_t node_id) {
  auto ocfg = cfg.owner(node_id);
  if (!ocfg.ok()) {
    logging::logf(logging::Level::kError, "owner", "%s\n", ocfg.status().to_string().c_str());
    return 2;
  }
  actors::block_stop_signals();
  caf::actor_system_config acfg;
  actors::configure(acfg, true);
  caf::actor_system sys{acfg};
  // HA: no master address until etcd names the leader (the LeaderWatch below).
  const std::string mhost = cfg.ha() ? std::string() : connect_host(cfg.master.listen_host);
  const uint16_t mport = cfg.ha() ? 0 : cfg.master.port;
  AuthKeyPtr key;
  if (cfg.auth.enabled()) {
    auto k = load_key_file(cfg.auth.key_file);
    if (!k.ok()) {
      logging::logf(logging::Level::kError, "owner", "%s\n", k.status().to_string().c_str());
      return 2;
    }
    key = *k;
  }
  std::string err;
  auto gate_stats = std::make_shared<actors::GateStats>();
  auto owner = actors::spawn_owner(sys, cfg, *ocfg, caf::actor{}, mhost, mport, true, &err, key, gate_stats);
  if (!owner) {
    logging::logf(logging::Level::kError, "owner", "%s\n", err.c_str());
    return 1;
  }
  if (key)
    logging::logf(logging::Level::kInfo, "owner", "auth on: every connection proves the cluster key (key %s from %s)\n",
                 key->fingerprint().c_str(), cfg.auth.key_file.c_str());
  else
    logging::logf(logging::Level::kInfo, "owner", "auth off (no auth.key_file): listening on loopback only\n");
  auto gate = actors::spawn_gate(sys, owner, key, gate_stats, "the owner");
  auto port = sys.middleman().publish(gate, ocfg->port, ocfg->listen_host.c_str(), true);
  if (!port) {
    logging::logf(logging::Level::kError, "owner", "cannot listen on %s:%u: %s\n", ocfg->listen_host.c_str(), ocfg->port,
                 sys.render(port.error()).c_str());
    caf::anon_send_exit(owner, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::unique_ptr<LeaderWatch> watch;
  if (cfg.ha())
    watch = std::make_unique<LeaderWatch>(cfg.etcd.endpoints, cfg.cluster_name, int(cfg.etcd.poll_ms()),
                                          [owner](const LeaderRecord& l) {
                                            caf::anon_send(owner, actors::leader_atom::value, l.address, l.term);
                                          });
  logging::logf(logging::Level::kInfo, "owner", "node %u of cluster %s listening on %s:%u, segment %s bytes, master %s\n",
              ocfg->node_id, cfg.cluster_name.c_str(), ocfg->listen_host.c_str(), *port,
              std::to_string(ocfg->dram_bytes).c_str(),
              cfg.ha() ? "named by etcd" : (mhost + ":" + std::to_string(mport)).c_str());
  std::fflush(stdout);
  const int sig = actors::wait_stop_signal();
  logging::logf(logging::Level::kInfo, "owner", "signal %d, stopping\n", sig);
  std::fflush(stdout);
  watch.reset();
  caf::anon_send_exit(owner, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace fluxon
