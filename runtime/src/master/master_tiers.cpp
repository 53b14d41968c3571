// MasterCore's route tiers, T2 (resident) and T1 (hot): see set_tiers in master_core.hpp and the
// design's "Master 两级 Moka 提前写回" and E16ba. Both are W-TinyLFU tiers of route metadata per
// node, weighted by slot size; neither changes an owner's capacity (S5): T2 selects, the owner's
// fenced reclaim frees; T1 only starts write-backs.
#include "fluxon/master/master_core.hpp"

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

void MasterCore::tiers_registered(uint32_t node) {
  if (t2_ratio_ <= 0 && t1_ratio_ <= 0) return;
  const OwnerInfo& o = owners_[node];
  if (o.segment_len == 0) return;
  const uint64_t cap2 = t2_ratio_ > 0 ? uint64_t(double(o.segment_len) * t2_ratio_) : 0;
  const uint64_t cap1 = t1_ratio_ > 0 && !is_replica_target(node) ? uint64_t(double(o.segment_len) * t1_ratio_) : 0;
  NodeTiers& t = tiers_[node];
  if (t.cap2 == cap2 && t.cap1 == cap1 && (t.t2 || t.t1)) return;  // a re-registration: the tiers stay
  // A new segment size (or a first registration): the node's routes went with its old generation.
  t = NodeTiers{};
  t.cap2 = cap2, t.cap1 = cap1;
  if (cap2) t.t2 = std::make_unique<RouteTier>(tier_options(cap2, false));
  if (cap1) t.t1 = std::make_unique<RouteTier>(tier_options(cap1, true));
}

MasterCore::TierSizes MasterCore::tier_sizes(uint32_t node) const {
  TierSizes s;
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return s;
  const NodeTiers& t = it->second;
  s.t2 = t.t2 ? t.t2->weighted_size() : 0;
  s.t1 = t.t1 ? t.t1->weighted_size() : 0;
  s.victims = t.victim_bytes;
  s.t2_capacity = t.cap2, s.t1_capacity = t.cap1;
  return s;
}

std::vector<uint32_t> MasterCore::tier_nodes() const {
  std::vector<uint32_t> out;
  for (const auto& [node, t] : tiers_) out.push_back(node);
  return out;
}

bool MasterCore::in_tier1(uint32_t node, const std::string& key) const {
  auto it = tiers_.find(node);
  return it != tiers_.end() && it->second.t1 && it->second.t1->contains(key);
}

std::map<std::string, int> MasterCore::tier_victims(uint32_t node) const {
  std::map<std::string, int> out;
  if (auto it = tiers_.find(node); it != tiers_.end())
    for (const auto& [k, v] : it->second.victims) out[k] = int(v.state);
  return out;
}

void MasterCore::tier_enter(uint32_t node, const std::string& key, const Version& v, uint64_t bytes) {
  auto it = tiers_.find(node);
  if (it == tiers_.end() || bytes == 0) return;
  NodeTiers& t = it->second;
  if (t.t2) (void)t.t2->insert(key, v, bytes);
  if (t.t1) {  // inclusive: every new route enters both
    std::vector<std::pair<std::string, Version>> evicted;
    (void)t.t1->insert(key, v, bytes, &evicted);
    for (const auto& [k, ver] : evicted) tier1_evicted(node, k, ver);
  }
  // A copy of this version on a target-role node: the fenced victims elsewhere waiting for it are backed.
  if (is_replica_target(node))
    for (auto& [other, ot] : tiers_) {
      if (other == node) continue;
      auto vic = ot.victims.find(key);
      if (vic == ot.victims.end() || vic->second.state != TierVictim::State::kFenced || !(vic->second.ver == v)) continue;
      vic->second.state = TierVictim::State::kReady;
      vic->second.demote = true;
      ot.ready.push_back(key);
      counters_.tier2_fence_backed_total++;
    }
  if (t.t2 && t.t2->weighted_size() > t.cap2) tier2_select(node, t);
}

