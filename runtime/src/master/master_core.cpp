// MasterCore: registration, routes (publication, removal) and the dispatch of every request.
// Remote gets are in master_gets.cpp, replica tasks, write-back and demotion in master_replicas.cpp.
#include "fluxon/master/master_core.hpp"

#include <cstring>

#include <algorithm>

#include "fluxon/core/stat_values.hpp"

namespace fluxon {

Version MasterCore::item_version(uint32_t origin_node, uint64_t origin_generation, uint64_t origin_put_id, uint32_t node,
                                 uint64_t generation, uint64_t put_id) {
  if (origin_node == 0) return Version{node, generation, put_id};
  return Version{origin_node, origin_generation, origin_put_id};
}

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

bool MasterCore::drop_replica(const std::string& key, uint32_t node_id, bool tombstone, const char* cause) {
  auto it = routes_.find(key);
  if (it == routes_.end()) return false;
  auto& reps = it->second.replicas;
  size_t at = 0;
  while (at < reps.size() && reps[at].node_id != node_id) ++at;
  if (at == reps.size()) return false;
  if (tombstone) entomb(key, node_id, it->second.ver, reps[at].generation);
  events_.removed(key, node_id, it->second.ver, cause);
  count_cohort(node_id, reps[at], -1);
  if (!tiers_.empty()) tier_leave(node_id, key);
  reps.erase_at(at);
  replicas_--;
  counters_.replicas_removed_total++;
  if (reps.empty()) {
    routes_.erase(it);
    counters_.routes_removed_total++;
  } else if (is_replica_target(node_id)) {
    note_unbacked(key, it->second);
  }
  return true;
}

void MasterCore::note_unbacked(const std::string& key, const Route& r) {
  for (const auto& rep : r.replicas)
    if (is_replica_target(rep.node_id)) return;  // another target copy still backs the sources
  for (const auto& rep : r.replicas) {
    auto& q = unbacked_[rep.node_id];
    if (q.size() >= kUnbackedPerNode) {
      counters_.unbacked_dropped_total++;
      continue;
    }
    q.push_back(key);
    counters_.unbacked_noted_total++;
  }
}

void MasterCore::hand_unbacked(uint32_t node, Envelope& reply) {
  auto it = unbacked_.find(node);
  if (it == unbacked_.end()) return;
  auto& q = it->second;
  while (!q.empty() && reply.unbacked.size() < kUnbackedPerReply) {
    reply.unbacked.push_back(std::move(q.front()));
    q.pop_front();
  }
  if (q.empty()) unbacked_.erase(it);
}

namespace {
// A 64-bit hash of bytes, 8 at a time through a 128-bit multiply; seeds give independent hashes.
uint64_t mix_hash(std::string_view s, uint64_t seed) {
  auto mul = [](uint64_t a, uint64_t b) {
    const unsigned __int128 r = (unsigned __int128)a * b;
    return uint64_t(r) ^ uint64_t(r >> 64);
  };
  uint64_t h = seed ^ (s.size() * 0x9e3779b97f4a7c15ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = mul(h ^ w, 0xbf58476d1ce4e5b9ull);
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  return mul(h ^ w ^ 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull);
}
}  // namespace

MasterCore::TombKey MasterCore::tomb_key(std::string_view key, uint32_t node) {
  return TombKey{mix_hash(key, 0x8a5cd789635d2dffull), mix_hash(key, 0x3c6ef372fe94f82bull), node};
}

void MasterCore::entomb(const std::string& key, uint32_t node, const Version& ver, uint64_t generation) {
  const TombKey tk = tomb_key(key, node);
  // A newer tombstone of the same writer stays (it covers this version too), with a new expiry.
  const Removed* t = tombstones_.find(tk);
  const bool older = t && t->generation == generation && t->ver.origin_node == ver.origin_node &&
                     t->ver.origin_generation == ver.origin_generation && ver.put_id < t->ver.put_id;
  if (older) tombstones_.renew(tk, now_ + kTombstoneMs);
  else tombstones_.set(tk, Removed{ver, generation}, now_ + kTombstoneMs);
  if (ver.origin_node == node) {
    OwnEntombed& hi = own_entombed_[node];
    if (generation > hi.generation) hi = OwnEntombed{generation, ver.put_id};
    else if (generation == hi.generation) hi.put_id = std::max(hi.put_id, ver.put_id);
  }
}

bool MasterCore::tomb_possible(uint32_t node, uint64_t generation, uint64_t put_id) const {
  if (tombstones_.empty()) return false;
  auto it = own_entombed_.find(node);
  if (it == own_entombed_.end()) return false;
  // A tombstone covers only its own generation and put_ids up to its own; every one of this node's
  // generation is at most hi.put_id (older generations' never match a current item).
  if (generation != it->second.generation) return generation < it->second.generation;
  return put_id <= it->second.put_id;
}

bool MasterCore::Removed::covers(uint64_t gen, const Version& v) const {
  return generation == gen && ver.origin_node == v.origin_node && ver.origin_generation == v.origin_generation &&
         v.put_id <= ver.put_id;
}

bool MasterCore::entombed(const std::string& key, uint32_t node, uint64_t generation, const Version& v) const {
  if (tombstones_.empty()) return false;
  const Removed* t = tombstones_.find(tomb_key(key, node));
  return t && t->covers(generation, v);
}

void MasterCore::count_cohort(uint32_t node, const Replica& rep, int delta) {
  const CohortKey k{node, rep.generation, rep.instance, rep.group};
  if (delta > 0) ++*cohorts_.try_emplace(k, 0).first;
  else if (uint32_t* n = cohorts_.find(k); n && --*n == 0) cohorts_.erase(k);
}

void MasterCore::add_replica(const std::string& key, Route& r, Replica rep) {
  count_cohort(rep.node_id, rep, +1);
  events_.stored(key, rep.node_id, r.ver);
  r.replicas.push_back(rep);
  replicas_++;
  counters_.replicas_published_total++;
  if (!tiers_.empty()) tier_enter(rep.node_id, key, r.ver, rep.slot_size ? rep.slot_size : r.len);
}

uint64_t MasterCore::admit_generation(uint32_t node_id, uint64_t generation) {
  OwnerInfo& o = owners_[node_id];
  if (generation <= o.generation && o.generation != 0) return 0;
  unbacked_.erase(node_id);    // notices about the copies of its old generation
  keep_depth_.erase(node_id);  // what its old generation kept: it says again on its first poll
  uint64_t dropped = 0;
  if (o.generation != 0) {
    // A restarted owner is rare; a scan of the table then saves a per-node key index (a second
    // copy of every key) on every publication.
    std::vector<std::string> keys;
    for (const auto& [k, r] : routes_)
      for (const auto& rep : r.replicas)
        if (rep.node_id == node_id) keys.emplace_back(k);
    for (const auto& k : keys) dropped += drop_replica(k, node_id, false, "owner_restarted") ? 1 : 0;
    // Its prepared gets died with its memory; gets it was the source of fail at transfer time and
    // are revoked by their requesters.
    for (auto it = gets_.begin(); it != gets_.end();) {
      auto next = std::next(it);
      if (it->first.second == node_id) end_get(it);
      it = next;
    }
    // The new generation numbers its gets from the start again.
    ended_gets_.erase_if([node_id](const GetKey& k, uint64_t) { return k.second == node_id; });
    // Its reclaims died with its memory (their replicas went above): their fences go too.
    std::vector<uint64_t> epochs;
    for (const auto& [id, txn] : reclaims_)
      if (id.first == node_id) epochs.push_back(id.second);
    for (uint64_t e : epochs) end_reclaim(node_id, e, wire::ReclaimResult::Aborted);
    // The new generation numbers its epochs from the start again.
    ended_reclaims_.erase_if([node_id](const ReclaimId& id, const EndedReclaim&) { return id.first == node_id; });
  }
  o.generation = generation;
  counters_.owners_registered_total++;
  return dropped;
}

void MasterCore::tick(Millis now) {
  now_ = now;
  if (!tiers_.empty()) tiers_tick(now);
  ended_gets_.expire(now);
  tombstones_.expire(now);
  ended_reclaims_.expire(now);
  writeback_tasks_.expire(now);
  for (auto it = gets_.begin(); it != gets_.end();) {
    auto next = std::next(it);
    if (now >= it->second.deadline) {
      counters_.get_ttl_expired_total++;
      end_get(it);
    }
    it = next;
  }
}

template <class KeyAt>
void MasterCore::prepare_probes(size_t n, KeyAt key_at) {
  if (probes_.size() < n) probes_.resize(n);
  for (size_t i = 0; i < n; ++i) routes_.prepare(key_at(i), probes_[i]);
  for (size_t i = 0; i < n; ++i) routes_.prefetch(probes_[i]);
}

Envelope MasterCore::put_done(const wire::PutDoneT& pd) {
  counters_.put_done_total++;
  OwnerInfo& o = owners_[pd.node_id];
  if (pd.generation > o.generation) admit_generation(pd.node_id, pd.generation);
  // A put takes its activity lease and gives it back within this step; a key a reclaim fences on
  // this node takes none: the whole request is refused (nothing applied) and its publish job asks
  // again with the same identity once the reclaim ended (the design's put lease).
  if (pd.generation >= o.generation)
    for (const auto& item : pd.items)
      if (reclaim_fenced(item->key, pd.node_id)) {
        counters_.reclaim_refused_puts_total++;
        return error_envelope(Status(Code::kKeyConflict, "key '" + item->key + "' is being reclaimed on node " +
                                                             std::to_string(pd.node_id) + ": PutDone refused for now"));
      }
  wire::PutDoneReplyT rep;
  rep.put_id = pd.put_id;
  rep.results.reserve(pd.items.size());
  bool duplicate = false;
  prepare_probes(pd.items.size(), [&](size_t i) -> std::string_view { return pd.items[i]->key; });
  // A new key looks for its tombstone, unless none can cover it (its own newer version).
  const bool own_tombs = tomb_possible(pd.node_id, pd.generation, pd.put_id);
  auto may_be_entombed = [&](const wire::RouteItemT& item) {
    return item.origin_node ? !tombstones_.empty() : own_tombs;
  };
  for (const auto& item : pd.items)
    if (may_be_entombed(*item)) tombstones_.map().prefetch(tomb_key(item->key, pd.node_id));
  for (size_t i = 0; i < pd.items.size(); ++i) {
    const auto& item = pd.items[i];
    if (pd.generation < o.generation) {
      rep.results.push_back(wire::PutItemResult::StaleGeneration);
      counters_.put_done_stale_total++;
      continue;
    }
    const Version v = item_version(item->origin_node, item->origin_generation, item->origin_put_id, pd.node_id,
                                   pd.generation, pd.put_id);
    auto it = routes_.find(probes_[i]);
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
        if (entombed(item->key, pd.node_id, pd.generation, v)) {
          rep.results.push_back(wire::PutItemResult::Exists);  // this node's copy was removed: it stays so
          counters_.put_done_exists_total++;
          continue;
        }
        // Another replica of the same version (a resync after a master restart).
        add_replica(item->key, r, Replica{pd.node_id, item->group, pd.generation, item->offset, pd.put_id,
                                          item->slot_size});
        rep.results.push_back(wire::PutItemResult::Live);
        continue;
      }
      // A newer local version replaces the owner's own route when nobody else holds a copy (T2).
      const bool only_own = r.replicas.size() == 1 && r.replicas[0].node_id == pd.node_id &&
                            r.replicas[0].generation == pd.generation;
      const bool own_versions = v.origin_node == pd.node_id && v.origin_generation == pd.generation &&
                                r.ver.origin_node == pd.node_id && r.ver.origin_generation == pd.generation;
      if (only_own && own_versions && v.put_id > r.ver.put_id) {
        events_.removed(item->key, pd.node_id, r.ver, "replaced");
        events_.stored(item->key, pd.node_id, v);
        r.ver = v;
        r.len = item->len;
        count_cohort(pd.node_id, r.replicas[0], -1);
        r.replicas[0].offset = item->offset;
        r.replicas[0].instance = pd.put_id;
        r.replicas[0].group = item->group;
        r.replicas[0].slot_size = item->slot_size;
        count_cohort(pd.node_id, r.replicas[0], +1);
        if (!tiers_.empty()) {  // the old version leaves the tiers, the new one enters
          tier_leave(pd.node_id, item->key);
          tier_enter(pd.node_id, item->key, v, item->slot_size ? item->slot_size : item->len);
        }
        rep.results.push_back(wire::PutItemResult::Live);
        counters_.routes_published_total++;
        continue;
      }
      // Stale, or another version holds the key. Refused for good: a later attempt of this identity
      // (a duplicate, a re-send whose first answer the owner already took) finds the same answer
      // even once the other version has gone — the owner freed this copy's slot on the first (T1).
      entomb(item->key, pd.node_id, v, pd.generation);
      rep.results.push_back(wire::PutItemResult::Exists);
      counters_.put_done_exists_total++;
      continue;
    }
    if (may_be_entombed(*item)) {
      const TombKey tk = tomb_key(item->key, pd.node_id);
      if (const Removed* t = tombstones_.find(tk)) {
        if (t->covers(pd.generation, v)) {
          rep.results.push_back(wire::PutItemResult::Exists);  // a removed version stays removed
          counters_.put_done_exists_total++;
          continue;
        }
        tombstones_.erase(tk);
      }
    }
    auto [route, _] = routes_.emplace(item->key, probes_[i], Route{v, item->len, {}});
    add_replica(item->key, route->second,
                Replica{pd.node_id, item->group, pd.generation, item->offset, pd.put_id, item->slot_size});
    rep.results.push_back(wire::PutItemResult::Live);
    counters_.routes_published_total++;
    if (item->replica) {  // a replica task for a target-role owner to pull (placement: replica_poll)
      if (!target_besides(pd.node_id)) {
        counters_.replica_tasks_no_target_total++;  // strict roles: no fallback to other owners
      } else {
        if (replica_queue_.size() >= kReplicaQueueMax) {  // the bound: the oldest task goes, counted
          replica_queue_.pop_front();
          counters_.dropped_replica_tasks_total++;
        }
        replica_queue_.push_back(ReplicaTask{item->key, v, pd.node_id, item->parent, item->depth});
        counters_.replica_tasks_total++;
      }
    }
  }
  if (duplicate) counters_.put_done_duplicate_total++;
  return make_envelope(std::move(rep));
}

