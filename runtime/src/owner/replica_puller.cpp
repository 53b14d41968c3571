#include "fluxon/owner/replica_puller.hpp"

#include <algorithm>

namespace fluxon {

void ReplicaPuller::poll(Millis now, Outbox& out, const std::function<bool(const std::string&)>& putting) {
  if (!s_.replica_target || s_.alone()) return;  // not a target role, or alone
  const size_t limit = s_.cfg.replica_task_max_inflight;
  std::vector<Task> due;
  for (auto it = retry_.begin(); it != retry_.end() && flights_.size() + due.size() < limit;) {
    if (it->first > now) {
      ++it;
      continue;
    }
    due.push_back(std::move(it->second));
    it = retry_.erase(it);
  }
  if (!due.empty()) start(std::move(due), now, out, putting);
  if (poll_id_ != 0) {  // unanswered: the same poll again, the master answers it the same way
    if (now - poll_sent_ >= Millis(s_.cfg.publish_retry_ms)) send_poll(now, out);
    return;
  }
  if (now < next_poll_ || flights_.size() >= limit) return;
  poll_id_ = s_.new_unique();
  poll_max_ = uint32_t(limit - flights_.size());
  next_poll_ = now + kIdlePollMs;
  send_poll(now, out);
}

void ReplicaPuller::send_poll(Millis now, Outbox& out) {
  wire::ReplicaPollT p;
  p.node_id = s_.cfg.node_id;
  p.generation = s_.generation;
  p.max = poll_max_;
  p.poll_id = poll_id_;
  p.keep_depth = keep_depth();
  const uint64_t tok = s_.new_token(JobKind::kReplicaPoll);
  poll_tokens_.push_back(tok);
  poll_sent_ = now;
  s_.to_master(tok, make_envelope(std::move(p)), out);
}

int32_t ReplicaPuller::keep_depth() const {
  const DepthOrder* order = s_.local.depth_order();
  if (!order || s_.pool.can_carve()) return -1;
  bool pressed = false;  // a class near the free watermark: what comes in pushes something out
  for (const auto& [size, slots] : s_.pool.class_slots())
    pressed = pressed ||
              slots.first <= std::max<uint64_t>(1, uint64_t(2 * s_.cfg.eviction_free_watermark * double(slots.second)));
  const auto cut = pressed ? order->keep_cut() : std::nullopt;
  return cut && *cut != DepthOrder::kUnknown ? int32_t(std::min<uint32_t>(*cut, INT32_MAX)) : -1;
}

bool ReplicaPuller::owns(uint64_t token) const {
  return std::find(poll_tokens_.begin(), poll_tokens_.end(), token) != poll_tokens_.end();
}

bool ReplicaPuller::on_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out,
                             const std::function<bool(const std::string&)>& putting) {
  // Only the poll in flight counts; a late duplicate of a settled poll is dropped.
  if (!owns(token)) return false;
  auto* rp = reply.body.AsReplicaPollReply();
  if (!rp) return false;
  poll_tokens_.clear();
  poll_id_ = 0;
  if (rp->keys.empty()) return true;
  next_poll_ = now;  // there may be more: ask again at the next tick
  s_.counters.replica_tasks_received_total += rp->keys.size();
  std::vector<Task> tasks;
  tasks.reserve(rp->keys.size());
  for (size_t i = 0; i < rp->keys.size(); ++i)
    tasks.push_back(Task{std::move(rp->keys[i]), i < rp->parents.size() ? std::move(rp->parents[i]) : std::string(),
                         from_wire_depth(i < rp->depths.size() ? rp->depths[i] : -1)});
  start(std::move(tasks), now, out, putting);
  return true;
}

void ReplicaPuller::start(std::vector<Task> tasks, Millis now, Outbox& out,
                          const std::function<bool(const std::string&)>& putting) {
  std::vector<std::string> fetch, parents;
  std::vector<uint32_t> depths;
  for (auto& t : tasks) {
    if (s_.local.contains(t.key) || gets_.fetching(t.key) || putting(t.key)) {
      s_.counters.replica_tasks_skipped_total++;  // here already, or on its way
      continue;
    }
    fetch.push_back(std::move(t.key));
    parents.push_back(std::move(t.parent));
    depths.push_back(t.depth);
  }
  // The flights hold their interest for the task until they are terminal (settle drops it).
  const auto ids = gets_.start_held(fetch, parents, depths, now, out);
  for (size_t i = 0; i < ids.size(); ++i)
    flights_.emplace(ids[i], Task{std::move(fetch[i]), std::move(parents[i]), depths[i]});
}

void ReplicaPuller::settle(Millis now, Outbox& out) {
  std::vector<uint64_t> done;
  for (const auto& [fid, key] : flights_) {
    const auto p = gets_.phase(fid);
    if (p == GetFlights::Phase::kReady || p == GetFlights::Phase::kFailed) done.push_back(fid);
  }
  for (uint64_t fid : done) {
    auto rf = flights_.find(fid);
    Task task = std::move(rf->second);
    const std::string& key = task.key;
    flights_.erase(rf);
    if (gets_.phase(fid) == GetFlights::Phase::kReady) {
      s_.counters.replica_done_total++;
      attempts_.erase(key);
    } else if (const uint32_t n = ++attempts_[key]; n < kAttempts && retry_.size() < s_.cfg.limits.replica_retries) {
      s_.counters.replica_retries_total++;  // 0.5 s, then 1 s later
      retry_.emplace_back(now + 500 * Millis(n), std::move(task));
    } else {
      if (n < kAttempts) s_.counters.replica_retries_full_total++;
      s_.counters.replica_failed_total++;
      attempts_.erase(key);
    }
    gets_.drop_interest(fid, now, out);
  }
}

}  // namespace fluxon
