#include "fluxon/client/kv_client.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "fluxon/core/stat_values.hpp"
#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/page_mapper.hpp"
#include "fluxon/runtime/segment.hpp"

namespace fluxon {

using Clock = std::chrono::steady_clock;

// ---- KvFuture ---------------------------------------------------------------------------------

struct KvFuture::State {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  Status status;
  uint64_t put_id = 0;
  void complete(Status s) {
    {
      std::lock_guard<std::mutex> g(m);
      if (done) return;
      done = true;
      status = std::move(s);
    }
    cv.notify_all();
  }
};

bool KvFuture::done() const {
  std::lock_guard<std::mutex> g(s_->m);
  return s_->done;
}

bool KvFuture::wait(double timeout_s) const {
  std::unique_lock<std::mutex> g(s_->m);
  if (timeout_s < 0) {
    s_->cv.wait(g, [&] { return s_->done; });
    return true;
  }
  return s_->cv.wait_for(g, std::chrono::duration<double>(timeout_s), [&] { return s_->done; });
}

Status KvFuture::result(double timeout_s) const {
  if (!wait(timeout_s)) return Status(Code::kTimeout, "put " + std::to_string(s_->put_id) + ": routes not live yet");
  std::lock_guard<std::mutex> g(s_->m);
  return s_->status;
}

uint64_t KvFuture::put_id() const { return s_->put_id; }

// ---- KvClient ---------------------------------------------------------------------------------
// The shell around ClientCore: the owner link and the segment mapping of each connection,
// the futures' waits, the acknowledgement flusher thread, and the lock that serialises the core.

namespace {

// One connection to one owner generation: the link and the mapping of that generation's segment.
// Plans and handles name the connection they came from (its serial): its mapping stays while they do.
struct Conn {
  uint64_t serial = 0;
  std::unique_ptr<OwnerLink> link;
  std::shared_ptr<Segment> mapping;
  uint64_t generation = 0;
  std::atomic<bool> down{false};
  std::unique_ptr<PageMapper> pages;  // this process's page tables for the mapping
  void ensure_populated(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) { pages->touch(ranges); }
};

}  // namespace

struct KvClient::Impl {
  ClusterConfig cfg;
  OwnerLinkFactory open_link;
  std::mutex m;          // guards the core, the connections and the futures; never held across a call
  ClientCore core{0};
  std::shared_ptr<Conn> conn;                              // the attached owner's
  std::map<uint64_t, std::shared_ptr<Conn>> old_conns;     // serial -> earlier connection plans or handles name
  uint64_t next_serial = 1;
  std::unordered_map<uint64_t, std::shared_ptr<KvFuture::State>> futures;  // future id -> its state
  uint64_t next_future = 1;
  bool closed = false;
  uint64_t calls_in_flight = 0;     // public calls running now; close() waits for them
  std::condition_variable idle;
  std::condition_variable acv;      // the flusher: acknowledgements are waiting
  bool stop_flusher = false;
  bool flusher_idle = false;  // waiting for acknowledgements (not in its 2 ms gathering window)
  std::thread flusher;

  // The core is touched under the lock only.
  template <class F>
  auto locked(F&& f) {
    std::lock_guard<std::mutex> g(m);
    return f();
  }

  static Millis now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  }

  void complete(std::vector<std::pair<uint64_t, Status>> done) {
    std::vector<std::pair<std::shared_ptr<KvFuture::State>, Status>> states;
    {
      std::lock_guard<std::mutex> g(m);
      for (auto& [id, st] : done) {
        auto it = futures.find(id);
        if (it == futures.end()) continue;
        states.emplace_back(std::move(it->second), std::move(st));
        futures.erase(it);
      }
    }
    for (auto& [state, st] : states) state->complete(st);
  }

  Status connect() {
    auto c = std::make_shared<Conn>();
    c->serial = locked([&] { return next_serial++; });  // before the link's callbacks can run
    std::weak_ptr<Conn> weak = c;
    LinkCallbacks cb;
    cb.on_note = [this, weak](Envelope& env) {
      auto c = weak.lock();
      if (!c) return;
      std::vector<std::pair<uint64_t, Status>> done;
      {
        std::lock_guard<std::mutex> g(m);
        done = core.on_note(c->serial, env);
      }
      complete(std::move(done));
    };
    cb.on_down = [this, weak] {
      auto c = weak.lock();
      if (!c) return;
      c->down = true;
      lose(*c, Status(Code::kClosed, "owner connection lost before the routes went live"));
    };
    auto link = open_link(cfg, std::move(cb));
    if (!link.ok()) return link.status();
    c->link = std::move(link.value());
    const auto& info = c->link->info();
    c->generation = info.generation;
    auto seg = Segment::open(info.segment_name, info.segment_len);
    if (!seg.ok()) return seg.status();
    c->mapping = std::move(seg.value());
    c->pages = std::make_unique<PageMapper>(c->mapping, info.grant_bytes);
    std::lock_guard<std::mutex> g(m);
    if (conn) old_conns[conn->serial] = conn;
    conn = c;
    core.attach(ClientCore::OwnerView{c->serial, c->generation, info.session_id, info.node_id, info.get_handle_ttl_ms,
                                      c->mapping->base(), c->mapping->size()});
    prune_locked();
    return Status::ok();
  }