Envelope MasterCore::remove_routes(const wire::RemoveRoutesT& rr) {
  wire::RemoveRoutesReplyT rep;
  prepare_probes(rr.items.size(), [&](size_t i) -> std::string_view { return rr.items[i]->key; });
  for (const auto& item : rr.items) tombstones_.map().prefetch(tomb_key(item->key, item->node_id));  // removed: entombed
  for (size_t i = 0; i < rr.items.size(); ++i) {
    const auto& item = rr.items[i];
    const Version v = item_version(item->origin_node, item->origin_generation, item->put_id, item->node_id,
                                   item->generation, item->put_id);
    auto it = routes_.find(probes_[i]);
    // Only the exact replica of the exact version goes: never a newer one (identity beats flags).
    bool match = false;
    if (it != routes_.end() && it->second.ver == v)
      if (Replica* r = find_replica(it->second, item->node_id))
        match = r->generation == item->generation && (item->instance == 0 || r->instance == item->instance);
    const bool relied = demotion_relies_on(item->key, item->node_id);
    if (fenced(item->key, item->node_id) || relied) {
      counters_.remove_busy_total++;
      if (relied) counters_.demote_relied_busy_total++;
      rep.removed.push_back(false);
      rep.busy.push_back(true);
      continue;
    }
    if (match) {
      drop_replica(item->key, item->node_id, true, "removed");
      (routes_.count(item->key) ? counters_.removed_with_copies_left_total : counters_.removed_last_copy_total)++;
    }
    rep.removed.push_back(match);
    rep.busy.push_back(false);
  }
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
    tiers_registered(r->node_id);
    if (tiers_.count(r->node_id)) rep.tier_poll_ms = kTierPollMs;
    return make_envelope(std::move(rep));
  }
  // The requests that name their node: their replies carry the node's T2 victims (Envelope.evict).
  auto with_victims = [this](uint32_t node, Envelope reply) {
    if (reply.body.AsError()) return reply;
    if (!tiers_.empty()) hand_victims(node, reply);
    hand_unbacked(node, reply);
    return reply;
  };
  if (auto* pd = req.body.AsPutDone()) {
    counters_.put_done_messages_total++;
    Envelope rep = put_done(*pd);
    if (auto* r = rep.body.AsPutDoneReply())
      for (const auto& more : pd->more) {
        Envelope m = put_done(*more);
        if (auto* mr = m.body.AsPutDoneReply()) r->more.push_back(std::make_unique<wire::PutDoneReplyT>(std::move(*mr)));
      }
    return with_victims(pd->node_id, std::move(rep));
  }
  if (auto* gs = req.body.AsBatchGetStart()) return with_victims(gs->node_id, get_start(*gs, now));
  if (auto* gd = req.body.AsBatchGetDone()) return with_victims(gd->node_id, get_done(*gd));
  if (auto* gr = req.body.AsBatchGetRevoke()) return with_victims(gr->node_id, get_revoke(*gr));
  if (auto* rr = req.body.AsRemoveRoutes()) return remove_routes(*rr);
  if (auto* ke = req.body.AsKvEventsReq()) return kv_events_read(*ke);
  if (auto* rc = req.body.AsReclaim()) return with_victims(rc->node_id, reclaim(*rc));
  if (auto* rp = req.body.AsReplicaPoll()) return with_victims(rp->node_id, replica_poll(*rp));
  if (auto* tp = req.body.AsTierPoll()) return with_victims(tp->node_id, make_envelope(wire::TierPollReplyT{}));
  if (auto* lk = req.body.AsLookup()) {
    counters_.lookups_total++;
    counters_.lookup_keys_total += lk->keys.size();
    wire::LookupReplyT rep;
    rep.routes.reserve(lk->keys.size());
    prepare_probes(lk->keys.size(), [&](size_t i) -> std::string_view { return lk->keys[i]; });
    for (size_t i = 0; i < lk->keys.size(); ++i) {
      auto info = std::make_unique<wire::RouteInfoT>();
      auto it = routes_.find(probes_[i]);
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
    rep.values = stat_values(stats(), counters());
    return make_envelope(std::move(rep));
  }
  if (auto* w = req.body.AsWriteBack()) return with_victims(w->node_id, write_back(*w, now_));
  if (auto* p = req.body.AsPing()) return make_envelope(wire::PongT{{}, p->seq});
  counters_.errors_total++;
  counters_.malformed_total++;
  return error_envelope(Status(Code::kMalformedMessage, std::string("master: unexpected message ") + body_name(req)));
}

