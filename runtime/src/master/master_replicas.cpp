// MasterCore's replica tasks (queued by publications, pulled by target-role owners), owner-hot
// write-back and single-copy demotion.
#include "fluxon/master/master_core.hpp"

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
    if (item->declinable && targets_decline(item->depth)) {
      writeback_tasks_.erase(item->key);
      counters_.writeback_declined_total++;
      rep.status.push_back(wire::WriteBackStatus::Declined);
      continue;
    }
    queue_writeback(item->key, v, req.node_id, item->parent, item->depth, now, item->declinable);
    rep.status.push_back(wire::WriteBackStatus::Queued);
  }
  return make_envelope(std::move(rep));
}

bool MasterCore::targets_decline(int32_t depth) const {
  if (depth < 0) return false;
  bool any = false;
  for (const auto& [node, info] : owners_) {
    if (!is_replica_target(node)) continue;
    auto k = keep_depth_.find(node);
    if (k == keep_depth_.end() || k->second < 0 || depth <= k->second) return false;  // this one keeps it
    any = true;
  }
  return any;
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
  keep_depth_[req.node_id] = req.keep_depth;
  LastPoll& last = last_poll_[req.node_id];
  if (req.poll_id != 0 && last.poll_id == req.poll_id && last.generation == req.generation) {
    rep.keys = last.keys;  // T1: the reply was lost; the same tasks again
    rep.parents = last.parents;
    rep.depths = last.depths;
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
    if (t.declinable && req.keep_depth >= 0 && t.depth > req.keep_depth) {  // the poller's next victim: not made
      counters_.replica_tasks_declined_total++;
      continue;
    }
    rep.keys.push_back(std::move(t.key));
    rep.parents.push_back(std::move(t.parent));
    rep.depths.push_back(t.depth);
    replica_targets_[req.node_id]++;
    counters_.replica_tasks_assigned_total++;
  }
  last = LastPoll{req.generation, req.poll_id, rep.keys, rep.parents, rep.depths};
  return make_envelope(std::move(rep));
}


}  // namespace fluxon