  void lose(Conn& c, const Status& why) {
    std::vector<std::pair<uint64_t, Status>> done;
    {
      std::lock_guard<std::mutex> g(m);
      done = core.lose(c.serial, why);
    }
    complete(std::move(done));
  }

  // Earlier connections go once no plan or handle names them.
  void prune_locked() {
    std::erase_if(old_conns, [&](const auto& e) { return !core.references(e.first); });
  }

  // The connection to use now. After the owner went away, an external client reconnects; a new
  // generation is refused (GenerationMismatch) until the caller acknowledges it through
  // wait_local_segments_ready(): it must never write or read through a stale mapping.
  Result<std::shared_ptr<Conn>> current() {
    std::shared_ptr<Conn> c;
    {
      std::lock_guard<std::mutex> g(m);
      if (closed) return Status(Code::kClosed, "client is closed");
      c = conn;
    }
    if (c && c->down) {
      if (cfg.embedded()) return Status(Code::kClosed, "embedded owner stopped");
      Status s = connect();
      if (!s.is_ok()) return Status(Code::kClosed, "owner is down and not reachable: " + s.message());
    }
    std::lock_guard<std::mutex> g(m);
    Status s = core.gate();
    if (!s.is_ok()) return s;
    return conn;
  }

  // With max_wait_ms the owner answers every waiting call by then; one more second covers the trip.
  uint32_t call_timeout_ms() const {
    return cfg.client.max_wait_ms ? std::min(cfg.client.max_wait_ms + 1000, cfg.client.rpc_timeout_ms)
                                  : cfg.client.rpc_timeout_ms;
  }

  Result<std::unique_ptr<Envelope>> call(const std::shared_ptr<Conn>& c, Envelope req) {
    flush_acks();
    {
      std::lock_guard<std::mutex> g(m);
      req = core.addressed(std::move(req));
    }
    auto r = c->link->call(req, call_timeout_ms());
    if (!r.ok()) {
      // No answer in time (the owner stalled): a late answer may still create a plan, a handle or
      // holdings for this session that nobody will ever use, and keys would stay "inflight". The
      // session is given up: the next call opens a new one, and the owner releases everything of
      // this one when its link closes. Futures of this session cannot be told their outcome.
      if (r.status().code() == Code::kTimeout && !cfg.embedded() && !c->down.exchange(true))
        lose(*c, Status(Code::kClosed, "owner did not answer in time; session reset, outcome unknown"));
      return r;
    }
    Status s = envelope_status(**r);
    if (!s.is_ok()) return s;
    return r;
  }

  // Sends the acknowledgement batches the core has ready (all of them with flush).
  void send_acks(bool flush) {
    std::vector<ClientCore::Acks> batches;
    std::vector<std::shared_ptr<Conn>> to;
    {
      std::lock_guard<std::mutex> g(m);
      batches = core.take_acks(flush);
      for (const auto& b : batches) {
        std::shared_ptr<Conn> c = conn && conn->serial == b.at.id ? conn : nullptr;
        if (!c)
          if (auto o = old_conns.find(b.at.id); o != old_conns.end()) c = o->second;
        to.push_back(std::move(c));
      }
      prune_locked();
    }
    for (size_t i = 0; i < batches.size(); ++i)
      if (to[i] && !to[i]->down) to[i]->link->notify(batches[i].note);
  }
  void flush_acks() { send_acks(true); }
  // After a step that may have queued acknowledgements: full batches go now, the rest within ~2 ms.
  void acks_queued() {
    send_acks(false);
    // Only an idle flusher is woken: one already gathering sends these with its batch (a wake-up
    // per call would cost a context switch each, the price of a whole channel round trip).
    bool wake;
    {
      std::lock_guard<std::mutex> g(m);
      wake = flusher_idle && core.acks_waiting();
    }
    if (wake) acv.notify_one();
  }

