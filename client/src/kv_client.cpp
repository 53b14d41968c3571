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

// ---- KvFuture's waits ------------------------------------------------------------------------

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

// ---- KvClient ---------------------------------------------------------------------------------
// The real ports of ClientDriver: an OwnerLink from the factory, the segment mapped with its page
// mapper, the steady clock, and the acknowledgement flusher's thread.

namespace {

// This process's mapping of an owner generation's segment; its page mapper faults ranges in ahead
// of the copies (page_mapper.hpp).
class MappedSegment final : public SegmentView {
 public:
  MappedSegment(std::shared_ptr<Segment> seg, uint64_t grant_bytes)
      : seg_(std::move(seg)), pages_(std::make_unique<PageMapper>(seg_, grant_bytes)) {}
  uint8_t* base() const override { return seg_->base(); }
  uint64_t size() const override { return seg_->size(); }
  void touch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) override { pages_->touch(ranges); }

 private:
  std::shared_ptr<Segment> seg_;
  std::unique_ptr<PageMapper> pages_;
};

}  // namespace

struct KvClient::Impl final : ClientPorts {
  ClusterConfig cfg;
  OwnerLinkFactory open_link;
  std::unique_ptr<ClientDriver> driver;
  // The flusher: sends acknowledgements that are not a full batch within ~2 ms of the first.
  std::mutex fm;
  std::condition_variable fcv;
  bool stop_flusher = false;
  bool flusher_idle = false;  // waiting for acknowledgements (not in its gathering window)
  std::thread flusher;

  Result<Opened> open(LinkCallbacks cb) override {
    auto link = open_link(cfg, std::move(cb));
    if (!link.ok()) return link.status();
    const auto& info = (*link)->info();
    auto seg = Segment::open(info.segment_name, info.segment_len);
    if (!seg.ok()) return seg.status();
    Opened o;
    o.view = std::make_unique<MappedSegment>(std::move(seg.value()), info.grant_bytes);
    o.link = std::move(link.value());
    return o;
  }
  Millis now() override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  }
  // Only an idle flusher is woken: one already gathering sends these with its batch (a wake-up per
  // call would cost a context switch each, the price of a whole channel round trip).
  void acks_waiting() override {
    std::lock_guard<std::mutex> g(fm);
    if (!flusher_idle) return;
    flusher_idle = false;
    fcv.notify_one();
  }
  void run_flusher() {
    for (;;) {
      {
        std::lock_guard<std::mutex> g(fm);
        if (stop_flusher) return;
        flusher_idle = true;
      }
      // Acknowledgements queued before this flusher said it is idle woke nobody: they are seen here.
      const bool waiting = driver->acks_waiting();
      std::unique_lock<std::mutex> g(fm);
      if (!waiting) fcv.wait(g, [&] { return stop_flusher || !flusher_idle; });
      flusher_idle = false;
      if (stop_flusher) return;
      // Let acknowledgements of the next ~2 ms join this batch.
      fcv.wait_for(g, std::chrono::milliseconds(2), [&] { return stop_flusher; });
      g.unlock();
      driver->flush_acks();
    }
  }
  void stop() {
    {
      std::lock_guard<std::mutex> g(fm);
      stop_flusher = true;
    }
    fcv.notify_all();
    if (flusher.joinable()) flusher.join();
  }
};

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
  impl->driver = std::make_unique<ClientDriver>(ClientPolicy::of(impl->cfg), *impl);
  Status s = impl->driver->open();
  if (!s.is_ok()) return s;
  Impl* raw = impl.get();
  impl->flusher = std::thread([raw] { raw->run_flusher(); });
  return std::unique_ptr<KvClient>(new KvClient(std::move(impl)));
}

KvClient::~KvClient() { close(); }

void KvClient::close() {
  if (!impl_) return;
  impl_->stop();
  impl_->driver->close();  // waits for calls still running, flushes what the flusher left
}

Result<std::vector<SegmentInfo>> KvClient::wait_local_segments_ready() {
  auto s = impl_->driver->segment();
  if (!s.ok()) return s.status();
  return std::vector<SegmentInfo>{std::move(*s)};
}

Result<uint64_t> KvClient::local_fast_put_start(const std::vector<std::string>& keys, int64_t value_len,
                                                const PutOptionalArgs& opts) {
  return impl_->driver->put_start(keys, value_len, opts);
}

Result<KvFuture> KvClient::local_fast_put_commit(uint64_t plan_ptr) { return impl_->driver->put_commit(plan_ptr); }