void MasterCore::tier_leave(uint32_t node, const std::string& key) {
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return;
  NodeTiers& t = it->second;
  if (t.t2) t.t2->remove(key);
  if (t.t1) t.t1->remove(key);
  if (auto v = t.victims.find(key); v != t.victims.end()) {
    t.victim_bytes -= v->second.bytes;
    t.victims.erase(v);
    counters_.tier2_ended_total++;
  }
}

void MasterCore::tier_read(uint32_t node, const std::string& key, const Version& v, uint64_t bytes) {
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return;
  NodeTiers& t = it->second;
  if (t.t2) t.t2->touch(key);
  if (!t.t1) return;
  if (t.t1->touch(key)) return;
  // A T2 hit the master saw: back into T1 (not a victim: that one is on its way out).
  if (t.victims.count(key) || (t.t2 && !t.t2->contains(key))) return;
  counters_.tier1_promotions_total++;
  std::vector<std::pair<std::string, Version>> evicted;
  (void)t.t1->insert(key, v, bytes, &evicted);
  for (const auto& [k, ver] : evicted) tier1_evicted(node, k, ver);
}

void MasterCore::tier1_evicted(uint32_t node, const std::string& key, const Version& v) {
  counters_.tier1_triggered_total++;
  auto r = routes_.find(key);
  Replica* mine = r == routes_.end() ? nullptr : find_replica(r->second, node);
  if (!mine || !(r->second.ver == v)) {
    counters_.tier1_stale_total++;
    return;
  }
  if (backed_elsewhere(r->second, node)) {
    counters_.tier1_backed_total++;
    return;
  }
  if (!target_besides(node)) {
    counters_.tier1_no_target_total++;
    return;
  }
  queue_writeback(key, v, node, std::string(), -1, now_);
  counters_.tier1_queued_total++;
}

void MasterCore::tier2_select(uint32_t node, NodeTiers& t) {
  const uint64_t over = t.t2->weighted_size() - t.cap2;
  // Recoverable: another copy serves the key once this one goes - on a source node a target-role
  // copy (a demotion relies on it, fenced); on a target-role node any other copy (ring B: the
  // copies that duplicate a live source go before the last ones).
  const bool target = is_replica_target(node);
  auto recoverable = [&](const Route& r) { return target ? r.replicas.size() > 1 : backed_elsewhere(r, node); };
  std::vector<std::pair<std::string, Version>> chosen;
  // Pass 0: recoverable (a target-role owner holds the same version: nothing is lost); 1: not read,
  // reclaimed or written back now (the T1 lead window runs for those); 2: anything.
  uint64_t got = 0;
  for (int pass = 0; pass < 3 && got < over; ++pass)
    got += t.t2->evict_some_if(
        over - got,
        [&](const std::string& k, const Version& v) {
          auto r = routes_.find(k);
          if (r == routes_.end() || !(r->second.ver == v)) return true;  // (never: a drop leaves the tier)
          if (pass == 0) return recoverable(r->second);
          if (pass == 1) return !reads_.count({k, node}) && !reclaim_fenced(k, node) && !writeback_pending(k, v, now_);
          return true;
        },
        &chosen);
  for (auto& [k, v] : chosen) {
    auto r = routes_.find(k);
    const Replica* mine = r == routes_.end() ? nullptr : find_replica(r->second, node);
    if (!mine || !(r->second.ver == v)) continue;
    TierVictim vic;
    vic.ver = v;
    vic.bytes = mine->slot_size ? mine->slot_size : r->second.len;
    counters_.tier2_selected_total++;
    counters_.tier2_selected_bytes_total += vic.bytes;
    if (recoverable(r->second)) {
      vic.demote = !target;  // a target-role node's copy goes as a plain eviction: no demotion relies on the source
      vic.duplicate = target;
      counters_.tier2_recoverable_total++;
    } else if (t.t1 && target_besides(node)) {
      // E16ba: the resident tier's exact victim waits (bounded) for its copy: started here unless
      // T1's write-back of it is on its way already.
      vic.state = TierVictim::State::kFenced;
      vic.until = now_ + kWriteBackTaskMs;
      queue_writeback(k, v, node, std::string(), -1, now_);
      victim_timers_.emplace_back(vic.until, node, k);
      counters_.tier2_fenced_total++;
    }
    if (vic.state == TierVictim::State::kReady) t.ready.push_back(k);
    t.victim_bytes += vic.bytes;
    t.victims[k] = vic;
  }
}

