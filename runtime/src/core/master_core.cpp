#include "fluxon/core/master_core.hpp"

#include "fluxon/core/stat_values.hpp"

#include <algorithm>

namespace fluxon {

namespace {
Version item_version(uint32_t origin_node, uint64_t origin_generation, uint64_t origin_put_id, uint32_t node,
                     uint64_t generation, uint64_t put_id) {
  if (origin_node == 0) return Version{node, generation, put_id};
  return Version{origin_node, origin_generation, origin_put_id};
}
}  // namespace

uint64_t MasterCore::route_put_id(const std::string& key) const {
  auto it = routes_.find(key);
  return it == routes_.end() ? 0 : it->second.ver.put_id;
}

std::vector<uint32_t> MasterCore::replica_nodes(const std::string& key) const {
  std::vector<uint32_t> out;
  auto it = routes_.find(key);
  if (it != routes_.end())
    for (const auto& r : it->second.replicas) out.push_back(r.node_id);
  return out;
}

MasterCore::Replica* MasterCore::find_replica(Route& r, uint32_t node_id) {
  for (auto& rep : r.replicas)
    if (rep.node_id == node_id) return &rep;
  return nullptr;
}

bool MasterCore::drop_replica(const std::string& key, uint32_t node_id, bool tombstone) {
  auto it = routes_.find(key);
  if (it == routes_.end()) return false;
  auto& reps = it->second.replicas;
  size_t at = 0;
  while (at < reps.size() && reps[at].node_id != node_id) ++at;
  if (at == reps.size()) return false;
  if (tombstone) {
    tombstones_[key] = Removed{it->second.ver, reps[at].node_id, reps[at].generation, now_ + kTombstoneMs};
    tombstone_order_.emplace_back(now_ + kTombstoneMs, key);
  }
  reps.erase_at(at);
  replicas_--;
  counters_.replicas_removed_total++;
  if (reps.empty()) {
    routes_.erase(it);
    counters_.routes_removed_total++;
  }
  return true;
}

bool MasterCore::fenced(const std::string& key, uint32_t node_id) const {
  // Conservative: any get reading this node's copy of key holds it, whatever version it reads.
  return reads_.count({key, node_id}) != 0;
}

void MasterCore::end_get(std::map<GetKey, GetFlight>::iterator it) {
  auto f = reads_.find({it->first.first, it->second.source_node});
  if (f != reads_.end() && --f->second == 0) reads_.erase(f);
  note_ended(it->first, it->second.get_id);
  gets_.erase(it);
}

void MasterCore::note_ended(const GetKey& gk, uint64_t get_id) {
  EndedGet& e = ended_gets_[gk];
  e.get_id = std::max(e.get_id, get_id);
  e.expires = now_ + get_ttl_ms_;
  ended_order_.emplace_back(e.expires, gk);
}

uint64_t MasterCore::admit_generation(uint32_t node_id, uint64_t generation) {
  OwnerInfo& o = owners_[node_id];
  if (generation <= o.generation && o.generation != 0) return 0;
  uint64_t dropped = 0;
  if (o.generation != 0) {
    // A restarted owner is rare; a scan of the table then saves a per-node key index (a second
    // copy of every key) on every publication.
    std::vector<std::string> keys;
    for (const auto& [k, r] : routes_)
      for (const auto& rep : r.replicas)
        if (rep.node_id == node_id) keys.emplace_back(k);
    for (const auto& k : keys) dropped += drop_replica(k, node_id, false) ? 1 : 0;
    // Its prepared gets died with its memory; gets it was the source of fail at transfer time and
    // are revoked by their requesters.
    for (auto it = gets_.begin(); it != gets_.end();) {
      auto next = std::next(it);
      if (it->first.second == node_id) end_get(it);
      it = next;
    }
    // The new generation numbers its gets from the start again.
    std::erase_if(ended_gets_, [node_id](const auto& e) { return e.first.second == node_id; });
  }
  o.generation = generation;
  counters_.owners_registered_total++;
  return dropped;
}

void MasterCore::tick(Millis now) {
  now_ = now;
  while (!ended_order_.empty() && ended_order_.front().first <= now) {
    auto e = ended_gets_.find(ended_order_.front().second);
    if (e != ended_gets_.end() && e->second.expires == ended_order_.front().first) ended_gets_.erase(e);
    ended_order_.pop_front();
  }
  while (!tombstone_order_.empty() && tombstone_order_.front().first <= now) {
    auto t = tombstones_.find(tombstone_order_.front().second);
    // Only the tombstone this entry was queued for: a newer one of the key keeps its own expiry.
    if (t != tombstones_.end() && t->second.expires == tombstone_order_.front().first) tombstones_.erase(t);
    tombstone_order_.pop_front();
  }
  while (!demoted_order_.empty() && demoted_order_.front().first <= now) {
    auto d = demoted_.find(demoted_order_.front().second);
    if (d != demoted_.end() && d->second.expires <= now) demoted_.erase(d);
    demoted_order_.pop_front();
  }
  while (!writeback_order_.empty() && writeback_order_.front().first <= now) {
    auto t = writeback_tasks_.find(writeback_order_.front().second);
    if (t != writeback_tasks_.end() && t->second.second <= now) writeback_tasks_.erase(t);
    writeback_order_.pop_front();
  }
  for (auto it = gets_.begin(); it != gets_.end();) {
    auto next = std::next(it);
    if (now >= it->second.deadline) {
      counters_.get_ttl_expired_total++;
      end_get(it);
    }
    it = next;
  }
}

Envelope MasterCore::put_done(const wire::PutDoneT& pd) {
  counters_.put_done_total++;
  OwnerInfo& o = owners_[pd.node_id];
  if (pd.generation > o.generation) admit_generation(pd.node_id, pd.generation);
  wire::PutDoneReplyT rep;
  rep.put_id = pd.put_id;
  rep.results.reserve(pd.items.size());
  bool duplicate = false;
  for (const auto& item : pd.items) {
    if (pd.generation < o.generation) {
      rep.results.push_back(wire::PutItemResult::StaleGeneration);
      counters_.put_done_stale_total++;
      continue;
    }
    const Version v = item_version(item->origin_node, item->origin_generation, item->origin_put_id, pd.node_id,
                                   pd.generation, pd.put_id);
    auto it = routes_.find(item->key);
    if (it != routes_.end()) {
      Route& r = it->second;
      if (r.ver == v) {
        if (Replica* rep_on = find_replica(r, pd.node_id)) {
          const bool same = rep_on->generation == pd.generation && rep_on->offset == item->offset;
          rep.results.push_back(same ? wire::PutItemResult::Live : wire::PutItemResult::Exists);
          if (same) duplicate = true;  // T1: the same identity again
          else counters_.put_done_exists_total++;
          continue;
        }
        // Another replica of the same version (a resync after a master restart).
        r.replicas.push_back(Replica{pd.node_id, pd.generation, item->offset, pd.put_id});
        replicas_++;
        counters_.replicas_published_total++;
        rep.results.push_back(wire::PutItemResult::Live);
        continue;
      }
      // A newer local version replaces the owner's own route when nobody else holds a copy (T2).
      const bool only_own = r.replicas.size() == 1 && r.replicas[0].node_id == pd.node_id &&
                            r.replicas[0].generation == pd.generation;
      const bool own_versions = v.origin_node == pd.node_id && v.origin_generation == pd.generation &&
                                r.ver.origin_node == pd.node_id && r.ver.origin_generation == pd.generation;
      if (only_own && own_versions && v.put_id > r.ver.put_id) {
        r.ver = v;
        r.len = item->len;
        r.replicas[0].offset = item->offset;
        r.replicas[0].instance = pd.put_id;
        rep.results.push_back(wire::PutItemResult::Live);
        counters_.routes_published_total++;
        continue;
      }
      rep.results.push_back(wire::PutItemResult::Exists);  // stale, or another version holds the key
      counters_.put_done_exists_total++;
      continue;
    }
    auto tomb = tombstones_.find(item->key);
    if (tomb != tombstones_.end() && tomb->second.node_id == pd.node_id &&
        tomb->second.generation == pd.generation && tomb->second.ver.origin_node == v.origin_node &&
        tomb->second.ver.origin_generation == v.origin_generation && v.put_id <= tomb->second.ver.put_id) {
      rep.results.push_back(wire::PutItemResult::Exists);  // a removed version stays removed
      counters_.put_done_exists_total++;
      continue;
    }
    if (tomb != tombstones_.end()) tombstones_.erase(tomb);
    Route route{v, item->len, {}};
    route.replicas.push_back(Replica{pd.node_id, pd.generation, item->offset, pd.put_id});
    routes_.emplace(item->key, std::move(route));
    replicas_++;
    rep.results.push_back(wire::PutItemResult::Live);
    counters_.routes_published_total++;
    counters_.replicas_published_total++;
    if (item->replica) {  // a replica task for a target-role owner to pull (placement: replica_poll)
      if (!target_besides(pd.node_id)) {
        counters_.replica_tasks_no_target_total++;  // strict roles: no fallback to other owners
      } else {
        if (replica_queue_.size() >= kReplicaQueueMax) replica_queue_.pop_front();
        replica_queue_.push_back(ReplicaTask{item->key, v, pd.node_id});
        counters_.replica_tasks_total++;
      }
    }
  }
  if (duplicate) counters_.put_done_duplicate_total++;
  return make_envelope(std::move(rep));
}

Envelope MasterCore::get_start(const wire::BatchGetStartT& req, Millis now) {
  counters_.get_start_total++;
  counters_.get_start_keys_total += req.items.size();
  OwnerInfo& o = owners_[req.node_id];
  if (req.generation > o.generation) admit_generation(req.node_id, req.generation);
  wire::BatchGetStartReplyT rep;
  for (const auto& item : req.items) {
    auto s = std::make_unique<wire::GetSourceT>();
    s->get_id = item->get_id;
    auto fill = [&](const Route& r, const Replica& src) {
      s->status = wire::GetStartStatus::Started;
      s->source_node = src.node_id;
      s->source_generation = src.generation;
      s->offset = src.offset;
      s->len = r.len;
      s->origin_node = r.ver.origin_node;
      s->origin_generation = r.ver.origin_generation;
      s->origin_put_id = r.ver.put_id;
      const OwnerInfo& so = owners_[src.node_id];
      s->data_host = so.data_host;
      s->data_port = so.data_port;
    };
    if (req.generation < o.generation) {
      s->status = wire::GetStartStatus::StaleGeneration;
      rep.items.push_back(std::move(s));
      continue;
    }
    const GetKey gk{item->key, req.node_id};
    // Decides this item: Started (a prepared get, kept until it ends), or not — and a get id
    // answered "not started" is ended for good: a late duplicate of it never starts (T1).
    [&] {
      auto route = routes_.find(item->key);
      auto g = gets_.find(gk);
      if (g != gets_.end() && g->second.get_id == item->get_id) {
        Replica* src = route == routes_.end() ? nullptr : find_replica(route->second, g->second.source_node);
        if (src && route->second.ver == g->second.ver) return fill(route->second, *src);  // T1: the same answer
        end_get(g);  // its source is gone: a miss now
        s->status = wire::GetStartStatus::Miss;
        counters_.get_miss_total++;
        return;
      }
      if (auto e = ended_gets_.find(gk); e != ended_gets_.end() && item->get_id <= e->second.get_id) {
        s->status = wire::GetStartStatus::Miss;  // T1: a late duplicate of a get that ended
        counters_.get_start_stale_total++;
        return;
      }
      if (g != gets_.end()) {
        s->status = wire::GetStartStatus::Busy;  // G6: one prepared get per (key, requester)
        counters_.get_busy_total++;
        return;
      }
      if (route == routes_.end()) {
        s->status = wire::GetStartStatus::Miss;
        counters_.get_miss_total++;
        return;
      }
      Route& r = route->second;
      if (Replica* mine = find_replica(r, req.node_id); mine && mine->generation == req.generation) {
        s->status = wire::GetStartStatus::AlreadyLocal;
        return;
      }
      // The source: the replica with the fewest reads in flight.
      const Replica* best = nullptr;
      uint32_t best_reads = 0;
      for (const auto& x : r.replicas) {
        if (x.node_id == req.node_id) continue;
        auto f = reads_.find({item->key, x.node_id});
        const uint32_t n = f == reads_.end() ? 0 : f->second;
        if (!best || n < best_reads) best = &x, best_reads = n;
      }
      if (!best) {
        s->status = wire::GetStartStatus::Miss;
        counters_.get_miss_total++;
        return;
      }
      gets_.emplace(gk, GetFlight{item->get_id, req.generation, best->node_id, r.ver, now + get_ttl_ms_});
      reads_[{item->key, best->node_id}]++;
      counters_.get_started_total++;
      fill(r, *best);
    }();
    if (s->status != wire::GetStartStatus::Started) note_ended(gk, item->get_id);
    rep.items.push_back(std::move(s));
  }
  return make_envelope(std::move(rep));
}

Envelope MasterCore::get_done(const wire::BatchGetDoneT& req) {
  const OwnerInfo& o = owners_[req.node_id];
  wire::BatchGetDoneReplyT rep;
  for (const auto& item : req.items) {
    auto g = gets_.find({item->key, req.node_id});
    auto route = routes_.find(item->key);
    if (g != gets_.end() && g->second.get_id == item->get_id) {
      const Version ver = g->second.ver;
      const uint64_t gen = g->second.requester_generation;
      end_get(g);
      counters_.get_done_total++;
      if (route == routes_.end() || !(route->second.ver == ver) || gen != req.generation ||
          req.generation < o.generation) {
        counters_.get_done_stale_total++;
        rep.results.push_back(wire::GetDoneStatus::Stale);  // the version went: the copy is not published
        continue;
      }
      if (Replica* mine = find_replica(route->second, req.node_id)) {
        // T2: a copy of this version is live on the requester already; the loser frees its slot.
        const bool same = mine->generation == req.generation && mine->offset == item->offset;
        if (!same) counters_.get_done_stale_total++;
        rep.results.push_back(same ? wire::GetDoneStatus::Live : wire::GetDoneStatus::Stale);
        continue;
      }
      route->second.replicas.push_back(Replica{req.node_id, req.generation, item->offset, item->instance});
      replicas_++;
      counters_.replicas_published_total++;
      rep.results.push_back(wire::GetDoneStatus::Live);
      continue;
    }
    // Not inflight: a re-sent Done that already settled (T1) is Live; anything else is stale.
    bool live = false;
    if (route != routes_.end())
      if (Replica* mine = find_replica(route->second, req.node_id))
        live = mine->generation == req.generation && mine->offset == item->offset;
    if (!live) counters_.get_done_stale_total++;
    rep.results.push_back(live ? wire::GetDoneStatus::Live : wire::GetDoneStatus::Stale);
  }
  return make_envelope(std::move(rep));
}

Envelope MasterCore::get_revoke(const wire::BatchGetRevokeT& req) {
  wire::BatchGetRevokeReplyT rep;
  for (const auto& item : req.items) {
    auto g = gets_.find({item->key, req.node_id});
    const bool known = g != gets_.end() && g->second.get_id == item->get_id;
    if (known) {
      end_get(g);
      counters_.get_revoked_total++;
    }
    rep.known.push_back(known);
  }
  return make_envelope(std::move(rep));
}

Envelope MasterCore::remove_routes(const wire::RemoveRoutesT& rr) {
  wire::RemoveRoutesReplyT rep;
  for (const auto& item : rr.items) {
    const Version v = item_version(item->origin_node, item->origin_generation, item->put_id, item->node_id,
                                   item->generation, item->put_id);
    auto it = routes_.find(item->key);
    // Only the exact replica of the exact version goes: never a newer one (identity beats flags).
    bool match = false;
    if (it != routes_.end() && it->second.ver == v)
      if (Replica* r = find_replica(it->second, item->node_id))
        match = r->generation == item->generation && (item->instance == 0 || r->instance == item->instance);
    if (fenced(item->key, item->node_id)) {
      counters_.remove_busy_total++;
      rep.removed.push_back(false);
      rep.busy.push_back(true);
      continue;
    }
    if (match) {
      drop_replica(item->key, item->node_id, true);
      (routes_.count(item->key) ? counters_.removed_with_copies_left_total : counters_.removed_last_copy_total)++;
    }
    rep.removed.push_back(match);
    rep.busy.push_back(false);
  }
  return make_envelope(std::move(rep));
}

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
  if (rep.status == wire::DemoteStatus::Kept) counters_.demote_kept_total++;
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

Envelope MasterCore::handle(const Envelope& req, Millis now) {
  now_ = std::max(now_, now);
  if (auto* r = req.body.AsRegisterOwner()) {
    if (r->generation < owners_[r->node_id].generation) {
      // An older generation re-registering late is refused; a newer one takes over.
      counters_.errors_total++;
      return error_envelope(Status(Code::kGenerationMismatch, "node " + std::to_string(r->node_id) +
                                                                  " generation " + std::to_string(r->generation) +
                                                                  " is older than the registered one"));
    }
    wire::RegisterOwnerReplyT rep;
    rep.routes_dropped = admit_generation(r->node_id, r->generation);
    OwnerInfo& o = owners_[r->node_id];
    o.role = r->role;
    o.segment_len = r->segment_len;
    o.data_host = r->data_host;
    o.data_port = r->data_port;
    rep.replica_target = is_replica_target(r->node_id);
    return make_envelope(std::move(rep));
  }
  if (auto* pd = req.body.AsPutDone()) return put_done(*pd);
  if (auto* gs = req.body.AsBatchGetStart()) return get_start(*gs, now);
  if (auto* gd = req.body.AsBatchGetDone()) return get_done(*gd);
  if (auto* gr = req.body.AsBatchGetRevoke()) return get_revoke(*gr);
  if (auto* rr = req.body.AsRemoveRoutes()) return remove_routes(*rr);
  if (auto* rp = req.body.AsReplicaPoll()) return replica_poll(*rp);
  if (auto* lk = req.body.AsLookup()) {
    counters_.lookups_total++;
    counters_.lookup_keys_total += lk->keys.size();
    wire::LookupReplyT rep;
    for (const auto& k : lk->keys) {
      auto info = std::make_unique<wire::RouteInfoT>();
      auto it = routes_.find(k);
      if (it != routes_.end()) {
        counters_.lookup_hits_total++;
        const Route& r = it->second;
        info->found = true;
        info->node_id = r.replicas[0].node_id;
        info->generation = r.replicas[0].generation;
        info->put_id = r.ver.put_id;
        info->offset = r.replicas[0].offset;
        info->len = r.len;
        info->replicas = uint32_t(r.replicas.size());
        info->origin_node = r.ver.origin_node;
      }
      rep.routes.push_back(std::move(info));
    }
    return make_envelope(std::move(rep));
  }
  if (req.body.AsMasterStatsReq()) {
    wire::MasterStatsReplyT rep;
    rep.values = stat_values(stats(), counters_);
    return make_envelope(std::move(rep));
  }
  if (auto* w = req.body.AsWriteBack()) return write_back(*w, now_);
  if (auto* d = req.body.AsDemote()) return demote(*d);
  if (auto* p = req.body.AsPing()) return make_envelope(wire::PongT{{}, p->seq});
  counters_.errors_total++;
  counters_.malformed_total++;
  return error_envelope(Status(Code::kMalformedMessage, std::string("master: unexpected message ") + body_name(req)));
}

}  // namespace fluxon

namespace fluxon {

MasterStats MasterCore::stats() const {
  MasterStats s;
  s.routes = routes_.size();
  s.owners = owners_.size();
  s.replicas = replicas_;
  s.inflight_gets = gets_.size();
  s.replica_tasks_queued = replica_queue_.size();
  return s;
}

}  // namespace fluxon
