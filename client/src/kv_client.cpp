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

namespace {

// One connection to one owner generation: the link and the mapping of that generation's segment.
struct Conn {
  std::unique_ptr<OwnerLink> link;
  std::shared_ptr<Segment> mapping;
  uint64_t generation = 0;
  std::atomic<bool> down{false};
  // Grants whose pages this process has faulted in: each is populated once, on first use, so
  // later writes and reads run at memory speed instead of one page fault per 4 KiB.
  std::mutex pm;
  std::vector<bool> populated;
  void ensure_populated(uint64_t offset, uint64_t len) {
    const uint64_t gb = link->info().grant_bytes;
    if (gb == 0) return;
    for (uint64_t g = offset / gb; g <= (offset + len - 1) / gb; ++g) {
      {
        std::lock_guard<std::mutex> l(pm);
        if (populated.size() <= g) populated.resize(g + 1, false);
        if (populated[g]) continue;
        populated[g] = true;
      }
      mapping->populate(g * gb, gb);
    }
  }
  std::mutex fm;
  std::unordered_map<uint64_t, std::shared_ptr<KvFuture::State>> futures;  // put_id -> future
  void fail_futures(const Status& s) {
    std::unordered_map<uint64_t, std::shared_ptr<KvFuture::State>> f;
    {
      std::lock_guard<std::mutex> g(fm);
      f.swap(futures);
    }
    for (auto& [_, st] : f) st->complete(s);
  }
};

struct Plan {
  bool is_put = false;
  std::unique_ptr<uint64_t[]> blob;
  uint64_t put_id = 0;
  std::vector<uint64_t> holdings;
  std::shared_ptr<Conn> conn;
};

struct Handle {
  uint64_t owner_handle = 0;
  GetStartResult result;
  std::vector<uint64_t> offsets, lens, holdings;
  std::optional<std::vector<uint32_t>> groups;
  std::shared_ptr<Conn> conn;
  Clock::time_point deadline;
};

}  // namespace

struct KvClient::Impl {
  ClusterConfig cfg;
  OwnerLinkFactory open_link;
  std::mutex m;                              // guards the registries and conn; never held across a call
  std::shared_ptr<Conn> conn;
  uint64_t acked_generation = 0;             // the generation the caller has seen
  std::unordered_map<uint64_t, Plan> plans;  // plan_ptr -> plan
  std::unordered_map<uint64_t, Handle> handles;
  uint64_t next_handle = 1;
  bool closed = false;
  uint64_t calls_in_flight = 0;     // public calls running now; close() waits for them
  std::condition_variable idle;

  // Batched one-way acknowledgements (tail holdings, cancels, release_views).
  std::mutex am;
  std::condition_variable acv;
  wire::AckBatchT acks;
  std::shared_ptr<Conn> ack_conn;
  bool stop_flusher = false;
  std::thread flusher;