void MasterCore::hand_victims(uint32_t node, Envelope& reply) {
  auto it = tiers_.find(node);
  if (it == tiers_.end()) return;
  NodeTiers& t = it->second;
  while (!t.ready.empty() && reply.evict.size() < kVictimsPerReply) {
    const std::string key = std::move(t.ready.front());
    t.ready.pop_front();
    auto v = t.victims.find(key);
    if (v == t.victims.end() || v->second.state != TierVictim::State::kReady) continue;
    auto w = std::make_unique<wire::TierVictimT>();
    w->key = key;
    w->origin_node = v->second.ver.origin_node;
    w->origin_generation = v->second.ver.origin_generation;
    w->origin_put_id = v->second.ver.put_id;
    w->demote = v->second.demote;
    reply.evict.push_back(std::move(w));
    v->second.state = TierVictim::State::kHanded;
    v->second.until = now_ + kTierHandMs;
    v->second.hands++;
    victim_timers_.emplace_back(v->second.until, node, key);
    counters_.tier2_handed_total++;
  }
}

void MasterCore::tiers_tick(Millis now) {
  while (!victim_timers_.empty() && std::get<0>(victim_timers_.front()) <= now) {
    auto [until, node, key] = std::move(victim_timers_.front());
    victim_timers_.pop_front();
    auto it = tiers_.find(node);
    if (it == tiers_.end()) continue;
    NodeTiers& t = it->second;
    auto v = t.victims.find(key);
    if (v == t.victims.end() || v->second.until != until) continue;  // gone, or timed again since
    TierVictim& vic = v->second;
    if (vic.state == TierVictim::State::kFenced) {
      // The bound passed without a copy: the victim goes as it is (a shortfall of the lead window).
      counters_.tier2_shortfall_total++;
      counters_.tier2_shortfall_bytes_total += vic.bytes;
      vic.state = TierVictim::State::kReady;
      t.ready.push_back(key);
    } else if (vic.state == TierVictim::State::kHanded) {
      if (vic.hands < 3) {  // the reply may have been lost: once more
        vic.state = TierVictim::State::kReady;
        t.ready.push_back(key);
        continue;
      }
      // Its owner keeps it (held, busy, a demotion the master refused): back into T2, safely - only
      // while the route is still this version on this node (a drop erased the victim already).
      const TierVictim back = vic;
      t.victim_bytes -= vic.bytes;
      t.victims.erase(v);
      counters_.tier2_restored_total++;
      if (t.t2) (void)t.t2->insert(key, back.ver, back.bytes);
    }
  }
  for (auto& [node, t] : tiers_)
    if (t.t2 && t.t2->weighted_size() > t.cap2) tier2_select(node, t);
}

bool MasterCore::writeback_pending(const std::string& key, const Version& v, Millis now) const {
  const auto* t = writeback_tasks_.slot(key);
  return t && t->value == v && now < t->expires;
}

void MasterCore::queue_writeback(const std::string& key, const Version& v, uint32_t source, const std::string& parent,
                                 int32_t depth, Millis now, bool declinable) {
  if (writeback_pending(key, v, now)) return;  // queued once per version until the task had time to finish
  if (replica_queue_.size() >= kReplicaQueueMax) {  // the bound: the oldest task goes, counted
    replica_queue_.pop_front();
    counters_.dropped_replica_tasks_total++;
  }
  replica_queue_.push_back(ReplicaTask{key, v, source, parent, depth, declinable});
  writeback_tasks_.set(key, v, now + kWriteBackTaskMs);
  counters_.writeback_tasks_total++;
  counters_.replica_tasks_total++;
}

}  // namespace fluxon
