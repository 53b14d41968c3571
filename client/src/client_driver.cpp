#include "fluxon/client/client_driver.hpp"

#include <algorithm>

namespace fluxon {

// ---- KvFuture (the waits with a timeout are the shell's: kv_client.cpp) ------------------------

void KvFuture::State::complete(Status s) {
  {
    std::lock_guard<std::mutex> g(m);
    if (done) return;
    done = true;
    status = std::move(s);
  }
  cv.notify_all();
}

bool KvFuture::done() const {
  std::lock_guard<std::mutex> g(s_->m);
  return s_->done;
}

uint64_t KvFuture::put_id() const { return s_->put_id; }

std::optional<Status> KvFuture::outcome() const {
  std::lock_guard<std::mutex> g(s_->m);
  if (!s_->done) return std::nullopt;
  return s_->status;
}

// ---- ClientDriver -----------------------------------------------------------------------------

// One session with one owner generation: the link and this process's mapping of that generation's
// segment. Plans and handles name the session they came from (its serial): its mapping stays
// while they do. The mapping goes before the link (declared after it).
struct ClientDriver::Conn {
  uint64_t serial = 0;
  std::unique_ptr<OwnerLink> link;
  std::unique_ptr<SegmentView> view;
  uint64_t generation = 0;
  std::atomic<bool> down{false};
};

// Every public call holds one: close() waits until none runs, so the sessions are torn down by the
// closing thread, never under a call still running on another.
class ClientDriver::CallGuard {
 public:
  explicit CallGuard(ClientDriver* d) : d_(d) {
    std::lock_guard<std::mutex> g(d_->m_);
    entered_ = !d_->closed_;
    if (entered_) d_->calls_in_flight_++;
  }
  ~CallGuard() {
    if (!entered_) return;
    std::lock_guard<std::mutex> g(d_->m_);
    if (--d_->calls_in_flight_ == 0) d_->idle_.notify_all();
  }
  bool entered() const { return entered_; }