  Status connect() {
    auto c = std::make_shared<Conn>();
    std::weak_ptr<Conn> weak = c;
    LinkCallbacks cb;
    cb.on_note = [weak](Envelope& env) {
      auto c = weak.lock();
      if (!c) return;
      if (auto* live = env.body.AsPutLive()) {
        std::shared_ptr<KvFuture::State> st;
        {
          std::lock_guard<std::mutex> g(c->fm);
          auto it = c->futures.find(live->put_id);
          if (it == c->futures.end()) return;
          st = it->second;
          c->futures.erase(it);
        }
        st->complete(live->error ? from_wire(*live->error) : Status::ok());
      }
    };
    cb.on_down = [weak] {
      auto c = weak.lock();
      if (!c) return;
      c->down = true;
      c->fail_futures(Status(Code::kClosed, "owner connection lost before the routes went live"));
    };
    auto link = open_link(cfg, std::move(cb));
    if (!link.ok()) return link.status();
    c->link = std::move(link.value());
    const auto& info = c->link->info();
    c->generation = info.generation;
    auto seg = Segment::open(info.segment_name, info.segment_len);
    if (!seg.ok()) return seg.status();
    c->mapping = std::move(seg.value());
    std::lock_guard<std::mutex> g(m);
    conn = std::move(c);
    return Status::ok();
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
      std::lock_guard<std::mutex> g(m);
      c = conn;
    }
    std::lock_guard<std::mutex> g(m);
    if (c->generation != acked_generation)
      return Status(Code::kGenerationMismatch, "owner restarted: generation " + std::to_string(acked_generation) +
                                                   " -> " + std::to_string(c->generation) +
                                                   "; call wait_local_segments_ready() to map the new segment");
    return c;
  }

  // With max_wait_ms the owner answers every waiting call by then; one more second covers the trip.
  uint32_t call_timeout_ms() const {
    return cfg.client.max_wait_ms ? std::min(cfg.client.max_wait_ms + 1000, cfg.client.rpc_timeout_ms)
                                  : cfg.client.rpc_timeout_ms;
  }

  Result<std::unique_ptr<Envelope>> call(const std::shared_ptr<Conn>& c, Envelope req) {
    flush_acks();
    req.session_id = c->link->info().session_id;
    req.generation = c->generation;
    auto r = c->link->call(req, call_timeout_ms());
    if (!r.ok()) {
      // No answer in time (the owner stalled): a late answer may still create a plan, a handle or
      // holdings for this session that nobody will ever use, and keys would stay "inflight". The
      // session is given up: the next call opens a new one, and the owner releases everything of
      // this one when its link closes. Futures of this session cannot be told their outcome.
      if (r.status().code() == Code::kTimeout && !cfg.embedded() && !c->down.exchange(true))
        c->fail_futures(Status(Code::kClosed, "owner did not answer in time; session reset, outcome unknown"));
      return r;
    }
    Status s = envelope_status(**r);
    if (!s.is_ok()) return s;
    return r;
  }

  void queue_ack(const std::shared_ptr<Conn>& c, uint64_t handle, std::vector<uint64_t> release, bool handle_done) {
    {
      std::lock_guard<std::mutex> g(am);
      if (ack_conn && ack_conn != c) flush_locked();
      ack_conn = c;
      if (handle_done) {
        auto hd = std::make_unique<wire::HandleDoneT>();
        hd->handle_id = handle;
        hd->release_holding_ids = std::move(release);
        acks.handles.push_back(std::move(hd));
      } else {
        acks.release.insert(acks.release.end(), release.begin(), release.end());
      }
      if (acks.handles.size() + acks.release.size() < 256) {
        acv.notify_one();
        return;
      }
      flush_locked();
    }
  }

  void flush_locked() {
    if (!ack_conn || (acks.handles.empty() && acks.release.empty())) return;
    Envelope e = make_envelope(std::move(acks), ack_conn->link->info().session_id, ack_conn->generation);
    acks = wire::AckBatchT{};
    if (!ack_conn->down) ack_conn->link->notify(e);
  }

  void flush_acks() {
    std::lock_guard<std::mutex> g(am);
    flush_locked();
  }

  void run_flusher() {
    std::unique_lock<std::mutex> g(am);
    while (!stop_flusher) {
      acv.wait(g, [&] { return stop_flusher || !acks.handles.empty() || !acks.release.empty(); });
      // Let acknowledgements of the next ~2 ms join this batch.
      acv.wait_for(g, std::chrono::milliseconds(2), [&] { return stop_flusher; });
      flush_locked();
    }
  }

  uint64_t register_plan(Plan p) {
    const uint64_t ptr = reinterpret_cast<uint64_t>(p.blob.get());
    std::lock_guard<std::mutex> g(m);
    plans.emplace(ptr, std::move(p));
    return ptr;
  }

  Result<Plan> take_plan(uint64_t plan_ptr, bool want_put, const char* op) {
    std::lock_guard<std::mutex> g(m);
    if (closed) return Status(Code::kClosed, std::string(op) + ": client is closed");
    auto it = plans.find(plan_ptr);
    if (it == plans.end()) return invalid_argument(std::string(op) + ": unknown plan_ptr " + std::to_string(plan_ptr));
    if (it->second.is_put != want_put)
      return invalid_argument(std::string(op) + ": plan_ptr is a " + (it->second.is_put ? "put" : "read") +
                              " plan");
    Plan p = std::move(it->second);
    plans.erase(it);
    return p;
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
  impl->open_link = std::move(link);
  if (impl->cfg.embedded()) {
    // A private cluster name: several embedded clients may live in one process.
    static std::atomic<uint64_t> counter{0};
    impl->cfg.cluster_name += "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  }
  Status s = impl->connect();
  if (!s.is_ok()) return s;
  impl->acked_generation = impl->conn->generation;
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
    std::lock_guard<std::mutex> g(impl_->am);
    impl_->stop_flusher = true;
  }
  impl_->acv.notify_all();
  if (impl_->flusher.joinable()) impl_->flusher.join();
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> g(impl_->m);
    impl_->plans.clear();
    impl_->handles.clear();
    c = std::move(impl_->conn);
  }
  impl_->ack_conn.reset();
  if (c) c->fail_futures(Status(Code::kClosed, "client closed"));
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
  impl_->acked_generation = c->generation;  // the caller now knows (and maps) this generation
  SegmentInfo s;
  s.segment_label = impl_->cfg.embedded() ? "cpu:0" : "external_owner:0";
  s.write_ptr = reinterpret_cast<uint64_t>(c->mapping->base());
  s.read_ptr = s.write_ptr;
  s.len = c->mapping->size();
  s.generation = c->generation;
  s.node_id = c->link->info().node_id;
  return std::vector<SegmentInfo>{s};
}

