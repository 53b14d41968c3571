// ReplicaPlacement: replica tasks (queued by publications, pulled by target-role owners), owner-hot
// write-back requests and unbacked notices.
#include "fluxon/master/replica_placement.hpp"

#include <algorithm>

namespace fluxon {

void ReplicaPlacement::push(Task t) {
  if (queue_.size() >= bounds_.queue) {  // the bound: the oldest task goes, counted
    queue_.pop_front();
    counters.dropped_replica_tasks_total++;
  }
  queue_.push_back(std::move(t));
  counters.replica_tasks_total++;
}

void ReplicaPlacement::add_task(Task t) { push(std::move(t)); }

bool ReplicaPlacement::writeback_pending(const std::string& key, const Version& v, Millis now) const {
  const auto* t = writeback_tasks_.slot(key);
  return t && t->value == v && now < t->expires;
}

void ReplicaPlacement::queue_writeback(const std::string& key, const Version& v, uint32_t source,
                                       const std::string& parent, int32_t depth, Millis now, bool declinable) {
  if (writeback_pending(key, v, now)) return;  // queued once per version until the task had time to finish
  push(Task{key, v, source, parent, depth, declinable});
  writeback_tasks_.set(key, v, now + kWriteBackTaskMs);
  counters.writeback_tasks_total++;
}

Envelope ReplicaPlacement::write_back(const wire::WriteBackT& req, const RouteRegistry& routes, Millis now) {
  counters.writeback_requests_total++;
  wire::WriteBackReplyT rep;
  auto o = routes.owners().find(req.node_id);
  const uint64_t generation = o == routes.owners().end() ? 0 : o->second.generation;
  const bool target = routes.target_besides(req.node_id);
  for (const auto& item : req.items) {
    counters.writeback_keys_total++;
    const Version v{item->origin_node, item->origin_generation, item->origin_put_id};
    const Route* r = routes.route(item->key);
    const Replica* mine = r ? r->find(req.node_id) : nullptr;
    if (req.generation != generation || !mine || mine->generation != req.generation || !(r->ver == v)) {
      counters.writeback_obsolete_total++;
      rep.status.push_back(wire::WriteBackStatus::Obsolete);
      continue;
    }
    if (routes.backed_elsewhere(*r, req.node_id)) {
      writeback_tasks_.erase(item->key);
      counters.writeback_backed_total++;
      rep.status.push_back(wire::WriteBackStatus::Backed);
      continue;
    }
    if (!target) {
      counters.writeback_no_target_total++;
      rep.status.push_back(wire::WriteBackStatus::NoTarget);
      continue;
    }
    if (item->declinable && targets_decline(item->depth, routes)) {
      writeback_tasks_.erase(item->key);
      counters.writeback_declined_total++;
      rep.status.push_back(wire::WriteBackStatus::Declined);
      continue;
    }
    queue_writeback(item->key, v, req.node_id, item->parent, item->depth, now, item->declinable);
    rep.status.push_back(wire::WriteBackStatus::Queued);
  }
  return make_envelope(std::move(rep));
}

bool ReplicaPlacement::targets_decline(int32_t depth, const RouteRegistry& routes) const {
  if (depth < 0) return false;
  bool any = false;
  for (const auto& [node, info] : routes.owners()) {
    if (!routes.is_replica_target(node)) continue;
    auto k = keep_depth_.find(node);
    if (k == keep_depth_.end() || k->second < 0 || depth <= k->second) return false;  // this one keeps it
    any = true;
  }
  return any;
}

Envelope ReplicaPlacement::poll(const wire::ReplicaPollT& req, const RouteRegistry& routes) {
  counters.replica_polls_total++;
  wire::ReplicaPollReplyT rep;
  auto o = routes.owners().find(req.node_id);
  const uint64_t generation = o == routes.owners().end() ? 0 : o->second.generation;
  if (!routes.is_replica_target(req.node_id) || req.generation != generation) return make_envelope(std::move(rep));
  keep_depth_[req.node_id] = req.keep_depth;
  LastPoll& last = last_poll_[req.node_id];
  if (req.poll_id != 0 && last.poll_id == req.poll_id && last.generation == req.generation) {
    rep.keys = last.keys;  // T1: the reply was lost; the same tasks again
    rep.parents = last.parents;
    rep.depths = last.depths;
    return make_envelope(std::move(rep));
  }
  while (!queue_.empty() && rep.keys.size() < req.max) {
    Task t = std::move(queue_.front());
    queue_.pop_front();
    const Route* r = routes.route(t.key);
    // Obsolete: the version went or changed, or the poller holds a copy already.
    if (!r || !(r->ver == t.ver) || r->find(req.node_id) || t.source_node == req.node_id) {
      counters.replica_tasks_obsolete_total++;
      continue;
    }
    if (t.declinable && req.keep_depth >= 0 && t.depth > req.keep_depth) {  // the poller's next victim: not made
      counters.replica_tasks_declined_total++;
      continue;
    }
    rep.keys.push_back(std::move(t.key));
    rep.parents.push_back(std::move(t.parent));
    rep.depths.push_back(t.depth);
    targets_[req.node_id]++;
    counters.replica_tasks_assigned_total++;
  }
  last = LastPoll{req.generation, req.poll_id, rep.keys, rep.parents, rep.depths};
  return make_envelope(std::move(rep));
}

void ReplicaPlacement::note_unbacked(const std::string& key, const Route& r, const RouteRegistry& routes) {
  for (const auto& rep : r.replicas)
    if (routes.is_replica_target(rep.node_id)) return;  // another target copy still backs the sources
  for (const auto& rep : r.replicas) {
    auto& q = unbacked_[rep.node_id];
    if (q.size() >= bounds_.unbacked_per_node) {
      counters.unbacked_dropped_total++;
      continue;
    }
    q.push_back(key);
    counters.unbacked_noted_total++;
  }
}

void ReplicaPlacement::hand_unbacked(uint32_t node, Envelope& reply) {
  auto it = unbacked_.find(node);
  if (it == unbacked_.end()) return;
  auto& q = it->second;
  while (!q.empty() && reply.unbacked.size() < bounds_.unbacked_per_reply) {
    reply.unbacked.push_back(std::move(q.front()));
    q.pop_front();
  }
  if (q.empty()) unbacked_.erase(it);
}

}  // namespace fluxon
