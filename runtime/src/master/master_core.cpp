// MasterCore, the router: registration, publication, removal, lookups, and the dispatch of every
// request to its handler. Remote gets are in master_gets.cpp, the reclaim steps in master_reclaim.cpp.
#include "fluxon/master/master_core.hpp"

#include <algorithm>

#include "fluxon/core/stat_values.hpp"

namespace fluxon {

uint64_t MasterCore::route_put_id(const std::string& key) const {
  const Route* r = routes_.route(key);
  return r ? r->ver.put_id : 0;
}

std::vector<uint32_t> MasterCore::replica_nodes(const std::string& key) const {
  std::vector<uint32_t> out;
  if (const Route* r = routes_.route(key))
    for (const auto& rep : r->replicas) out.push_back(rep.node_id);
  return out;
}

void MasterCore::add_replica(const std::string& key, Route& r, Replica rep) {
  routes_.add_replica(key, r, rep);
  if (tiers_.active()) tiers_.enter(rep.node_id, key, r.ver, r.bytes_of(rep), tier_context());
}

bool MasterCore::drop_replica(const std::string& key, uint32_t node_id, bool tombstone, const char* cause) {
  const RouteRegistry::Dropped d = routes_.drop_replica(key, node_id, tombstone, cause, now_);
  if (!d.dropped) return false;
  if (tiers_.active()) tiers_.leave(node_id, key);
  if (d.left && routes_.is_replica_target(node_id)) placement_.note_unbacked(key, *d.left, routes_);
  return true;
}

uint64_t MasterCore::admit_generation(uint32_t node_id, uint64_t generation) {
  OwnerInfo& o = routes_.owner(node_id);
  if (generation <= o.generation && o.generation != 0) return 0;
  placement_.forget_node(node_id);
  uint64_t dropped = 0;
  if (o.generation != 0) {
    for (const auto& k : routes_.keys_of(node_id)) dropped += drop_replica(k, node_id, false, "owner_restarted") ? 1 : 0;
    // Its prepared gets died with its memory; gets it was the source of fail at transfer time and
    // are revoked by their requesters.
    gets_.forget_requester(node_id, now_);
    // Its reclaims died with its memory (their replicas went above): their fences go too.
    reclaims_.forget_node(node_id, now_);
  }
  routes_.owner(node_id).generation = generation;
  routes_.owner(node_id).registered = false;  // until this generation registers
  routes_.counters.owners_registered_total++;
  return dropped;
}

void MasterCore::tick(Millis now) {
  now_ = now;
  if (tiers_.active()) tiers_.tick(tier_context());
  gets_.expire(now);
  routes_.expire(now);
  reclaims_.expire(now);
  placement_.expire(now);
}

Envelope MasterCore::register_owner(const wire::RegisterOwnerT& r) {
  if (r.generation < routes_.owner(r.node_id).generation) {
    // An older generation re-registering late is refused; a newer one takes over.
    router_counters_.errors_total++;
    return error_envelope(Status(Code::kGenerationMismatch, "node " + std::to_string(r.node_id) + " generation " +
                                                                std::to_string(r.generation) +
                                                                " is older than the registered one"));
  }
  wire::RegisterOwnerReplyT rep;
  rep.routes_dropped = admit_generation(r.node_id, r.generation);
  OwnerInfo& o = routes_.owner(r.node_id);
  o.registered = true;
  o.role = r.role;
  o.segment_len = r.segment_len;
  o.data_host = r.data_host;
  o.data_port = r.data_port;
  o.report.clear();  // a new generation's report comes from it
  o.report_at = 0;
  rep.replica_target = routes_.is_replica_target(r.node_id);
  tiers_.registered(r.node_id, routes_);
  if (tiers_.has(r.node_id)) rep.tier_poll_ms = kTierPollMs;
  return make_envelope(std::move(rep));
}

Envelope MasterCore::owner_report(const wire::OwnerReportT& r) {
  const auto& owners = routes_.owners();
  auto it = owners.find(r.node_id);
  if (it == owners.end() || it->second.generation != r.generation) {
    router_counters_.errors_total++;
    return error_envelope(Status(Code::kGenerationMismatch,
                                 "OwnerReport: node " + std::to_string(r.node_id) + " generation " +
                                     std::to_string(r.generation) + " is not the registered one"));
  }
  auto refuse = [&](const std::string& why) {
    router_counters_.errors_total++;
    return error_envelope(invalid_argument("OwnerReport." + why));
  };
  if (r.values.size() > OwnerInfo::kMaxReportValues)
    return refuse("values: " + std::to_string(r.values.size()) + " values, at most " +
                  std::to_string(OwnerInfo::kMaxReportValues));
  std::vector<std::pair<std::string, uint64_t>> values;
  values.reserve(r.values.size());
  for (const auto& v : r.values) {
    if (!v || v->name.empty() || v->name.size() > OwnerInfo::kMaxReportName)
      return refuse("values.name: empty or longer than " + std::to_string(OwnerInfo::kMaxReportName) + " bytes");
    values.emplace_back(v->name, v->value);
  }
  OwnerInfo& o = routes_.owner(r.node_id);
  o.report = std::move(values);
  o.report_at = std::max<Millis>(now_, 1);
  router_counters_.owner_reports_total++;
  return make_envelope(wire::OwnerReportReplyT{});
}

Envelope MasterCore::put_done(const wire::PutDoneT& pd) {
  auto& c = routes_.counters;
  c.put_done_total++;
  if (pd.generation > routes_.owner(pd.node_id).generation) admit_generation(pd.node_id, pd.generation);
  const uint64_t generation = routes_.owner(pd.node_id).generation;
  // A put takes its activity lease and gives it back within this step; a key a reclaim fences on
  // this node takes none: the whole request is refused (nothing applied) and its publish job asks
  // again with the same identity once the reclaim ended (the design's put lease).
  if (pd.generation >= generation)
    for (const auto& item : pd.items)
      if (reclaims_.fenced(item->key, pd.node_id)) {
        reclaims_.counters.reclaim_refused_puts_total++;
        return error_envelope(Status(Code::kKeyConflict, "key '" + item->key + "' is being reclaimed on node " +
                                                             std::to_string(pd.node_id) + ": PutDone refused for now"));
      }
  wire::PutDoneReplyT rep;
  rep.put_id = pd.put_id;
  rep.results.reserve(pd.items.size());
  bool duplicate = false;
  routes_.prepare(pd.items.size(), [&](size_t i) -> std::string_view { return pd.items[i]->key; });
  // A new key looks for its tombstone, unless none can cover it (its own newer version).
  const bool own_tombs = routes_.tomb_possible(pd.node_id, pd.generation, pd.put_id);
  auto may_be_entombed = [&](const wire::RouteItemT& item) {
    return item.origin_node ? routes_.any_tombstone() : own_tombs;
  };
  for (const auto& item : pd.items)
    if (may_be_entombed(*item)) routes_.prefetch_tomb(item->key, pd.node_id);
  for (size_t i = 0; i < pd.items.size(); ++i) {
    const auto& item = pd.items[i];
    if (pd.generation < generation) {
      rep.results.push_back(wire::PutItemResult::StaleGeneration);
      c.put_done_stale_total++;
      continue;
    }
    const Version v = item_version(item->origin_node, item->origin_generation, item->origin_put_id, pd.node_id,
                                   pd.generation, pd.put_id);
    auto it = routes_.find_prepared(i);
    if (it != routes_.end()) {
      Route& r = it->second;
      if (r.ver == v) {
        if (Replica* rep_on = r.find(pd.node_id)) {
          const bool same = rep_on->generation == pd.generation && rep_on->offset == item->offset;
          rep.results.push_back(same ? wire::PutItemResult::Live : wire::PutItemResult::Exists);
          if (same) duplicate = true;  // T1: the same identity again
          else c.put_done_exists_total++;
          continue;
        }
        if (routes_.entombed(item->key, pd.node_id, pd.generation, v)) {
          rep.results.push_back(wire::PutItemResult::Exists);  // this node's copy was removed: it stays so
          c.put_done_exists_total++;
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
        routes_.replace_own(item->key, r, v, item->len, item->offset, pd.put_id, item->group, item->slot_size);
        if (tiers_.active()) {  // the old version leaves the tiers, the new one enters
          tiers_.leave(pd.node_id, item->key);
          tiers_.enter(pd.node_id, item->key, v, r.bytes_of(r.replicas[0]), tier_context());
        }
        rep.results.push_back(wire::PutItemResult::Live);
        c.routes_published_total++;
        continue;
      }
      // Stale, or another version holds the key. Refused for good: a later attempt of this identity
      // (a duplicate, a re-send whose first answer the owner already took) finds the same answer
      // even once the other version has gone — the owner freed this copy's slot on the first (T1).
      routes_.entomb(item->key, pd.node_id, v, pd.generation, now_);
      rep.results.push_back(wire::PutItemResult::Exists);
      c.put_done_exists_total++;
      continue;
    }
    if (may_be_entombed(*item) && routes_.refuse_or_clear_tomb(item->key, pd.node_id, pd.generation, v)) {
      rep.results.push_back(wire::PutItemResult::Exists);  // a removed version stays removed
      c.put_done_exists_total++;
      continue;
    }
    Route& route = routes_.emplace_prepared(item->key, i, v, item->len);
    add_replica(item->key, route,
                Replica{pd.node_id, item->group, pd.generation, item->offset, pd.put_id, item->slot_size});
    rep.results.push_back(wire::PutItemResult::Live);
    c.routes_published_total++;
    if (item->replica) {  // a replica task for a target-role owner to pull (placement: ReplicaPoll)
      if (!routes_.target_besides(pd.node_id))
        placement_.counters.replica_tasks_no_target_total++;  // strict roles: no fallback to other owners
      else
        placement_.add_task(ReplicaPlacement::Task{item->key, v, pd.node_id, item->parent, item->depth});
    }
  }
  if (duplicate) c.put_done_duplicate_total++;
  return make_envelope(std::move(rep));
}

Envelope MasterCore::remove_routes(const wire::RemoveRoutesT& rr) {
  auto& c = routes_.counters;
  wire::RemoveRoutesReplyT rep;
  routes_.prepare(rr.items.size(), [&](size_t i) -> std::string_view { return rr.items[i]->key; });
  for (const auto& item : rr.items) routes_.prefetch_tomb(item->key, item->node_id);  // removed: entombed
  for (size_t i = 0; i < rr.items.size(); ++i) {
    const auto& item = rr.items[i];
    const Version v = item_version(item->origin_node, item->origin_generation, item->put_id, item->node_id,
                                   item->generation, item->put_id);
    auto it = routes_.find_prepared(i);
    // Only the exact replica of the exact version goes: never a newer one (identity beats flags).
    bool match = false;
    if (it != routes_.end() && it->second.ver == v)
      if (const Replica* r = it->second.find(item->node_id))
        match = r->generation == item->generation && (item->instance == 0 || r->instance == item->instance);
    const bool relied = demotion_relies_on(item->key, item->node_id);
    if (fenced(item->key, item->node_id) || relied) {
      c.remove_busy_total++;
      if (relied) reclaims_.counters.demote_relied_busy_total++;
      rep.removed.push_back(false);
      rep.busy.push_back(true);
      continue;
    }
    if (match) {
      drop_replica(item->key, item->node_id, true, "removed");
      (routes_.count(item->key) ? c.removed_with_copies_left_total : c.removed_last_copy_total)++;
    }
    rep.removed.push_back(match);
    rep.busy.push_back(false);
  }
  return make_envelope(std::move(rep));
}

Envelope MasterCore::lookup(const wire::LookupT& lk) {
  auto& c = routes_.counters;
  c.lookups_total++;
  c.lookup_keys_total += lk.keys.size();
  wire::LookupReplyT rep;
  rep.routes.reserve(lk.keys.size());
  routes_.prepare(lk.keys.size(), [&](size_t i) -> std::string_view { return lk.keys[i]; });
  for (size_t i = 0; i < lk.keys.size(); ++i) {
    auto info = std::make_unique<wire::RouteInfoT>();
    auto it = routes_.find_prepared(i);
    if (it != routes_.end()) {
      c.lookup_hits_total++;
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

Envelope MasterCore::with_notices(uint32_t node, Envelope reply) {
  if (reply.body.AsError()) return reply;
  if (tiers_.active()) tiers_.hand(node, reply, now_);
  placement_.hand_unbacked(node, reply);
  return reply;
}

Envelope MasterCore::handle(const Envelope& req, Millis now) {
  now_ = std::max(now_, now);
  if (auto* r = req.body.AsRegisterOwner()) return register_owner(*r);
  if (auto* r = req.body.AsOwnerReport()) return owner_report(*r);
  if (auto* pd = req.body.AsPutDone()) {
    routes_.counters.put_done_messages_total++;
    Envelope rep = put_done(*pd);
    if (auto* r = rep.body.AsPutDoneReply())
      for (const auto& more : pd->more) {
        Envelope m = put_done(*more);
        if (auto* mr = m.body.AsPutDoneReply()) r->more.push_back(std::make_unique<wire::PutDoneReplyT>(std::move(*mr)));
      }
    return with_notices(pd->node_id, std::move(rep));
  }
  if (auto* gs = req.body.AsBatchGetStart()) return with_notices(gs->node_id, get_start(*gs, now));
  if (auto* gd = req.body.AsBatchGetDone()) return with_notices(gd->node_id, get_done(*gd));
  if (auto* gr = req.body.AsBatchGetRevoke()) return with_notices(gr->node_id, get_revoke(*gr));
  if (auto* rr = req.body.AsRemoveRoutes()) return remove_routes(*rr);
  if (auto* ke = req.body.AsKvEventsReq()) return routes_.read_events(*ke);
  if (auto* rc = req.body.AsReclaim()) return with_notices(rc->node_id, reclaim(*rc));
  if (auto* rp = req.body.AsReplicaPoll()) return with_notices(rp->node_id, placement_.poll(*rp, routes_));
  if (auto* tp = req.body.AsTierPoll()) return with_notices(tp->node_id, make_envelope(wire::TierPollReplyT{}));
  if (auto* lk = req.body.AsLookup()) return lookup(*lk);
  if (req.body.AsMasterStatsReq()) {
    wire::MasterStatsReplyT rep;
    rep.values = stat_values(stats(), counters());
    return make_envelope(std::move(rep));
  }
  if (auto* w = req.body.AsWriteBack()) return with_notices(w->node_id, placement_.write_back(*w, routes_, now_));
  if (auto* p = req.body.AsPing()) return make_envelope(wire::PongT{{}, p->seq});
  count_malformed();
  return error_envelope(Status(Code::kMalformedMessage, std::string("master: unexpected message ") + body_name(req)));
}

std::string MasterCore::derived_bounds_violation() const {
  if (std::string v = gets_.derived_bounds_violation(); !v.empty()) return v;
  return routes_.derived_bounds_violation();
}

const MasterCounters& MasterCore::counters() const {
  // Each component's table (with its bounded maps' drops) into the union.
#define FLUXON_MASTER_COPY_(field, metric, label, help) counters_.field = part.field;
  {
    const auto part = routes_.table();
    FLUXON_MASTER_ROUTES_COUNTERS(FLUXON_MASTER_COPY_)
  }
  {
    const auto part = gets_.table();
    FLUXON_MASTER_GETS_COUNTERS(FLUXON_MASTER_COPY_)
  }
  {
    const auto part = placement_.table();
    FLUXON_MASTER_PLACEMENT_COUNTERS(FLUXON_MASTER_COPY_)
  }
  {
    const auto part = reclaims_.table();
    FLUXON_MASTER_RECLAIMS_COUNTERS(FLUXON_MASTER_COPY_)
  }
  {
    const auto& part = tiers_.counters;
    FLUXON_MASTER_TIERS_COUNTERS(FLUXON_MASTER_COPY_)
  }
  {
    const auto& part = router_counters_;
    FLUXON_MASTER_ROUTER_COUNTERS(FLUXON_MASTER_COPY_)
  }
#undef FLUXON_MASTER_COPY_
  return counters_;
}

MasterStats MasterCore::stats() const {
  MasterStats s;
  s.routes = routes_.size();
  s.owners = routes_.owners().size();
  s.replicas = routes_.replica_count();
  s.inflight_gets = gets_.size();
  s.replica_tasks_queued = placement_.queued();
  s.reclaims = reclaims_.size();
  s.reclaim_fences = reclaims_.fence_count();
  s.kv_events = routes_.events().size();
  s.kv_event_seq = routes_.events().next_seq() - 1;
  const RouteTiers::Sizes t = tiers_.total();
  s.tier2_bytes = t.t2;
  s.tier1_bytes = t.t1;
  s.tier2_victim_bytes = t.victims;
  s.tier2_victims = tiers_.victim_count();
  return s;
}

}  // namespace fluxon