Result<uint64_t> KvClient::local_fast_put_start(const std::vector<std::string>& keys, int64_t value_len,
                                                const PutOptionalArgs& opts) {
  FLUXON_CALL("local_fast_put_start");
  // Validation happens before any slot is reserved or any RPC is sent.
  Status s = validate_keys(keys);
  if (s.is_ok() && value_len <= 0) s = invalid_argument("value_len: must be > 0, got " + std::to_string(value_len));
  if (s.is_ok()) s = validate_group_lens(opts.atomic_group_lens, keys.size());
  if (s.is_ok()) s = validate_replica_mask(opts.make_replica_task_mask, opts.atomic_group_lens, keys.size());
  if (!s.is_ok()) return s;
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  wire::PutStartReqT req;
  req.keys = keys;
  req.value_len = uint64_t(value_len);
  req.reject_if_inflight_same_key = opts.reject_if_inflight_same_key;
  req.reject_if_exist_same_key = opts.reject_if_exist_same_key;
  req.write_through = opts.write_through;
  req.make_replica_task = opts.make_replica_task;
  if (opts.make_replica_task_mask) req.make_replica_task_mask = *opts.make_replica_task_mask;
  if (opts.atomic_group_lens) req.atomic_group_lens = *opts.atomic_group_lens;
  req.lease_id = opts.lease_id.value_or(0);
  req.max_wait_ms = impl_->cfg.client.max_wait_ms;
  auto r = impl_->call(*c, make_envelope(std::move(req)));
  if (!r.ok()) return r.status();
  auto* rep = (*r)->body.AsPutStartReply();
  if (!rep || rep->offsets.size() != keys.size())
    return Status(Code::kInternal, "put_start: malformed reply from the owner");
  Plan p;
  p.is_put = true;
  p.put_id = rep->put_id;
  p.conn = *c;
  p.blob.reset(new uint64_t[2 + 2 * keys.size()]);
  p.blob[0] = kPlanMagic;
  p.blob[1] = keys.size();
  std::fill_n(&p.blob[2 + keys.size()], keys.size(), uint64_t(value_len));
  uint8_t* base = (*c)->mapping->base();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (rep->offsets[i] + uint64_t(value_len) > (*c)->mapping->size())
      return Status(Code::kInternal, "put_start: owner offset outside the segment");
    p.blob[2 + i] = reinterpret_cast<uint64_t>(base + rep->offsets[i]);
    (*c)->ensure_populated(rep->offsets[i], uint64_t(value_len));
  }
  return impl_->register_plan(std::move(p));
}

