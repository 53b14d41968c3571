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
#include "fluxon/core/owner_core.hpp"
#include "fluxon/runtime/metrics.hpp"
#include "fluxon/runtime/segment.hpp"
#include "fluxon/runtime/transport.hpp"

namespace fluxon::actors {

namespace {

constexpr auto kTick = std::chrono::milliseconds(10);

// A queue served by worker threads of its own: the owner actor only pushes (P1). Work not started
// when the queue is stopped is dropped; `stopping()` lets long work end early.
template <class T>
class Workers {
 public:
  Workers(uint32_t threads, std::function<void(T&, const std::atomic<bool>& stopping)> work)
      : work_(std::move(work)) {
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
  void push(T item) {
    {
      std::lock_guard<std::mutex> g(m_);
      q_.push_back(std::move(item));
    }
    cv_.notify_one();
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
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<T> q_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Faults newly carved grants in: the reservation becomes real memory without stalling the owner
// actor, and first writes by clients run at memory speed. In 4 MiB steps, so a stop is quick.
std::unique_ptr<Workers<std::pair<uint64_t, uint64_t>>> make_populator(std::shared_ptr<Segment> seg) {
  return std::make_unique<Workers<std::pair<uint64_t, uint64_t>>>(
      1, [seg](std::pair<uint64_t, uint64_t>& r, const std::atomic<bool>& stopping) {
        for (uint64_t o = 0; o < r.second && !stopping; o += 4 << 20)
          seg->populate(r.first + o, std::min<uint64_t>(4 << 20, r.second - o));
      });
}

// Data-plane fetches, one peer batch per thread at a time; each finished batch is reported to the
// owner actor (weakly held: it may have stopped).
std::unique_ptr<Workers<TransferBatch>> make_fetcher(std::shared_ptr<Segment> seg, caf::actor_addr owner,
                                                     uint32_t threads, uint32_t timeout_ms, double fail_odds,
                                                     uint64_t seed) {
  auto tcp = std::make_shared<TcpFetcher>(timeout_ms);
  struct Faults {
    std::mutex m;
    std::mt19937_64 rng;
  };
  auto faults = std::make_shared<Faults>();
  faults->rng.seed(seed ^ 0x5eed);
  return std::make_unique<Workers<TransferBatch>>(
      threads, [seg, owner, tcp, faults, fail_odds](TransferBatch& b, const std::atomic<bool>&) {
        std::vector<ReadRange> ranges;
        ranges.reserve(b.items.size());
        Status st = Status::ok();
        for (const auto& it : b.items) {
          if (it.dst_offset > seg->size() || it.len > seg->size() - it.dst_offset) {
            st = Status(Code::kInternal, "fetch target outside the segment");
            break;
          }
          ranges.push_back(ReadRange{it.src_offset, it.len, seg->base() + it.dst_offset});
        }
        if (st.is_ok()) st = tcp->read(b.host, b.port, b.source_generation, ranges);
        if (st.is_ok() && fail_odds > 0) {  // fault injection: the bytes came, the batch still fails
          std::lock_guard<std::mutex> g(faults->m);
          if (std::uniform_real_distribution<double>(0, 1)(faults->rng) < fail_odds)
            st = Status(Code::kTimeout, "injected fetch failure");
        }
        if (auto a = caf::actor_cast<caf::actor>(owner))
          caf::anon_send(a, fetched_atom::value, b.id, uint8_t(st.code()), st.message());
      });
}

struct OwnerState {
  // Not an aggregate: CAF 0.17 constructs a state from the actor pointer when it can, and C++20's
  // parenthesized aggregate initialization would let a leading bool take that pointer (as true).
  OwnerState() = default;
  OwnerConfig::FaultInjection faults;
  std::mt19937_64 fault_rng;
  std::shared_ptr<Segment> segment;
  std::unique_ptr<Workers<std::pair<uint64_t, uint64_t>>> populator;
  std::shared_ptr<DataServer> data_server;  // after the segment: stops before it is unmapped
  std::unique_ptr<Workers<TransferBatch>> fetcher;
  std::unique_ptr<OwnerCore> core;
  caf::actor master;
  std::string master_host;  // daemon mode: where to reconnect when the master goes away
  uint16_t master_port = 0;
  std::unordered_map<uint64_t, caf::response_promise> pending;   // client token -> promise
  std::unordered_map<uint64_t, uint64_t> pending_session;        // client token -> session
  std::unordered_map<uint64_t, caf::actor> sessions;             // session -> its session actor
  std::map<caf::actor_addr, uint64_t> session_of;
  uint64_t next_token = 1;
  uint32_t master_timeout_ms = 5000;
  bool reconnecting = false;
  std::unique_ptr<Metrics> metrics;
  int64_t last_metrics = 0;
  bool flush_queued = false;  // a flush_atom is in the mailbox (G9: leaders wait for it)
  static inline const char* name = "fluxon_owner";
};

using Self = caf::stateful_actor<OwnerState>;
static_assert(!std::is_constructible_v<OwnerState, Self*>, "CAF would build the state from the actor pointer");

void export_metrics(OwnerState& st) {
  if (!st.metrics) return;
  auto& m = *st.metrics;
  auto s = st.core->stats();
  const char* help = "Local reserve slots by state";
  m.gauge("fluxon_owner_slots", help, double(s.slots_free), {{"state", "free"}});
  m.gauge("fluxon_owner_slots", help, double(s.slots_prepared), {{"state", "prepared"}});
  m.gauge("fluxon_owner_slots", help, double(s.slots_pending_local_visible), {{"state", "pending_local_visible"}});
  m.gauge("fluxon_owner_slots", help, double(s.slots_pending), {{"state", "pending"}});
  m.gauge("fluxon_owner_slots", help, double(s.slots_committed), {{"state", "committed"}});
  m.gauge("fluxon_owner_grants", "Grants serving a slot class", double(s.grants));
  m.gauge("fluxon_owner_active_put_plans", "Put plans not yet committed or aborted", double(s.active_put_plans));
  m.gauge("fluxon_owner_active_get_handles", "Get handles not yet consumed", double(s.active_get_handles));
  m.gauge("fluxon_owner_holders", "Exported holdings", double(s.holders));
  m.gauge("fluxon_owner_routes", "Live master routes to this owner's slots", double(s.routes));
  m.gauge("fluxon_owner_sessions", "Connected client sessions", double(s.sessions));
  m.gauge("fluxon_owner_publish_jobs", "Publish and route-removal jobs in flight", double(s.publish_jobs));
  m.gauge("fluxon_owner_writeback_jobs", "Owner-hot write-backs in flight", double(st.core->writebacks_pending()));
  m.gauge("fluxon_owner_hot_bytes", "Bytes in the owner-hot tier", double(st.core->hot_bytes()));
  register_counters(m, st.core->counters());
  m.gauge("fluxon_owner_eviction_debt_bytes", "Bytes selected for eviction whose removal is on its way",
          double(st.core->eviction_debt_bytes()));
  const char* fh = "Per-key remote get flights by phase (G7)";
  m.gauge("fluxon_owner_get_flights", fh, double(s.flights_starting), {{"phase", "starting"}});
  m.gauge("fluxon_owner_get_flights", fh, double(s.flights_started), {{"phase", "started"}});
  m.gauge("fluxon_owner_get_flights", fh, double(s.flights_finishing), {{"phase", "finishing"}});
  m.gauge("fluxon_owner_get_flights", fh, double(s.flights_revoking), {{"phase", "revoking"}});
  m.gauge("fluxon_owner_get_jobs", "BatchGetStart/Done/Revoke jobs awaiting the master", double(s.get_jobs));
  m.gauge("fluxon_owner_pending_gets", "get_start requests waiting for the master", double(s.pending_gets));
  if (st.data_server) {
    m.counter("fluxon_owner_data_served_bytes_total", "Bytes this owner served to peers",
              st.data_server->bytes_served());
    m.counter("fluxon_owner_data_served_requests_total", "Fetch requests this owner served",
              st.data_server->requests_served());
    m.counter("fluxon_owner_data_refused_requests_total", "Fetch requests refused (generation, range, protocol)",
              st.data_server->requests_refused());
  }
}

void flush(Self* self, Outbox& out);

void request_master(Self* self, uint64_t token, Blob blob);

void send_to_master(Self* self, uint64_t token, const Envelope& env) {
  auto& st = self->state;
  if (!st.master) return;  // disconnected: the job re-sends from tick() once the master is back
  if (st.faults.enabled()) {
    std::uniform_real_distribution<double> u(0, 1);
    if (u(st.fault_rng) < st.faults.drop) return;  // lost: the core re-sends with the same identity
    const int copies = u(st.fault_rng) < st.faults.duplicate ? 2 : 1;
    for (int i = 0; i < copies; ++i) {
      const auto delay = std::chrono::milliseconds(st.faults.max_delay_ms ? st.fault_rng() % (st.faults.max_delay_ms + 1) : 0);
      self->delayed_send(self, delay, delayed_atom::value, token, Blob{encode(env)});
    }
    return;
  }
  request_master(self, token, Blob{encode(env)});
}

void request_master(Self* self, uint64_t token, Blob blob) {
  auto& st = self->state;
  if (!st.master) return;
  st.master_timeout_ms = std::max<uint32_t>(st.master_timeout_ms, 1);
  self->request(st.master, std::chrono::milliseconds(st.master_timeout_ms), std::move(blob))
      .then(
          [=](Blob& rep) {
            auto env = decode(rep.bytes);
            if (!env.ok()) return self->state.core->on_master_failure(token);
            Outbox out;
            self->state.core->on_master_reply(token, **env, now_ms(), out);
            flush(self, out);
          },
          [=](caf::error&) { self->state.core->on_master_failure(token); });
}

void flush(Self* self, Outbox& out) {
  auto& st = self->state;
  for (auto range : st.core->take_new_grant_ranges()) st.populator->push(range);
  for (auto& o : out) {
    switch (o.kind) {
      case OwnerOut::Kind::kReply: {
        auto it = st.pending.find(o.token);
        if (it == st.pending.end()) break;
        if (auto* hello = o.env.body.AsHelloReply()) {
          // The Hello came from the client's session actor: notes for this session go there.
          auto sender = caf::actor_cast<caf::actor>(it->second.source());
          if (sender) {
            st.sessions[hello->session_id] = sender;
            st.session_of[sender.address()] = hello->session_id;
            self->monitor(sender);
          }
        }
        it->second.deliver(Blob{encode(o.env)});
        st.pending.erase(it);
        st.pending_session.erase(o.token);
        break;
      }
      case OwnerOut::Kind::kNote: {
        auto it = st.sessions.find(o.session);
        if (it != st.sessions.end()) self->send(it->second, Note{encode(o.env)});
        break;
      }
      case OwnerOut::Kind::kMaster:
        send_to_master(self, o.token, o.env);
        break;
      case OwnerOut::Kind::kTransfer:
        st.fetcher->push(std::move(o.transfer));
        break;
    }
  }
  out.clear();
}

void master_up(Self* self, caf::actor m) {
  auto& st = self->state;
  st.reconnecting = false;
  st.master = m;
  self->monitor(m);
  Outbox out;
  st.core->on_master_reconnected(now_ms(), out);
  flush(self, out);
}

// Asks the middleman to connect (no blocking call, no thread); retries every 200 ms.
void try_connect(Self* self) {
  auto& st = self->state;
  auto mm = self->home_system().middleman().actor_handle();
  self->request(mm, std::chrono::seconds(5), caf::connect_atom::value, st.master_host, st.master_port)
      .then(
          [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            if (ptr) return master_up(self, caf::actor_cast<caf::actor>(ptr));
            self->delayed_send(self, std::chrono::milliseconds(200), reconnect_atom::value);
          },
          [=](caf::error&) { self->delayed_send(self, std::chrono::milliseconds(200), reconnect_atom::value); });
}

void start_reconnect(Self* self) {
  auto& st = self->state;
  if (st.reconnecting || st.master_port == 0) return;
  st.reconnecting = true;
  try_connect(self);
}

caf::behavior owner_actor(Self* self, std::shared_ptr<Segment> seg, std::shared_ptr<DataServer> data,
                          OwnerConfig ocfg, uint64_t generation, caf::actor master, std::string master_host,
                          uint16_t master_port, bool metrics) {
  auto& st = self->state;
  // The actor owns the segment from here on: it is unlinked when the actor stops.
  st.core = std::make_unique<OwnerCore>(ocfg, generation, seg->name(), seg->size());
  st.core->set_data_address(ocfg.advertised_data_host(), data->port());
  st.segment = std::move(seg);
  st.populator = make_populator(st.segment);
  // The fetch threads go before the data server and the segment (state members die in reverse).
  st.data_server = std::move(data);
  st.fetcher = make_fetcher(st.segment, self->address(), ocfg.data_threads, ocfg.data_timeout_ms,
                            ocfg.fault_injection.fetch_fail, ocfg.fault_injection.seed);
  st.master = master;
  st.master_host = std::move(master_host);
  st.master_port = master_port;
  st.master_timeout_ms = ocfg.master_rpc_timeout_ms;
  st.faults = ocfg.fault_injection;
  st.fault_rng.seed(st.faults.seed);
  if (st.faults.enabled() || st.faults.fetch_fail > 0)
    std::fprintf(stderr,
                 "fluxon owner: fault injection: seed=%llu master requests drop=%.2f duplicate=%.2f delay<=%u ms; "
                 "fetches fail=%.2f\n",
                 (unsigned long long)st.faults.seed, st.faults.drop, st.faults.duplicate, st.faults.max_delay_ms,
                 st.faults.fetch_fail);
  if (metrics && ocfg.metrics_port != 0) {
    try {
      st.metrics = std::make_unique<Metrics>(ocfg.listen_host, ocfg.metrics_port);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fluxon owner: metrics on port %u disabled: %s\n", ocfg.metrics_port, e.what());
    }
  }
  if (st.master) {
    self->monitor(st.master);
    Outbox out;
    st.core->start(now_ms(), out);
    flush(self, out);
  } else {
    start_reconnect(self);
  }
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.master && dm.source == st.master.address()) {
      st.master = caf::actor{};
      start_reconnect(self);
      return;
    }
    auto it = st.session_of.find(dm.source);
    if (it == st.session_of.end()) return;
    const uint64_t session = it->second;
    st.session_of.erase(it);
    st.sessions.erase(session);
    // Waiting requests of a dead session are never answered.
    for (auto p = st.pending_session.begin(); p != st.pending_session.end();) {
      if (p->second == session) {
        st.pending.erase(p->first);
        p = st.pending_session.erase(p);
      } else {
        ++p;
      }
    }
    Outbox out;
    st.core->close_session(session, out);
    flush(self, out);
  });
  self->send(self, tick_atom::value);
  return {
      [=](Blob& req) -> caf::response_promise {
        auto& st = self->state;
        auto rp = self->make_response_promise();
        auto env = decode(req.bytes);
        if (!env.ok()) {
          // Malformed or truncated: an error reply, and the daemon carries on.
          Outbox out;
          Envelope bad = error_envelope(env.status());
          rp.deliver(Blob{encode(bad)});
          return rp;
        }
        const uint64_t token = st.next_token++;
        st.pending.emplace(token, rp);
        st.pending_session.emplace(token, (*env)->session_id);
        Outbox out;
        st.core->on_client_request(token, **env, now_ms(), out);
        flush(self, out);
        if (st.core->gets_to_flush() && !st.flush_queued) {
          // G9: the leaders of every get_start already in the mailbox join this BatchGetStart;
          // the flush message queues behind them and adds no wait of its own.
          st.flush_queued = true;
          self->send(self, flush_atom::value);
        }
        return rp;
      },
      [=](Note& n) {
        auto env = decode(n.bytes);
        if (!env.ok()) return;  // one-way: nobody to answer; counted by the core below
        Outbox out;
        self->state.core->on_client_note(**env, now_ms(), out);
        flush(self, out);
      },
      [=](delayed_atom, uint64_t token, Blob& blob) { request_master(self, token, std::move(blob)); },
      [=](fetched_atom, uint64_t id, uint8_t code, const std::string& msg) {
        Outbox out;
        Status result = code == 0 ? Status::ok() : Status(static_cast<Code>(code), msg);
        self->state.core->on_transfer_done(id, result, now_ms(), out);
        flush(self, out);
      },
      [=](reconnect_atom) { try_connect(self); },
      [=](flush_atom) {
        auto& st = self->state;
        st.flush_queued = false;
        Outbox out;
        st.core->flush_gets(now_ms(), out);
        flush(self, out);
      },
      [=](tick_atom) {
        auto& st = self->state;
        Outbox out;
        const int64_t now = now_ms();
        st.core->tick(now, out);
        flush(self, out);
        if (now - st.last_metrics >= 1000) {
          st.last_metrics = now;
          export_metrics(st);
        }
        self->delayed_send(self, kTick, tick_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_owner(caf::actor_system& sys, const ClusterConfig& cfg, const OwnerConfig& ocfg, caf::actor master,
                       const std::string& master_host, uint16_t master_port, bool metrics, std::string* error) {
  const uint64_t generation = new_generation();
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
  auto server = DataServer::start(bind_host, ocfg.data_port, shared->base(), shared->size(), generation);
  // The control port is bound after this: an ephemeral data port must not take it (or the metrics
  // port). Held ports are never handed out twice, so one retry while holding the first suffices.
  if (server.ok() && ocfg.data_port == 0 &&
      ((*server)->port() == ocfg.port || (*server)->port() == ocfg.metrics_port)) {
    auto again = DataServer::start(bind_host, 0, shared->base(), shared->size(), generation);
    server = std::move(again);
  }
  if (!server.ok()) {
    if (error) *error = server.status().to_string();
    return caf::actor{};
  }
  if (metrics)  // daemons say which data plane they run; embedded clients stay quiet
    std::fprintf(stderr, "fluxon owner: data plane tcp on %s:%u (RDMA: %s)\n", ocfg.advertised_data_host().c_str(),
                 (*server)->port(), rdma.detail.c_str());
  std::shared_ptr<DataServer> data(std::move(server.value()));
  return sys.spawn(owner_actor, std::move(shared), std::move(data), ocfg, generation, master, master_host,
                   master_port, metrics);
}

}  // namespace fluxon::actors

namespace fluxon {

int run_owner_daemon(const ClusterConfig& cfg, uint32_t node_id) {
  auto ocfg = cfg.owner(node_id);
  if (!ocfg.ok()) {
    std::fprintf(stderr, "fluxon owner: %s\n", ocfg.status().to_string().c_str());
    return 2;
  }
  actors::block_stop_signals();
  caf::actor_system_config acfg;
  actors::configure(acfg, true);
  caf::actor_system sys{acfg};
  const std::string mhost = cfg.master.listen_host == "0.0.0.0" ? "127.0.0.1" : cfg.master.listen_host;
  const uint16_t mport = cfg.master.port;
  std::string err;
  auto owner = actors::spawn_owner(sys, cfg, *ocfg, caf::actor{}, mhost, mport, true, &err);
  if (!owner) {
    std::fprintf(stderr, "fluxon owner: %s\n", err.c_str());
    return 1;
  }
  auto port = sys.middleman().publish(owner, ocfg->port, ocfg->listen_host.c_str(), true);
  if (!port) {
    std::fprintf(stderr, "fluxon owner: cannot listen on %s:%u: %s\n", ocfg->listen_host.c_str(), ocfg->port,
                 sys.render(port.error()).c_str());
    caf::anon_send_exit(owner, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::printf("fluxon owner: node %u of cluster %s listening on %s:%u, segment %s bytes, master %s:%u\n",
              ocfg->node_id, cfg.cluster_name.c_str(), ocfg->listen_host.c_str(), *port,
              std::to_string(ocfg->dram_bytes).c_str(), mhost.c_str(), mport);
  std::fflush(stdout);
  const int sig = actors::wait_stop_signal();
  std::printf("fluxon owner: signal %d, stopping\n", sig);
  std::fflush(stdout);
  caf::anon_send_exit(owner, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace fluxon