std::string MasterCore::derived_bounds_violation() const {
  if (gets_.size() > get_bound_)
    return "gets: " + std::to_string(gets_.size()) + " over the bound " + std::to_string(get_bound_);
  uint64_t leases = 0;
  for (const auto& [k, n] : reads_) {
    if (n == 0) return "reads: an entry of count 0 for '" + k.first + "'";
    leases += n;
  }
  if (leases != gets_.size() || reads_.size() > gets_.size())
    return "reads: " + std::to_string(reads_.size()) + " entries counting " + std::to_string(leases) +
           " leases for " + std::to_string(gets_.size()) + " gets";
  uint64_t members = 0;
  bool zero = false;
  cohorts_.for_each([&](const CohortKey&, uint32_t n) {
    zero |= n == 0;
    members += n;
  });
  if (zero) return "cohorts: an entry of count 0";
  if (members != replicas_ || cohorts_.size() > replicas_)
    return "cohorts: " + std::to_string(cohorts_.size()) + " entries counting " + std::to_string(members) +
           " members for " + std::to_string(replicas_) + " replicas";
  return "";
}

Envelope MasterCore::kv_events_read(const wire::KvEventsReqT& req) {
  counters_.kv_event_reads_total++;
  const KvEventLog::Read r = events_.read(req.epoch, req.seq, req.prefix, req.max);
  if (r.lost) counters_.kv_event_reads_lost_total++;
  wire::KvEventsReplyT rep;
  rep.epoch = events_.epoch();
  rep.next_seq = r.next_seq;
  rep.first_seq = r.first_seq;
  rep.lost = r.lost;
  rep.events.reserve(r.events.size());
  for (const KvEvent& e : r.events) {
    auto w = std::make_unique<wire::KvEventT>();
    w->seq = e.seq;
    w->kind = e.kind == KvEvent::Kind::kStored ? wire::KvEventKind::Stored : wire::KvEventKind::Removed;
    w->key = std::string(e.key);
    w->node = e.node;
    w->origin_node = e.ver.origin_node;
    w->origin_generation = e.ver.origin_generation;
    w->put_id = e.ver.put_id;
    w->cause = e.cause;
    rep.events.push_back(std::move(w));
  }
  return make_envelope(std::move(rep));
}

MasterStats MasterCore::stats() const {
  MasterStats s;
  s.routes = routes_.size();
  s.owners = owners_.size();
  s.replicas = replicas_;
  s.inflight_gets = gets_.size();
  s.replica_tasks_queued = replica_queue_.size();
  s.reclaims = reclaims_.size();
  s.reclaim_fences = reclaim_fences_.size();
  s.kv_events = events_.size();
  s.kv_event_seq = events_.next_seq() - 1;
  for (const auto& [node, t] : tiers_) {
    s.tier2_bytes += t.t2 ? t.t2->weighted_size() : 0;
    s.tier1_bytes += t.t1 ? t.t1->weighted_size() : 0;
    s.tier2_victim_bytes += t.victim_bytes;
    s.tier2_victims += t.victims.size();
  }
  return s;
}

}  // namespace fluxon