Result<KvFuture> KvClient::local_fast_put_commit(uint64_t plan_ptr) {
  FLUXON_CALL("local_fast_put_commit");
  auto p = impl_->take_plan(plan_ptr, true, "local_fast_put_commit");
  if (!p.ok()) return p.status();
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  if (p->conn != *c) return Status(Code::kGenerationMismatch, "local_fast_put_commit: the plan belongs to an old owner generation");
  auto st = std::make_shared<KvFuture::State>();
  st->put_id = p->put_id;
  {
    // Registered before the request: the PutLive note may overtake the reply.
    std::lock_guard<std::mutex> g((*c)->fm);
    (*c)->futures[p->put_id] = st;
  }
  auto r = impl_->call(*c, make_envelope(wire::PutCommitReqT{{}, p->put_id}));
  if (!r.ok()) {
    std::lock_guard<std::mutex> g((*c)->fm);
    (*c)->futures.erase(p->put_id);
    return r.status();
  }
  return KvFuture(st);
}

Status KvClient::put_abort(uint64_t plan_ptr) {
  FLUXON_CALL("put_abort");
  auto p = impl_->take_plan(plan_ptr, true, "put_abort");
  if (!p.ok()) return p.status();
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  if (p->conn != *c) return Status(Code::kGenerationMismatch, "put_abort: the plan belongs to an old owner generation");
  auto r = impl_->call(*c, make_envelope(wire::PutAbortReqT{{}, p->put_id}));
  return r.ok() ? Status::ok() : r.status();
}

Result<std::pair<uint64_t, GetStartResult>> KvClient::get_start(const std::vector<std::string>& keys,
                                                                bool prefix_best_effort,
                                                                const std::optional<std::vector<uint32_t>>& groups) {
  FLUXON_CALL("get_start");
  Status s = validate_keys(keys);
  if (s.is_ok()) s = validate_group_lens(groups, keys.size());
  if (!s.is_ok()) return s;
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  wire::GetStartReqT req;
  req.keys = keys;
  req.prefix_best_effort = prefix_best_effort;
  if (groups) req.atomic_group_lens = *groups;
  req.max_wait_ms = impl_->cfg.client.max_wait_ms;
  // The owner's TTL starts after this point; ours is half of it, counted from before the send,
  // so a handle is never used after the owner may have released it.
  const auto sent = Clock::now();
  auto r = impl_->call(*c, make_envelope(std::move(req)));
  if (!r.ok()) return r.status();
  auto* rep = (*r)->body.AsGetStartReply();
  if (!rep) return Status(Code::kInternal, "get_start: malformed reply from the owner");
  Handle h;
  h.owner_handle = rep->handle_id;
  h.result.raw_prefix_hit_len = rep->raw_prefix_hit_len;
  h.result.transferable_len = rep->transferable_len;
  h.result.prefix_hit_groups = rep->prefix_hit_groups;
  if (rep->first_miss_index >= 0) h.result.first_miss_index = uint32_t(rep->first_miss_index);
  if (rep->first_miss_group_index >= 0) h.result.first_miss_group_index = uint32_t(rep->first_miss_group_index);
  h.result.all_hit = rep->transferable_len == keys.size();
  h.offsets = std::move(rep->offsets);
  h.lens = std::move(rep->lens);
  h.holdings = std::move(rep->holding_ids);
  h.groups = groups;
  h.conn = *c;
  h.deadline = sent + std::chrono::milliseconds((*c)->link->info().get_handle_ttl_ms / 2);
  h.result.owner_rpc = rep->owner_rpc;  // the items come with get_transfer (remote keys in the prefix)
  h.result.local_keys = rep->local_keys;
  h.result.joined_keys = rep->joined_keys;
  h.result.leader_keys = rep->leader_keys;
  h.result.sources = std::move(rep->sources);
  if (!h.result.owner_rpc && (h.holdings.size() != h.result.transferable_len || h.offsets.size() != h.holdings.size()))
    return Status(Code::kInternal, "get_start: reply items do not match transferable_len");
  if (rep->owner_rpc && !h.holdings.empty())
    return Status(Code::kInternal, "get_start: an OwnerRpc reply carries no items");
  GetStartResult res = h.result;
  std::lock_guard<std::mutex> g(impl_->m);
  const uint64_t id = impl_->next_handle++;
  impl_->handles.emplace(id, std::move(h));
  return std::make_pair(id, res);
}