Status KvClient::put_abort(uint64_t plan_ptr) { return impl_->driver->put_abort(plan_ptr); }

Result<std::pair<uint64_t, GetStartResult>> KvClient::get_start(const std::vector<std::string>& keys,
                                                                bool prefix_best_effort,
                                                                const std::optional<std::vector<uint32_t>>& groups) {
  return impl_->driver->get_start(keys, prefix_best_effort, groups);
}

Result<uint64_t> KvClient::get_transfer(uint64_t handle, std::optional<int64_t> consume_prefix_len) {
  return impl_->driver->get_transfer(handle, consume_prefix_len);
}

Status KvClient::cancel_get_transfer(uint64_t handle) { return impl_->driver->cancel(handle); }

Status KvClient::release_views(uint64_t plan_ptr) { return impl_->driver->release_views(plan_ptr); }

Result<ExistsResult> KvClient::exists_prefix(const std::vector<std::string>& keys,
                                             const std::optional<std::vector<uint32_t>>& groups,
                                             uint64_t expected_len, const std::string& key_prefix,
                                             const std::string& key_suffix) {
  return impl_->driver->exists_prefix(keys, groups, expected_len, key_prefix, key_suffix);
}

Result<uint64_t> KvClient::remove_prefix(const std::string& prefix) {
  if (prefix.empty()) return invalid_argument("prefix: must not be empty (it would remove every value)");
  auto r = impl_->driver->request("remove_prefix", make_envelope(wire::RemovePrefixReqT{{}, prefix}));
  if (!r.ok()) return r.status();
  auto* rep = (*r)->body.AsRemovePrefixReply();
  if (!rep) return Status(Code::kInternal, "remove_prefix: malformed reply from the owner");
  return rep->removed;
}

Result<std::map<std::string, uint64_t>> KvClient::stats() {
  auto r = impl_->driver->request("stats", make_envelope(wire::StatsReqT{}));
  if (!r.ok()) return r.status();
  auto* s = (*r)->body.AsStatsReply();
  if (!s) return Status(Code::kInternal, "stats: malformed reply");
  // The owner's gauges and counters as it declares them; then this client's own.
  std::map<std::string, uint64_t> m = stat_map(s->values);
  const auto reg = impl_->driver->registry();
  m["generation"] = reg.generation;
  m["active_put_plans"] = reg.put_plans;
  m["active_read_plans"] = reg.read_plans;
  m["active_get_handles"] = reg.handles;
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

Status KvClient::ping() { return impl_->driver->ping(); }

Status KvClient::send_raw_for_test(const std::vector<uint8_t>& bytes) { return impl_->driver->send_raw(bytes); }

Result<std::map<std::string, uint64_t>> KvClient::master_stats() {
  auto r = impl_->driver->request("master_stats", make_envelope(wire::MasterStatsReqT{}));  // the owner forwards it
  if (!r.ok()) return r.status();
  auto* s = (*r)->body.AsMasterStatsReply();
  if (!s) return Status(Code::kInternal, "master_stats: malformed reply");
  return stat_map(s->values);
}

Result<KvClient::KvEventBatch> KvClient::kv_events(const std::string& prefix, uint64_t epoch, uint64_t seq,
                                                   uint32_t max) {
  if (prefix.size() > 65536)
    return invalid_argument("prefix: " + std::to_string(prefix.size()) + " bytes (at most 65536)");
  auto r = impl_->driver->request("kv_events", make_envelope(wire::KvEventsReqT{{}, prefix, epoch, seq, max}));
  if (!r.ok()) return r.status();
  auto* k = (*r)->body.AsKvEventsReply();
  if (!k) return envelope_status(**r);
  KvEventBatch b;
  b.epoch = k->epoch;
  b.next_seq = k->next_seq;
  b.first_seq = k->first_seq;
  b.lost = k->lost;
  b.events.reserve(k->events.size());
  for (const auto& e : k->events) {
    if (!e) return Status(Code::kInternal, "kv_events: malformed reply");
    b.events.push_back(KvEventRecord{e->seq, e->kind == wire::KvEventKind::Stored, e->key, e->node, e->origin_node,
                                     e->origin_generation, e->put_id, e->cause});
  }
  return b;
}

Result<uint64_t> KvClient::master_route_count() {
  auto r = impl_->driver->call_master("master_route_count", make_envelope(wire::MasterStatsReqT{}));
  if (!r.ok()) return r.status();
  auto* s = (*r)->body.AsMasterStatsReply();
  if (!s) return envelope_status(**r);
  return stat_map(s->values)["routes"];
}

}  // namespace fluxon