  void run_flusher() {
    std::unique_lock<std::mutex> g(m);
    while (!stop_flusher) {
      flusher_idle = true;
      acv.wait(g, [&] { return stop_flusher || core.acks_waiting(); });
      flusher_idle = false;
      // Let acknowledgements of the next ~2 ms join this batch.
      acv.wait_for(g, std::chrono::milliseconds(2), [&] { return stop_flusher; });
      g.unlock();
      flush_acks();
      g.lock();
    }
  }
};

namespace {
// Every public call holds one: close() waits until none runs, so the connection (and its actor
// system) is torn down by the closing thread, never under a call still running on another.
class CallGuard {
 public:
  explicit CallGuard(KvClient::Impl* impl) : impl_(impl) {
    std::lock_guard<std::mutex> g(impl_->m);
    entered_ = !impl_->closed;
    if (entered_) impl_->calls_in_flight++;
  }
  ~CallGuard() {
    if (!entered_) return;
    std::lock_guard<std::mutex> g(impl_->m);
    if (--impl_->calls_in_flight == 0) impl_->idle.notify_all();
  }
  bool entered() const { return entered_; }

 private:
  KvClient::Impl* impl_;
  bool entered_ = false;
};
}  // namespace

#define FLUXON_CALL(name)                                                        \
  CallGuard call_guard_(impl_.get());                                            \
  if (!call_guard_.entered()) return Status(Code::kClosed, name ": client is closed")

KvClient::KvClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<KvClient>> KvClient::open(const ClusterConfig& cfg_in, OwnerLinkFactory link) {
  Status v = validate(cfg_in);
  if (!v.is_ok()) return v;
  if (!link) return invalid_argument("open: no owner link factory");
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg_in;
  impl->core = ClientCore(cfg_in.client.max_wait_ms);
  impl->open_link = std::move(link);
  if (impl->cfg.embedded()) {
    // A private cluster name: several embedded clients may live in one process.
    static std::atomic<uint64_t> counter{0};
    impl->cfg.cluster_name += "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  }
  Status s = impl->connect();
  if (!s.is_ok()) return s;
  impl->core.acknowledge();
  Impl* raw = impl.get();
  impl->flusher = std::thread([raw] { raw->run_flusher(); });
  return std::unique_ptr<KvClient>(new KvClient(std::move(impl)));
}

KvClient::~KvClient() { close(); }

void KvClient::close() {
  if (!impl_) return;
  {
    std::unique_lock<std::mutex> g(impl_->m);
    if (impl_->closed) return;
    impl_->closed = true;
    impl_->idle.wait(g, [&] { return impl_->calls_in_flight == 0; });
  }
  impl_->flush_acks();
  {
    std::lock_guard<std::mutex> g(impl_->m);
    impl_->stop_flusher = true;
  }
  impl_->acv.notify_all();
  if (impl_->flusher.joinable()) impl_->flusher.join();
  std::shared_ptr<Conn> c;
  std::unordered_map<uint64_t, std::shared_ptr<KvFuture::State>> futures;
  {
    std::lock_guard<std::mutex> g(impl_->m);
    impl_->core.clear();
    impl_->old_conns.clear();
    futures.swap(impl_->futures);
    c = std::move(impl_->conn);
  }
  for (auto& [_, st] : futures) st->complete(Status(Code::kClosed, "client closed"));
  // The link goes with the last reference to the connection: here, or when a call still running on
  // another thread returns. Then the owner sees the session go down and releases what it held.
}

Result<std::vector<SegmentInfo>> KvClient::wait_local_segments_ready() {
  FLUXON_CALL("wait_local_segments_ready");
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> g(impl_->m);
    if (impl_->closed) return Status(Code::kClosed, "client is closed");
    c = impl_->conn;
  }
  if (c->down && !impl_->cfg.embedded()) {
    Status s = impl_->connect();
    if (!s.is_ok()) return Status(Code::kClosed, "owner is down and not reachable: " + s.message());
  }
  std::lock_guard<std::mutex> g(impl_->m);
  c = impl_->conn;
  impl_->core.acknowledge();  // the caller now knows (and maps) this generation
  SegmentInfo s;
  s.segment_label = impl_->cfg.embedded() ? "cpu:0" : "external_owner:0";
  s.write_ptr = reinterpret_cast<uint64_t>(c->mapping->base());
  s.read_ptr = s.write_ptr;
  s.len = c->mapping->size();
  s.generation = c->generation;
  s.node_id = c->link->info().node_id;
  return std::vector<SegmentInfo>{s};
}

