// MasterCore's replica tasks (queued by publications, pulled by target-role owners), owner-hot
// write-back and single-copy demotion.
#include "fluxon/core/master_core.hpp"

#include <algorithm>

namespace fluxon {

bool MasterCore::backed_elsewhere(const Route& r, uint32_t source) const {
  for (const auto& rep : r.replicas)
    if (rep.node_id != source && is_replica_target(rep.node_id)) return true;
  return false;
}

Envelope MasterCore::write_back(const wire::WriteBackT& req, Millis now) {
  counters_.writeback_requests_total++;
  wire::WriteBackReplyT rep;
  const OwnerInfo& o = owners_[req.node_id];
  const bool target = target_besides(req.node_id);
  for (const auto& item : req.items) {
    counters_.writeback_keys_total++;
    const Version v{item->origin_node, item->origin_generation, item->origin_put_id};
    auto r = routes_.find(item->key);
    Replica* mine = r == routes_.end() ? nullptr : find_replica(r->second, req.node_id);
    if (req.generation != o.generation || !mine || mine->generation != req.generation || !(r->second.ver == v)) {
      counters_.writeback_obsolete_total++;
      rep.status.push_back(wire::WriteBackStatus::Obsolete);
      continue;
    }
    if (backed_elsewhere(r->second, req.node_id)) {
      writeback_tasks_.erase(item->key);
      counters_.writeback_backed_total++;
      rep.status.push_back(wire::WriteBackStatus::Backed);
      continue;
    }
    if (!target) {
      counters_.writeback_no_target_total++;
      rep.status.push_back(wire::WriteBackStatus::NoTarget);
      continue;
    }
    auto t = writeback_tasks_.find(item->key);
    if (t == writeback_tasks_.end() || !(t->second.first == v) || now >= t->second.second) {
      if (replica_queue_.size() >= kReplicaQueueMax) replica_queue_.pop_front();
      replica_queue_.push_back(ReplicaTask{item->key, v, req.node_id});
      writeback_tasks_[item->key] = {v, now + kWriteBackTaskMs};
      writeback_order_.emplace_back(now + kWriteBackTaskMs, item->key);
      counters_.writeback_tasks_total++;
      counters_.replica_tasks_total++;
    }
    rep.status.push_back(wire::WriteBackStatus::Queued);
  }
  return make_envelope(std::move(rep));
}

Envelope MasterCore::demote(const wire::DemoteT& req) {
  counters_.demote_requests_total++;
  counters_.owner_hot_demotion_attempts++;
  // All or none: every source copy still routed must have a copy of its version on a target-role
  // owner (never the last copy), and one a remote get reads now (activity fence) makes the whole
  // request Busy. A source copy this master demoted already counts as demoted: the same request
  // again after a lost reply (T1), even if the remote copy has gone since.
  wire::DemoteReplyT rep;
  rep.status = wire::DemoteStatus::Demoted;
  const OwnerInfo& o = owners_[req.node_id];
  if (req.demote_id && kept_demotes_.count({req.node_id, req.demote_id})) {  // answered Kept: it stays so
    counters_.demote_kept_total++;
    rep.status = wire::DemoteStatus::Kept;
    return make_envelope(std::move(rep));
  }
  for (const auto& item : req.items) {
    const Version v{item->origin_node, item->origin_generation, item->origin_put_id};
    auto r = routes_.find(item->key);
    Replica* mine = r == routes_.end() || !(r->second.ver == v) ? nullptr : find_replica(r->second, req.node_id);
    if (mine && mine->generation != req.generation) mine = nullptr;
    if (!mine) {
      auto d = demoted_.find({item->key, req.node_id});
      const bool done = d != demoted_.end() && d->second.ver == v && d->second.generation == req.generation;
      if (!done || req.generation != o.generation) {
        rep.status = wire::DemoteStatus::Kept;
        break;
      }
      continue;
    }
    if (req.generation != o.generation || !backed_elsewhere(r->second, req.node_id)) {
      rep.status = wire::DemoteStatus::Kept;
      break;
    }
    if (fenced(item->key, req.node_id)) rep.status = wire::DemoteStatus::Busy;
  }
  if (rep.status == wire::DemoteStatus::Kept) {
    counters_.demote_kept_total++;
    if (req.demote_id) {
      kept_demotes_[{req.node_id, req.demote_id}] = now_ + get_ttl_ms_;
      kept_demote_order_.emplace_back(now_ + get_ttl_ms_, std::make_pair(req.node_id, req.demote_id));
    }
  }
  if (rep.status == wire::DemoteStatus::Busy) counters_.demote_busy_total++;
  if (rep.status != wire::DemoteStatus::Demoted) return make_envelope(std::move(rep));
  counters_.owner_hot_demotion_cohorts++;
  for (const auto& item : req.items) {
    auto r = routes_.find(item->key);
    Replica* mine = r == routes_.end() ? nullptr : find_replica(r->second, req.node_id);
    if (!mine || mine->generation != req.generation) continue;  // demoted by an earlier attempt
    const Millis expires = now_ + kTombstoneMs;
    demoted_[{item->key, req.node_id}] = Demoted{r->second.ver, req.generation, expires};
    demoted_order_.emplace_back(expires, std::make_pair(item->key, req.node_id));
    counters_.owner_hot_demotion_selected_bytes += r->second.len;
    drop_replica(item->key, req.node_id, true);  // the route stays: the target's copy serves it
    counters_.demoted_keys_total++;
    counters_.removed_with_copies_left_total++;
  }
  return make_envelope(std::move(rep));
}

bool MasterCore::target_besides(uint32_t node) const {
  for (const auto& [other, info] : owners_)
    if (other != node && is_replica_target(other)) return true;
  return false;
}

bool MasterCore::is_replica_target(uint32_t node_id) const {
  auto it = owners_.find(node_id);
  if (it == owners_.end()) return false;
  return std::find(replica_roles_.begin(), replica_roles_.end(), it->second.role) != replica_roles_.end();
}

Envelope MasterCore::replica_poll(const wire::ReplicaPollT& req) {
  counters_.replica_polls_total++;
  wire::ReplicaPollReplyT rep;
  const OwnerInfo& o = owners_[req.node_id];
  if (!is_replica_target(req.node_id) || req.generation != o.generation) return make_envelope(std::move(rep));
  LastPoll& last = last_poll_[req.node_id];
  if (req.poll_id != 0 && last.poll_id == req.poll_id && last.generation == req.generation) {
    rep.keys = last.keys;  // T1: the reply was lost; the same tasks again
    return make_envelope(std::move(rep));
  }
  while (!replica_queue_.empty() && rep.keys.size() < req.max) {
    ReplicaTask t = std::move(replica_queue_.front());
    replica_queue_.pop_front();
    auto r = routes_.find(t.key);
    // Obsolete: the version went or changed, or the poller holds a copy already.
    if (r == routes_.end() || !(r->second.ver == t.ver) || find_replica(r->second, req.node_id) ||
        t.source_node == req.node_id) {
      counters_.replica_tasks_obsolete_total++;
      continue;
    }
    rep.keys.push_back(std::move(t.key));
    replica_targets_[req.node_id]++;
    counters_.replica_tasks_assigned_total++;
  }
  last = LastPoll{req.generation, req.poll_id, rep.keys};
  return make_envelope(std::move(rep));
}


}  // namespace fluxon