 private:
  ClientDriver* d_;
  bool entered_ = false;
};

#define FLUXON_CALL(name)                         \
  CallGuard call_guard_(this);                    \
  if (!call_guard_.entered()) return Status(Code::kClosed, std::string(name) + ": client is closed")

#define FLUXON_TRY(var, expr) \
  auto var = (expr);          \
  if (!var.ok()) return var.status()

ClientDriver::ClientDriver(ClientPolicy policy, ClientPorts& ports)
    : policy_(policy), ports_(ports), core_(policy.max_wait_ms) {}

ClientDriver::~ClientDriver() { close(); }

Status ClientDriver::open() {
  Status s = connect();
  if (s.is_ok()) locked([&] { core_.acknowledge(); });
  return s;
}

void ClientDriver::close() {
  {
    std::unique_lock<std::mutex> g(m_);
    if (closed_) return;
    closed_ = true;
    idle_.wait(g, [&] { return calls_in_flight_ == 0; });
  }
  flush_acks();
  std::shared_ptr<Conn> c;
  std::map<uint64_t, std::shared_ptr<Conn>> old;
  std::unordered_map<uint64_t, std::shared_ptr<KvFuture::State>> futures;
  {
    std::lock_guard<std::mutex> g(m_);
    core_.clear();
    old.swap(old_conns_);
    futures.swap(futures_);
    c = std::move(conn_);
  }
  for (auto& [_, st] : futures) st->complete(Status(Code::kClosed, "client closed"));
  // The sessions go here (or when a callback still holding one returns): the owner sees them go
  // down and releases what they held.
}

void ClientDriver::complete(std::vector<std::pair<uint64_t, Status>> done) {
  std::vector<std::pair<std::shared_ptr<KvFuture::State>, Status>> states;
  {
    std::lock_guard<std::mutex> g(m_);
    for (auto& [id, st] : done) {
      auto it = futures_.find(id);
      if (it == futures_.end()) continue;
      states.emplace_back(std::move(it->second), std::move(st));
      futures_.erase(it);
    }
  }
  for (auto& [state, st] : states) state->complete(st);
}

Status ClientDriver::connect() {
  auto c = std::make_shared<Conn>();
  c->serial = locked([&] { return next_serial_++; });  // before the link's callbacks can run
  std::weak_ptr<Conn> weak = c;
  LinkCallbacks cb;
  cb.on_note = [this, weak](Envelope& env) {
    auto c = weak.lock();
    if (!c) return;
    complete(locked([&] { return core_.on_note(c->serial, env); }));
  };
  cb.on_down = [this, weak] {
    auto c = weak.lock();
    if (!c) return;
    c->down = true;
    lose(*c, Status(Code::kClosed, "owner connection lost before the routes went live"));
  };
  FLUXON_TRY(opened, ports_.open(std::move(cb)));
  c->link = std::move(opened->link);
  c->view = std::move(opened->view);
  const LinkInfo& info = c->link->info();
  c->generation = info.generation;
  std::lock_guard<std::mutex> g(m_);
  if (conn_) old_conns_[conn_->serial] = conn_;
  conn_ = c;
  core_.attach(ClientCore::OwnerView{c->serial, c->generation, info.session_id, info.node_id, info.get_handle_ttl_ms,
                                     c->view->base(), c->view->size()});
  prune_locked();
  return Status::ok();
}

void ClientDriver::lose(Conn& c, const Status& why) { complete(locked([&] { return core_.lose(c.serial, why); })); }

// Earlier sessions go once no plan or handle names them.
void ClientDriver::prune_locked() {
  std::erase_if(old_conns_, [&](const auto& e) { return !core_.references(e.first); });
}

// The session to use now. After the owner went away, an external client reconnects; a new
// generation is refused (GenerationMismatch) until the caller acknowledges it through segment():
// it must never write or read through a stale mapping.
Status ClientDriver::reconnect_if_down() {
  std::shared_ptr<Conn> c = locked([&] { return conn_; });
  if (!c || !c->down) return Status::ok();
  if (policy_.embedded) return Status(Code::kClosed, "embedded owner stopped");
  Status s = connect();
  return s.is_ok() ? s : Status(Code::kClosed, "owner is down and not reachable: " + s.message());
}

Result<std::shared_ptr<ClientDriver::Conn>> ClientDriver::current() {
  if (Status s = reconnect_if_down(); !s.is_ok()) return s;
  std::lock_guard<std::mutex> g(m_);
  Status s = core_.gate();
  if (!s.is_ok()) return s;
  return conn_;
}

Result<std::unique_ptr<Envelope>> ClientDriver::call(const std::shared_ptr<Conn>& c, Envelope req) {
  flush_acks();
  req = locked([&] { return core_.addressed(std::move(req)); });
  auto r = c->link->call(req, policy_.call_timeout_ms());
  if (!r.ok()) {
    // No answer in time (the owner stalled): a late answer may still create a plan, a handle or
    // holdings for this session that nobody will ever use, and keys would stay "inflight". The
    // session is given up: the next call opens a new one, and the owner releases everything of
    // this one when its link closes. Futures of this session cannot be told their outcome.
    if (r.status().code() == Code::kTimeout && !policy_.embedded && !c->down.exchange(true))
      lose(*c, Status(Code::kClosed, "owner did not answer in time; session reset, outcome unknown"));
    return r;
  }
  Status s = envelope_status(**r);
  if (!s.is_ok()) return s;
  return r;
}

// Sends the acknowledgement batches the core has ready (all of them with flush).
void ClientDriver::send_acks(bool flush) {
  std::vector<ClientCore::Acks> batches;
  std::vector<std::shared_ptr<Conn>> to;
  {
    std::lock_guard<std::mutex> g(m_);
    batches = core_.take_acks(flush);
    for (const auto& b : batches) {
      std::shared_ptr<Conn> c = conn_ && conn_->serial == b.at.id ? conn_ : nullptr;
      if (!c)
        if (auto o = old_conns_.find(b.at.id); o != old_conns_.end()) c = o->second;
      to.push_back(std::move(c));
    }
    prune_locked();
  }
  for (size_t i = 0; i < batches.size(); ++i)
    if (to[i] && !to[i]->down) to[i]->link->notify(batches[i].note);
}

void ClientDriver::flush_acks() { send_acks(true); }

bool ClientDriver::acks_waiting() {
  return locked([&] { return core_.acks_waiting(); });
}

// After a step that may have queued acknowledgements: full batches go now, the rest with the
// flusher's next batch.
void ClientDriver::acks_queued() {
  send_acks(false);
  if (acks_waiting()) ports_.acks_waiting();
}

Result<SegmentInfo> ClientDriver::segment() {
  FLUXON_CALL("wait_local_segments_ready");
  // An embedded owner that stopped still reports its segment (the caller's calls say Closed).
  if (Status s = reconnect_if_down(); !s.is_ok() && !policy_.embedded) return s;
  std::lock_guard<std::mutex> g(m_);
  const std::shared_ptr<Conn> c = conn_;
  core_.acknowledge();  // the caller now knows (and maps) this generation
  SegmentInfo s;
  s.segment_label = policy_.embedded ? "cpu:0" : "external_owner:0";
  s.write_ptr = reinterpret_cast<uint64_t>(c->view->base());
  s.read_ptr = s.write_ptr;
  s.len = c->view->size();
  s.generation = c->generation;
  s.node_id = c->link->info().node_id;
  return s;
}

Result<uint64_t> ClientDriver::put_start(const std::vector<std::string>& keys, int64_t value_len,
                                         const PutOptionalArgs& opts) {
  FLUXON_CALL("local_fast_put_start");
  FLUXON_TRY(req, locked([&] { return core_.put_start(keys, value_len, opts); }));
  FLUXON_TRY(c, current());
  FLUXON_TRY(r, call(*c, std::move(*req)));
  std::vector<std::pair<uint64_t, uint64_t>> touched;
  auto plan = locked([&] { return core_.put_started(**r, keys.size(), uint64_t(value_len), &touched); });
  (*c)->view->touch(touched);
  return plan;
}

Result<KvFuture> ClientDriver::put_commit(uint64_t plan_ptr) {
  FLUXON_CALL("local_fast_put_commit");
  FLUXON_TRY(p, locked([&] { return core_.take_plan(plan_ptr, true, "local_fast_put_commit"); }));
  FLUXON_TRY(c, current());
  auto st = std::make_shared<KvFuture::State>();
  st->put_id = p->put_id;
  FLUXON_TRY(req, locked([&] {
    const uint64_t id = next_future_++;
    auto req = core_.put_commit(*p, id);
    if (req.ok()) futures_.emplace(id, st);
    return req;
  }));
  auto r = call(*c, std::move(*req));
  if (!r.ok()) {
    locked([&] { core_.commit_failed(*p); });
    return r.status();
  }
  return KvFuture(st);
}

Status ClientDriver::put_abort(uint64_t plan_ptr) {
  FLUXON_CALL("put_abort");
  FLUXON_TRY(p, locked([&] { return core_.take_plan(plan_ptr, true, "put_abort"); }));
  FLUXON_TRY(c, current());
  FLUXON_TRY(req, locked([&] { return core_.put_abort(*p); }));
  auto r = call(*c, std::move(*req));
  return r.ok() ? Status::ok() : r.status();
}

Result<std::pair<uint64_t, GetStartResult>> ClientDriver::get_start(const std::vector<std::string>& keys,
                                                                    bool prefix_best_effort,
                                                                    const std::optional<std::vector<uint32_t>>& groups) {
  FLUXON_CALL("get_start");
  FLUXON_TRY(req, locked([&] { return core_.get_start(keys, prefix_best_effort, groups); }));
  FLUXON_TRY(c, current());
  const Millis sent = ports_.now();
  FLUXON_TRY(r, call(*c, std::move(*req)));
  return locked([&] { return core_.get_started(**r, keys.size(), groups, sent); });
}

Result<uint64_t> ClientDriver::get_transfer(uint64_t handle, std::optional<int64_t> consume_prefix_len) {
  FLUXON_CALL("get_transfer");
  FLUXON_TRY(t, locked([&] { return core_.take_handle(handle, consume_prefix_len); }));
  FLUXON_TRY(c, current());
  const Status s = locked([&] { return core_.begin_transfer(*t, ports_.now()); });
  acks_queued();
  if (!s.is_ok()) return s;
  std::unique_ptr<Envelope> reply;
  if (t->request) {
    FLUXON_TRY(r, call(*c, std::move(*t->request)));
    reply = std::move(*r);
  }
  std::vector<std::pair<uint64_t, uint64_t>> touched;
  auto plan = locked([&] { return core_.finish_transfer(*t, reply.get(), &touched); });
  acks_queued();
  (*c)->view->touch(touched);
  return plan;
}

Status ClientDriver::cancel(uint64_t handle) {
  FLUXON_CALL("cancel_get_transfer");
  const Status s = locked([&] { return core_.cancel(handle); });
  acks_queued();
  return s;
}

Status ClientDriver::release_views(uint64_t plan_ptr) {
  FLUXON_CALL("release_views");
  {
    std::lock_guard<std::mutex> g(m_);
    auto p = core_.take_plan(plan_ptr, false, "release_views");
    if (!p.ok()) return p.status();
    core_.release_views(std::move(*p));
  }
  acks_queued();
  return Status::ok();
}

Result<ExistsResult> ClientDriver::exists_prefix(const std::vector<std::string>& keys,
                                                 const std::optional<std::vector<uint32_t>>& groups,
                                                 uint64_t expected_len, const std::string& key_prefix,
                                                 const std::string& key_suffix) {
  FLUXON_CALL("exists_prefix");
  FLUXON_TRY(req, locked([&] { return core_.exists(keys, groups, expected_len, key_prefix, key_suffix); }));
  FLUXON_TRY(c, current());
  FLUXON_TRY(r, call(*c, std::move(*req)));
  return ClientCore::exists_answer(**r, keys.size());
}

Result<std::unique_ptr<Envelope>> ClientDriver::request(const char* op, Envelope req) {
  FLUXON_CALL(op);
  FLUXON_TRY(c, current());
  return call(*c, std::move(req));
}

Status ClientDriver::ping() {
  FLUXON_CALL("ping");
  FLUXON_TRY(c, current());
  auto r = (*c)->link->call(make_envelope(wire::PingT{{}, 1}), policy_.rpc_timeout_ms);
  return r.ok() ? Status::ok() : r.status();
}

Status ClientDriver::send_raw(const Bytes& bytes) {
  FLUXON_CALL("send_raw");
  FLUXON_TRY(c, current());
  FLUXON_TRY(r, (*c)->link->call_raw(bytes, policy_.rpc_timeout_ms));
  return envelope_status(**r);
}

Result<std::unique_ptr<Envelope>> ClientDriver::call_master(const char* op, Envelope req) {
  FLUXON_CALL(op);
  FLUXON_TRY(c, current());
  return (*c)->link->call_master(req, policy_.rpc_timeout_ms);
}

ClientDriver::Registry ClientDriver::registry() {
  std::lock_guard<std::mutex> g(m_);
  return Registry{conn_ ? conn_->generation : 0, core_.put_plans(), core_.read_plans(), core_.handles()};
}

}  // namespace fluxon