#define FLUXON_TRY_CORE(var, expr) \
  auto var = (expr);               \
  if (!var.ok()) return var.status()

Result<uint64_t> KvClient::local_fast_put_start(const std::vector<std::string>& keys, int64_t value_len,
                                                const PutOptionalArgs& opts) {
  FLUXON_CALL("local_fast_put_start");
  FLUXON_TRY_CORE(req, impl_->locked([&] { return impl_->core.put_start(keys, value_len, opts); }));
  FLUXON_TRY_CORE(c, impl_->current());
  FLUXON_TRY_CORE(r, impl_->call(*c, std::move(*req)));
  std::vector<std::pair<uint64_t, uint64_t>> touched;
  auto plan = impl_->locked([&] { return impl_->core.put_started(**r, keys.size(), uint64_t(value_len), &touched); });
  (*c)->ensure_populated(touched);
  return plan;
}

Result<KvFuture> KvClient::local_fast_put_commit(uint64_t plan_ptr) {
  FLUXON_CALL("local_fast_put_commit");
  FLUXON_TRY_CORE(p, impl_->locked([&] { return impl_->core.take_plan(plan_ptr, true, "local_fast_put_commit"); }));
  FLUXON_TRY_CORE(c, impl_->current());
  auto st = std::make_shared<KvFuture::State>();
  st->put_id = p->put_id;
  FLUXON_TRY_CORE(req, impl_->locked([&] {
    const uint64_t id = impl_->next_future++;
    auto req = impl_->core.put_commit(*p, id);
    if (req.ok()) impl_->futures.emplace(id, st);
    return req;
  }));
  auto r = impl_->call(*c, std::move(*req));
  if (!r.ok()) {
    impl_->locked([&] { impl_->core.commit_failed(*p); });
    return r.status();
  }
  return KvFuture(st);
}

Status KvClient::put_abort(uint64_t plan_ptr) {
  FLUXON_CALL("put_abort");
  FLUXON_TRY_CORE(p, impl_->locked([&] { return impl_->core.take_plan(plan_ptr, true, "put_abort"); }));
  FLUXON_TRY_CORE(c, impl_->current());
  FLUXON_TRY_CORE(req, impl_->locked([&] { return impl_->core.put_abort(*p); }));
  auto r = impl_->call(*c, std::move(*req));
  return r.ok() ? Status::ok() : r.status();
}

Result<std::pair<uint64_t, GetStartResult>> KvClient::get_start(const std::vector<std::string>& keys,
                                                                bool prefix_best_effort,
                                                                const std::optional<std::vector<uint32_t>>& groups) {
  FLUXON_CALL("get_start");
  FLUXON_TRY_CORE(req, impl_->locked([&] { return impl_->core.get_start(keys, prefix_best_effort, groups); }));
  FLUXON_TRY_CORE(c, impl_->current());
  const Millis sent = Impl::now();
  FLUXON_TRY_CORE(r, impl_->call(*c, std::move(*req)));
  return impl_->locked([&] { return impl_->core.get_started(**r, keys.size(), groups, sent); });
}

Result<uint64_t> KvClient::get_transfer(uint64_t handle, std::optional<int64_t> consume_prefix_len) {
  FLUXON_CALL("get_transfer");
  FLUXON_TRY_CORE(t, impl_->locked([&] { return impl_->core.take_handle(handle, consume_prefix_len); }));
  FLUXON_TRY_CORE(c, impl_->current());
  const Status s = impl_->locked([&] { return impl_->core.begin_transfer(*t, Impl::now()); });
  impl_->acks_queued();
  if (!s.is_ok()) return s;
  std::unique_ptr<Envelope> reply;
  if (t->request) {
    FLUXON_TRY_CORE(r, impl_->call(*c, std::move(*t->request)));
    reply = std::move(*r);
  }
  std::vector<std::pair<uint64_t, uint64_t>> touched;
  auto plan = impl_->locked([&] { return impl_->core.finish_transfer(*t, reply.get(), &touched); });
  impl_->acks_queued();
  (*c)->ensure_populated(touched);
  return plan;
}

Status KvClient::cancel_get_transfer(uint64_t handle) {
  FLUXON_CALL("cancel_get_transfer");
  const Status s = impl_->locked([&] { return impl_->core.cancel(handle); });
  impl_->acks_queued();
  return s;
}

