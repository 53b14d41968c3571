// RouteTiers: T2 (resident) and T1 (hot) per node, W-TinyLFU tiers of route metadata weighted by
// slot size (route_tiers.hpp).
#include "fluxon/master/route_tiers.hpp"

#include <algorithm>

namespace fluxon {

namespace {
WeightedCache<std::string, Version>::Options tier_options(uint64_t capacity, bool enforce) {
  WeightedCache<std::string, Version>::Options o;
  o.max_capacity = std::max<uint64_t>(capacity, 1);
  o.enforce_capacity = enforce;
  o.shards = 1;  // one thread: no lock contention to spread, and no entry too heavy for a shard
  o.estimated_entries = std::max<uint64_t>(1024, capacity / (64 << 10));
  return o;
}
}  // namespace

void RouteTiers::registered(uint32_t node, const RouteRegistry& routes) {
  if (t2_ratio_ <= 0 && t1_ratio_ <= 0) return;
  auto o = routes.owners().find(node);
  if (o == routes.owners().end() || o->second.segment_len == 0) return;
  const uint64_t seg = o->second.segment_len;
  const uint64_t cap2 = t2_ratio_ > 0 ? uint64_t(double(seg) * t2_ratio_) : 0;
  const uint64_t cap1 = t1_ratio_ > 0 && !routes.is_replica_target(node) ? uint64_t(double(seg) * t1_ratio_) : 0;
  NodeTiers& t = tiers_[node];
  if (t.cap2 == cap2 && t.cap1 == cap1 && (t.t2 || t.t1)) return;  // a re-registration: the tiers stay
  // A new segment size (or a first registration): the node's routes went with its old generation.
  t = NodeTiers{};
  t.cap2 = cap2, t.cap1 = cap1;
  if (cap2) t.t2 = std::make_unique<RouteTier>(tier_options(cap2, false));
  if (cap1) t.t1 = std::make_unique<RouteTier>(tier_options(cap1, true));
}

RouteTiers::Sizes RouteTiers::sizes(uint32_t node) const {
  Sizes s;
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return s;
  const NodeTiers& t = it->second;
  s.t2 = t.t2 ? t.t2->weighted_size() : 0;
  s.t1 = t.t1 ? t.t1->weighted_size() : 0;
  s.victims = t.victim_bytes;
  s.t2_capacity = t.cap2, s.t1_capacity = t.cap1;
  return s;
}

RouteTiers::Sizes RouteTiers::total() const {
  Sizes s;
  for (const auto& [node, t] : tiers_) {
    s.t2 += t.t2 ? t.t2->weighted_size() : 0;
    s.t1 += t.t1 ? t.t1->weighted_size() : 0;
    s.victims += t.victim_bytes;
    s.t2_capacity += t.cap2, s.t1_capacity += t.cap1;
  }
  return s;
}

size_t RouteTiers::victim_count() const {
  size_t n = 0;
  for (const auto& [node, t] : tiers_) n += t.victims.size();
  return n;
}

std::vector<uint32_t> RouteTiers::nodes() const {
  std::vector<uint32_t> out;
  for (const auto& [node, t] : tiers_) out.push_back(node);
  return out;
}

bool RouteTiers::in_tier1(uint32_t node, const std::string& key) const {
  auto it = tiers_.find(node);
  return it != tiers_.end() && it->second.t1 && it->second.t1->contains(key);
}

std::map<std::string, int> RouteTiers::victims(uint32_t node) const {
  std::map<std::string, int> out;
  if (auto it = tiers_.find(node); it != tiers_.end())
    for (const auto& [k, v] : it->second.victims) out[k] = int(v.state);
  return out;
}

void RouteTiers::enter(uint32_t node, const std::string& key, const Version& v, uint64_t bytes,
                       const TierContext& ctx) {
  auto it = tiers_.find(node);
  if (it == tiers_.end() || bytes == 0) return;
  NodeTiers& t = it->second;
  if (t.t2) (void)t.t2->insert(key, v, bytes);
  if (t.t1) {  // inclusive: every new route enters both
    std::vector<std::pair<std::string, Version>> evicted;
    (void)t.t1->insert(key, v, bytes, &evicted);
    for (const auto& [k, ver] : evicted) tier1_evicted(node, k, ver, ctx);
  }
  // A copy of this version on a target-role node: the fenced victims elsewhere waiting for it are backed.
  if (ctx.routes.is_replica_target(node))
    for (auto& [other, ot] : tiers_) {
      if (other == node) continue;
      auto vic = ot.victims.find(key);
      if (vic == ot.victims.end() || vic->second.state != Victim::State::kFenced || !(vic->second.ver == v)) continue;
      vic->second.state = Victim::State::kReady;
      vic->second.demote = true;
      ot.ready.push_back(key);
      counters.tier2_fence_backed_total++;
    }
  if (t.t2 && t.t2->weighted_size() > t.cap2) select(node, t, ctx);
}

void RouteTiers::leave(uint32_t node, const std::string& key) {
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return;
  NodeTiers& t = it->second;
  if (t.t2) t.t2->remove(key);
  if (t.t1) t.t1->remove(key);
  if (auto v = t.victims.find(key); v != t.victims.end()) {
    t.victim_bytes -= v->second.bytes;
    t.victims.erase(v);
    counters.tier2_ended_total++;
  }
}

void RouteTiers::read(uint32_t node, const std::string& key, const Version& v, uint64_t bytes,
                      const TierContext& ctx) {
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return;
  NodeTiers& t = it->second;
  if (t.t2) t.t2->touch(key);
  if (!t.t1) return;
  if (t.t1->touch(key)) return;
  // A T2 hit the master saw: back into T1 (not a victim: that one is on its way out).
  if (t.victims.count(key) || (t.t2 && !t.t2->contains(key))) return;
  counters.tier1_promotions_total++;
  std::vector<std::pair<std::string, Version>> evicted;
  (void)t.t1->insert(key, v, bytes, &evicted);
  for (const auto& [k, ver] : evicted) tier1_evicted(node, k, ver, ctx);
}

void RouteTiers::tier1_evicted(uint32_t node, const std::string& key, const Version& v, const TierContext& ctx) {
  counters.tier1_triggered_total++;
  const Route* r = ctx.routes.route(key);
  const Replica* mine = r ? r->find(node) : nullptr;
  if (!mine || !(r->ver == v)) {
    counters.tier1_stale_total++;
    return;
  }
  if (ctx.routes.backed_elsewhere(*r, node)) {
    counters.tier1_backed_total++;
    return;
  }
  if (!ctx.routes.target_besides(node)) {
    counters.tier1_no_target_total++;
    return;
  }
  ctx.placement.queue_writeback(key, v, node, std::string(), -1, ctx.now);
  counters.tier1_queued_total++;
}

void RouteTiers::select(uint32_t node, NodeTiers& t, const TierContext& ctx) {
  const uint64_t over = t.t2->weighted_size() - t.cap2;
  // Recoverable: another copy serves the key once this one goes - on a source node a target-role
  // copy (a demotion relies on it, fenced); on a target-role node any other copy (ring B: the
  // copies that duplicate a live source go before the last ones).
  const bool target = ctx.routes.is_replica_target(node);
  auto recoverable = [&](const Route& r) { return target ? r.replicas.size() > 1 : ctx.routes.backed_elsewhere(r, node); };
  std::vector<std::pair<std::string, Version>> chosen;
  // Pass 0: recoverable (a target-role owner holds the same version: nothing is lost); 1: not read,
  // reclaimed or written back now (the T1 lead window runs for those); 2: anything.
  uint64_t got = 0;
  for (int pass = 0; pass < 3 && got < over; ++pass)
    got += t.t2->evict_some_if(
        over - got,
        [&](const std::string& k, const Version& v) {
          const Route* r = ctx.routes.route(k);
          if (!r || !(r->ver == v)) return true;  // (never: a drop leaves the tier)
          if (pass == 0) return recoverable(*r);
          if (pass == 1)
            return !ctx.gets.reading(k, node) && !ctx.reclaims.fenced(k, node) &&
                   !ctx.placement.writeback_pending(k, v, ctx.now);
          return true;
        },
        &chosen);
  for (auto& [k, v] : chosen) {
    const Route* r = ctx.routes.route(k);
    const Replica* mine = r ? r->find(node) : nullptr;
    if (!mine || !(r->ver == v)) continue;
    Victim vic;
    vic.ver = v;
    vic.bytes = r->bytes_of(*mine);
    counters.tier2_selected_total++;
    counters.tier2_selected_bytes_total += vic.bytes;
    if (recoverable(*r)) {
      vic.demote = !target;  // a target-role node's copy goes as a plain eviction: no demotion relies on the source
      vic.duplicate = target;
      counters.tier2_recoverable_total++;
    } else if (t.t1 && ctx.routes.target_besides(node)) {
      // E16ba: the resident tier's exact victim waits (bounded) for its copy: started here unless
      // T1's write-back of it is on its way already.
      vic.state = Victim::State::kFenced;
      vic.until = ctx.now + ReplicaPlacement::kWriteBackTaskMs;
      ctx.placement.queue_writeback(k, v, node, std::string(), -1, ctx.now);
      victim_timers_.emplace_back(vic.until, node, k);
      counters.tier2_fenced_total++;
    }
    if (vic.state == Victim::State::kReady) t.ready.push_back(k);
    t.victim_bytes += vic.bytes;
    t.victims[k] = vic;
  }
}

void RouteTiers::hand(uint32_t node, Envelope& reply, Millis now) {
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return;
  NodeTiers& t = it->second;
  while (!t.ready.empty() && reply.evict.size() < kVictimsPerReply) {
    const std::string key = std::move(t.ready.front());
    t.ready.pop_front();
    auto v = t.victims.find(key);
    if (v == t.victims.end() || v->second.state != Victim::State::kReady) continue;
    auto w = std::make_unique<wire::TierVictimT>();
    w->key = key;
    w->origin_node = v->second.ver.origin_node;
    w->origin_generation = v->second.ver.origin_generation;
    w->origin_put_id = v->second.ver.put_id;
    w->demote = v->second.demote;
    reply.evict.push_back(std::move(w));
    v->second.state = Victim::State::kHanded;
    v->second.until = now + kTierHandMs;
    v->second.hands++;
    victim_timers_.emplace_back(v->second.until, node, key);
    counters.tier2_handed_total++;
  }
}

void RouteTiers::tick(const TierContext& ctx) {
  while (!victim_timers_.empty() && std::get<0>(victim_timers_.front()) <= ctx.now) {
    auto [until, node, key] = std::move(victim_timers_.front());
    victim_timers_.pop_front();
    auto it = tiers_.find(node);
    if (it == tiers_.end()) continue;
    NodeTiers& t = it->second;
    auto v = t.victims.find(key);
    if (v == t.victims.end() || v->second.until != until) continue;  // gone, or timed again since
    Victim& vic = v->second;
    if (vic.state == Victim::State::kFenced) {
      // The bound passed without a copy: the victim goes as it is (a shortfall of the lead window).
      counters.tier2_shortfall_total++;
      counters.tier2_shortfall_bytes_total += vic.bytes;
      vic.state = Victim::State::kReady;
      t.ready.push_back(key);
    } else if (vic.state == Victim::State::kHanded) {
      if (vic.hands < kHands) {  // the reply may have been lost: once more
        vic.state = Victim::State::kReady;
        t.ready.push_back(key);
        continue;
      }
      // Its owner keeps it (held, busy, a demotion the master refused): back into T2, safely - only
      // while the route is still this version on this node (a drop erased the victim already).
      const Victim back = vic;
      t.victim_bytes -= vic.bytes;
      t.victims.erase(v);
      counters.tier2_restored_total++;
      if (t.t2) (void)t.t2->insert(key, back.ver, back.bytes);
    }
  }
  for (auto& [node, t] : tiers_)
    if (t.t2 && t.t2->weighted_size() > t.cap2) select(node, t, ctx);
}

bool RouteTiers::duplicate_victim_now_last(uint32_t node, const wire::ReclaimT& req, const RouteRegistry& routes) {
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return false;
  NodeTiers& t = it->second;
  bool last = false;
  for (const auto& m : req.members) {
    auto v = t.victims.find(m->key);
    if (v == t.victims.end() || !v->second.duplicate) continue;
    const Route* r = routes.route(m->key);
    if (r && r->replicas.size() <= 1) last = true;
  }
  if (!last) return false;
  for (const auto& m : req.members) {  // every duplicate victim of the cohort back into T2
    auto v = t.victims.find(m->key);
    if (v == t.victims.end() || !v->second.duplicate) continue;
    const Victim back = v->second;
    t.victim_bytes -= back.bytes;
    t.victims.erase(v);
    counters.tier2_restored_total++;
    if (t.t2) (void)t.t2->insert(m->key, back.ver, back.bytes);
  }
  return true;
}

}  // namespace fluxon