Result<uint64_t> KvClient::get_transfer(uint64_t handle, std::optional<int64_t> consume_prefix_len) {
  FLUXON_CALL("get_transfer");
  Handle h;
  {
    std::lock_guard<std::mutex> g(impl_->m);
    auto it = impl_->handles.find(handle);
    if (it == impl_->handles.end())
      return invalid_argument("get_transfer: unknown or consumed handle " + std::to_string(handle));
    const uint32_t tl = it->second.result.transferable_len;
    if (consume_prefix_len) {
      // A bad length leaves the handle usable.
      if (*consume_prefix_len <= 0) return invalid_argument("consume_prefix_len: must be > 0");
      if (*consume_prefix_len > int64_t(tl))
        return invalid_argument("consume_prefix_len: " + std::to_string(*consume_prefix_len) +
                                " > transferable_len " + std::to_string(tl));
      Status s = validate_consume_prefix(uint32_t(*consume_prefix_len), tl, it->second.groups);
      if (!s.is_ok()) return s;
    }
    h = std::move(it->second);
    impl_->handles.erase(it);
  }
  const uint32_t tl = h.result.transferable_len;
  const uint32_t consume = consume_prefix_len ? uint32_t(*consume_prefix_len) : tl;
  auto c = impl_->current();
  if (!c.ok() || h.conn != *c) {
    return c.ok() ? Status(Code::kGenerationMismatch, "get_transfer: the handle belongs to an old owner generation")
                  : c.status();
  }
  if (Clock::now() > h.deadline) {
    impl_->queue_ack(h.conn, h.owner_handle, std::move(h.holdings), true);
    return Status(Code::kTimeout, "get_transfer: the handle outlived its TTL and was released");
  }
  if (tl == 0) return Status(Code::kKeyNotFound, "get_transfer: nothing to transfer (first key missed)");
  if (h.result.owner_rpc) {
    // Remote keys: the owner answers once they are local (or fails them all), tail dropped there.
    auto r = impl_->call(h.conn, make_envelope(wire::GetTransferReqT{{}, h.owner_handle, consume, impl_->cfg.client.max_wait_ms}));
    if (!r.ok()) return r.status();
    auto* rep = (*r)->body.AsGetTransferReply();
    if (!rep || rep->offsets.size() != consume || rep->lens.size() != consume || rep->holding_ids.size() != consume)
      return Status(Code::kInternal, "get_transfer: malformed reply from the owner");
    h.offsets = std::move(rep->offsets);
    h.lens = std::move(rep->lens);
    h.holdings = std::move(rep->holding_ids);
  }
  Plan p;
  p.is_put = false;
  p.conn = h.conn;
  p.blob.reset(new uint64_t[2 + 2 * size_t(consume)]);
  p.blob[0] = kPlanMagic;
  p.blob[1] = consume;
  uint8_t* base = h.conn->mapping->base();
  for (uint32_t i = 0; i < consume; ++i) {
    if (h.offsets[i] + h.lens[i] > h.conn->mapping->size()) {
      impl_->queue_ack(h.conn, h.owner_handle, std::move(h.holdings), !h.result.owner_rpc);
      return Status(Code::kInternal, "get_transfer: holding outside the mapped segment");
    }
    p.blob[2 + i] = reinterpret_cast<uint64_t>(base + h.offsets[i]);
    p.blob[2 + consume + i] = h.lens[i];
    h.conn->ensure_populated(h.offsets[i], h.lens[i]);
  }
  std::vector<uint64_t> tail(h.holdings.begin() + consume, h.holdings.end());
  p.holdings.assign(h.holdings.begin(), h.holdings.begin() + consume);
  // Tail holdings go back at once (G5), in the batched acknowledgement queue. An OwnerRpc handle
  // was consumed by the owner with the reply (its tail released there).
  if (!h.result.owner_rpc) impl_->queue_ack(h.conn, h.owner_handle, std::move(tail), true);
  return impl_->register_plan(std::move(p));
}