Status KvClient::release_views(uint64_t plan_ptr) {
  FLUXON_CALL("release_views");
  {
    std::lock_guard<std::mutex> g(impl_->m);
    if (impl_->closed) return Status(Code::kClosed, "release_views: client is closed");
    auto p = impl_->core.take_plan(plan_ptr, false, "release_views");
    if (!p.ok()) return p.status();
    impl_->core.release_views(std::move(*p));
  }
  impl_->acks_queued();
  return Status::ok();
}

Result<ExistsResult> KvClient::exists_prefix(const std::vector<std::string>& keys,
                                             const std::optional<std::vector<uint32_t>>& groups,
                                             uint64_t expected_len, const std::string& key_prefix,
                                             const std::string& key_suffix) {
  FLUXON_CALL("exists_prefix");
  FLUXON_TRY_CORE(req, impl_->locked([&] { return impl_->core.exists(keys, groups, expected_len, key_prefix, key_suffix); }));
  FLUXON_TRY_CORE(c, impl_->current());
  FLUXON_TRY_CORE(r, impl_->call(*c, std::move(*req)));
  return ClientCore::exists_answer(**r, keys.size());
}

Result<uint64_t> KvClient::remove_prefix(const std::string& prefix) {
  FLUXON_CALL("remove_prefix");
  if (prefix.empty()) return invalid_argument("prefix: must not be empty (it would remove every value)");
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  auto r = impl_->call(*c, make_envelope(wire::RemovePrefixReqT{{}, prefix}));
  if (!r.ok()) return r.status();
  auto* rep = (*r)->body.AsRemovePrefixReply();
  if (!rep) return Status(Code::kInternal, "remove_prefix: malformed reply from the owner");
  return rep->removed;
}

Result<std::map<std::string, uint64_t>> KvClient::stats() {
  FLUXON_CALL("stats");
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  auto r = impl_->call(*c, make_envelope(wire::StatsReqT{}));
  if (!r.ok()) return r.status();
  auto* s = (*r)->body.AsStatsReply();
  if (!s) return Status(Code::kInternal, "stats: malformed reply");
  // The owner's gauges and counters as it declares them; then this client's own.
  std::map<std::string, uint64_t> m = stat_map(s->values);
  m["generation"] = (*c)->generation;
  std::lock_guard<std::mutex> g(impl_->m);
  m["active_put_plans"] = impl_->core.put_plans();
  m["active_read_plans"] = impl_->core.read_plans();
  m["active_get_handles"] = impl_->core.handles();
  return m;
}

Result<std::map<std::string, uint64_t>> KvClient::wait_ready(uint64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto s = stats();
    if (!s.ok()) return s.status();
    const uint64_t want = (*s)["warmup_bytes"], got = (*s)["warmed_bytes"];
    if (got >= want) return s;
    if (std::chrono::steady_clock::now() >= deadline)
      return Status(Code::kTimeout, "wait_ready: the owner's warm-up has faulted in " + std::to_string(got) + " of " +
                                        std::to_string(want) + " bytes (owner_local_reserve_expected_capacity) after " +
                                        std::to_string(timeout_ms) + " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status KvClient::ping() {
  FLUXON_CALL("ping");
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  auto r = (*c)->link->call(make_envelope(wire::PingT{{}, 1}), impl_->cfg.client.rpc_timeout_ms);
  return r.ok() ? Status::ok() : r.status();
}

Status KvClient::send_raw_for_test(const std::vector<uint8_t>& bytes) {
  FLUXON_CALL("send_raw");
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  auto r = (*c)->link->call_raw(bytes, impl_->cfg.client.rpc_timeout_ms);
  if (!r.ok()) return r.status();
  return envelope_status(**r);
}

Result<std::map<std::string, uint64_t>> KvClient::master_stats() {
  FLUXON_CALL("master_stats");
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  auto r = impl_->call(*c, make_envelope(wire::MasterStatsReqT{}));  // the owner forwards it
  if (!r.ok()) return r.status();
  auto* s = (*r)->body.AsMasterStatsReply();
  if (!s) return Status(Code::kInternal, "master_stats: malformed reply");
  return stat_map(s->values);
}

Result<uint64_t> KvClient::master_route_count() {
  FLUXON_CALL("master_route_count");
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  auto r = (*c)->link->call_master(make_envelope(wire::MasterStatsReqT{}), impl_->cfg.client.rpc_timeout_ms);
  if (!r.ok()) return r.status();
  auto* s = (*r)->body.AsMasterStatsReply();
  if (!s) return envelope_status(**r);
  return stat_map(s->values)["routes"];
}

}  // namespace fluxon
