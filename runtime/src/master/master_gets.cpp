// MasterCore's remote gets: one prepared get per (key, requester) (G6, GetLeases), the activity
// lease it puts on its source replica (S2 across owners), GetDone's publication of the copy,
// revocation, and the rule that a get id is answered once (T1).
#include "fluxon/master/master_core.hpp"

#include <algorithm>

namespace fluxon {

Envelope MasterCore::get_start(const wire::BatchGetStartT& req, Millis now) {
  auto& c = gets_.counters;
  c.get_start_total++;
  c.get_start_keys_total += req.items.size();
  if (req.generation > routes_.owner(req.node_id).generation) admit_generation(req.node_id, req.generation);
  const uint64_t generation = routes_.owner(req.node_id).generation;
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
      const OwnerInfo& so = routes_.owner(src.node_id);
      s->data_host = so.data_host;
      s->data_port = so.data_port;
      if (grant_signer_) {
        const std::string g = grant_signer_({req.node_id, req.generation, src.generation, src.offset, r.len});
        s->grant.assign(g.begin(), g.end());
      }
    };
    if (req.generation < generation) {
      s->status = wire::GetStartStatus::StaleGeneration;
      rep.items.push_back(std::move(s));
      continue;
    }
    const GetLeases::GetKey gk{item->key, req.node_id};
    // Decides this item: Started (a prepared get, kept until it ends), or not — and a get id
    // answered "not started" is ended for good: a late duplicate of it never starts (T1).
    [&] {
      Route* route = routes_.route(item->key);
      if (const GetLeases::Flight* g = gets_.find(gk)) {
        if (g->get_id == item->get_id) {
          const Replica* src = route ? route->find(g->source_node) : nullptr;
          if (src && route->ver == g->ver) return fill(*route, *src);  // T1: the same answer
          gets_.end(gk, now_);  // its source is gone: a miss now
          s->status = wire::GetStartStatus::Miss;
          c.get_miss_total++;
          return;
        }
      }
      if (gets_.ended(gk, item->get_id)) {
        s->status = wire::GetStartStatus::Miss;  // T1: a late duplicate of a get that ended
        c.get_start_stale_total++;
        return;
      }
      if (gets_.find(gk)) {
        s->status = wire::GetStartStatus::Busy;  // G6: one prepared get per (key, requester)
        c.get_busy_total++;
        return;
      }
      if (!route) {
        s->status = wire::GetStartStatus::Miss;
        c.get_miss_total++;
        return;
      }
      Route& r = *route;
      if (const Replica* mine = r.find(req.node_id); mine && mine->generation == req.generation) {
        s->status = wire::GetStartStatus::AlreadyLocal;
        return;
      }
      // The source: the replica with the fewest reads in flight, never one a reclaim fences (its
      // slot may be free already: the fence covers the window until its route goes).
      const Replica* best = nullptr;
      uint32_t best_reads = 0;
      bool reclaiming = false, unregistered = false;
      for (const auto& x : r.replicas) {
        if (x.node_id == req.node_id) continue;
        if (reclaims_.fenced(item->key, x.node_id)) {
          reclaiming = true;
          continue;
        }
        if (const OwnerInfo& so = routes_.owner(x.node_id); !so.registered || so.generation != x.generation) {
          unregistered = true;  // its data address is not known to this core yet: not a source now
          continue;
        }
        const uint32_t n = gets_.reading(item->key, x.node_id);
        if (!best || n < best_reads) best = &x, best_reads = n;
      }
      if (!best && reclaiming) {
        s->status = wire::GetStartStatus::Busy;  // being reclaimed: no new lease (a miss for now)
        reclaims_.counters.reclaim_refused_gets_total++;
        return;
      }
      if (!best && unregistered) {
        s->status = wire::GetStartStatus::Busy;  // its holder has not registered here yet: a miss for now
        c.get_busy_total++;
        return;
      }
      if (!best) {
        s->status = wire::GetStartStatus::Miss;
        c.get_miss_total++;
        return;
      }
      if (!gets_.start(gk, GetLeases::Flight{item->get_id, req.generation, best->node_id, r.ver,
                                             now + gets_.ttl_ms()})) {
        s->status = wire::GetStartStatus::Busy;  // the bound: no new lease, a miss for now
        return;
      }
      if (tiers_.active()) tiers_.read(best->node_id, item->key, r.ver, r.bytes_of(*best), tier_context());
      fill(r, *best);
    }();
    if (s->status != wire::GetStartStatus::Started) gets_.note_ended(gk, item->get_id, now_);
    rep.items.push_back(std::move(s));
  }
  return make_envelope(std::move(rep));
}

Envelope MasterCore::get_done(const wire::BatchGetDoneT& req) {
  auto& c = gets_.counters;
  const uint64_t generation = routes_.owner(req.node_id).generation;
  wire::BatchGetDoneReplyT rep;
  for (const auto& item : req.items) {
    const GetLeases::GetKey gk{item->key, req.node_id};
    const GetLeases::Flight* g = gets_.find(gk);
    Route* route = routes_.route(item->key);
    if (g && g->get_id == item->get_id) {
      const Version ver = g->ver;
      const uint64_t gen = g->requester_generation;
      gets_.end(gk, now_);
      c.get_done_total++;
      if (!route || !(route->ver == ver) || gen != req.generation || req.generation < generation) {
        c.get_done_stale_total++;
        rep.results.push_back(wire::GetDoneStatus::Stale);  // the version went: the copy is not published
        continue;
      }
      if (const Replica* mine = route->find(req.node_id)) {
        // T2: a copy of this version is live on the requester already; the loser frees its slot.
        const bool same = mine->generation == req.generation && mine->offset == item->offset;
        if (!same) c.get_done_stale_total++;
        rep.results.push_back(same ? wire::GetDoneStatus::Live : wire::GetDoneStatus::Stale);
        continue;
      }
      add_replica(item->key, *route,
                  Replica{req.node_id, item->group, req.generation, item->offset, item->instance, item->slot_size});
      rep.results.push_back(wire::GetDoneStatus::Live);
      continue;
    }
    // Not inflight: a re-sent Done that already settled (T1) is Live; anything else is stale.
    bool live = false;
    if (route)
      if (const Replica* mine = route->find(req.node_id))
        live = mine->generation == req.generation && mine->offset == item->offset;
    if (!live) c.get_done_stale_total++;
    rep.results.push_back(live ? wire::GetDoneStatus::Live : wire::GetDoneStatus::Stale);
  }
  return make_envelope(std::move(rep));
}

Envelope MasterCore::get_revoke(const wire::BatchGetRevokeT& req) {
  wire::BatchGetRevokeReplyT rep;
  for (const auto& item : req.items) {
    const GetLeases::GetKey gk{item->key, req.node_id};
    const GetLeases::Flight* g = gets_.find(gk);
    const bool known = g && g->get_id == item->get_id;
    if (known) {
      gets_.end(gk, now_);
      gets_.counters.get_revoked_total++;
    }
    rep.known.push_back(known);
  }
  return make_envelope(std::move(rep));
}

}  // namespace fluxon