Status KvClient::cancel_get_transfer(uint64_t handle) {
  FLUXON_CALL("cancel_get_transfer");
  Handle h;
  {
    std::lock_guard<std::mutex> g(impl_->m);
    auto it = impl_->handles.find(handle);
    if (it == impl_->handles.end())
      return invalid_argument("cancel_get_transfer: unknown or consumed handle " + std::to_string(handle));
    h = std::move(it->second);
    impl_->handles.erase(it);
  }
  if (h.owner_handle != 0) impl_->queue_ack(h.conn, h.owner_handle, std::move(h.holdings), true);
  return Status::ok();
}

Status KvClient::release_views(uint64_t plan_ptr) {
  FLUXON_CALL("release_views");
  auto p = impl_->take_plan(plan_ptr, false, "release_views");
  if (!p.ok()) return p.status();
  if (!p->holdings.empty()) impl_->queue_ack(p->conn, 0, std::move(p->holdings), false);
  return Status::ok();
}

Result<ExistsResult> KvClient::exists_prefix(const std::vector<std::string>& keys,
                                             const std::optional<std::vector<uint32_t>>& groups,
                                             uint64_t expected_len, const std::string& key_prefix,
                                             const std::string& key_suffix) {
  FLUXON_CALL("exists_prefix");
  // A question that changes nothing: a repeated key is harmless. Framed keys (key_prefix/key_suffix)
  // may have empty middles; the owner checks the whole keys.
  const bool framed = !key_prefix.empty() || !key_suffix.empty();
  Status s = framed ? (keys.empty() ? invalid_argument("keys: empty batch") : Status::ok())
                    : validate_keys(keys, /*allow_repeats=*/true);
  if (s.is_ok()) s = validate_group_lens(groups, keys.size());
  if (!s.is_ok()) return s;
  auto c = impl_->current();
  if (!c.ok()) return c.status();
  wire::ExistsReqT req;
  req.keys = keys;
  req.key_prefix = key_prefix;
  req.key_suffix = key_suffix;
  if (groups) req.atomic_group_lens = *groups;
  req.expected_len = expected_len;
  req.max_wait_ms = impl_->cfg.client.max_wait_ms;
  auto r = impl_->call(*c, make_envelope(std::move(req)));
  if (!r.ok()) return r.status();
  auto* rep = (*r)->body.AsExistsReply();
  if (!rep || rep->prefix_len > keys.size() || rep->local_len > rep->prefix_len)
    return Status(Code::kInternal, "exists_prefix: malformed reply from the owner");
  return ExistsResult{rep->prefix_len, rep->local_len, rep->master_answered};
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
  uint64_t put = 0, read = 0;
  for (auto& [_, p] : impl_->plans) (p.is_put ? put : read)++;
  m["active_put_plans"] = put;
  m["active_read_plans"] = read;
  m["active_get_handles"] = impl_->handles.size();
  return m;
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
