// MasterCore's remote gets: one prepared get per (key, requester) (G6), the activity fence it puts
// on its source replica (S2 across owners), GetDone's publication of the copy, revocation, and the
// rule that a get id is answered once (T1).
#include "fluxon/master/master_core.hpp"

#include <algorithm>

namespace fluxon {

bool MasterCore::fenced(const std::string& key, uint32_t node_id) const {
  // Conservative: any get reading this node's copy of key holds it, whatever version it reads; a
  // reclaim in progress holds it until it ends.
  return (!reads_.empty() && reads_.count({key, node_id}) != 0) || reclaim_fenced(key, node_id);
}

void MasterCore::end_get(std::map<GetKey, GetFlight>::iterator it) {
  auto f = reads_.find({it->first.first, it->second.source_node});
  if (f != reads_.end() && --f->second == 0) reads_.erase(f);
  note_ended(it->first, it->second.get_id);
  gets_.erase(it);
}

void MasterCore::note_ended(const GetKey& gk, uint64_t get_id) {
  const uint64_t* had = ended_gets_.find(gk);
  ended_gets_.set(gk, had ? std::max(*had, get_id) : get_id, now_ + get_ttl_ms_);
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
      if (grant_signer_) {
        const std::string g = grant_signer_({req.node_id, req.generation, src.generation, src.offset, r.len});
        s->grant.assign(g.begin(), g.end());
      }
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
      if (const uint64_t* ended = ended_gets_.find(gk); ended && item->get_id <= *ended) {
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
      // The source: the replica with the fewest reads in flight, never one a reclaim fences (its
      // slot may be free already: the fence covers the window until its route goes).
      const Replica* best = nullptr;
      uint32_t best_reads = 0;
      bool reclaiming = false;
      for (const auto& x : r.replicas) {
        if (x.node_id == req.node_id) continue;
        if (reclaim_fenced(item->key, x.node_id)) {
          reclaiming = true;
          continue;
        }
        auto f = reads_.find({item->key, x.node_id});
        const uint32_t n = f == reads_.end() ? 0 : f->second;
        if (!best || n < best_reads) best = &x, best_reads = n;
      }
      if (!best && reclaiming) {
        s->status = wire::GetStartStatus::Busy;  // being reclaimed: no new lease (a miss for now)
        counters_.reclaim_refused_gets_total++;
        return;
      }
      if (!best) {
        s->status = wire::GetStartStatus::Miss;
        counters_.get_miss_total++;
        return;
      }
      if (gets_.size() >= get_bound_) {  // the bound: no new lease, a miss for now
        s->status = wire::GetStartStatus::Busy;
        counters_.refused_gets_total++;
        return;
      }
      gets_.emplace(gk, GetFlight{item->get_id, req.generation, best->node_id, r.ver, now + get_ttl_ms_});
      reads_[{item->key, best->node_id}]++;
      counters_.get_started_total++;
      if (!tiers_.empty()) tier_read(best->node_id, item->key, r.ver, best->slot_size ? best->slot_size : r.len);
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
      add_replica(item->key, route->second,
                  Replica{req.node_id, item->group, req.generation, item->offset, item->instance, item->slot_size});
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


}  // namespace fluxon
