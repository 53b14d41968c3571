// RouteTiers: the master's two route tiers per owner, a component of MasterCore (the design's
// "Master 两级 Moka 提前写回" and E16ba). Per registered owner, weighted by slot size:
//   T2 (resident, tier2_ratio of its segment, every node): over it, the node's coldest routes are
//      selected - recoverable ones first (a target-role owner holds the same version: handed with
//      demote) - and handed to the node on its next reply (Envelope.evict) for its fenced reclaim.
//      On a target-role node this is the design's ring B: a bounded master index over the copies
//      the master placed, whose Size eviction may drop the last route (a later miss).
//   T1 (hot, tier1_ratio < tier2_ratio, source nodes only): inclusive; a route it evicts gets a
//      write-back (a replica task from its source), a get the master serves promotes it back.
//      With T1, a T2 victim not backed yet is fenced (E16ba): its write-back is started or
//      awaited for at most kWriteBackTaskMs, then it goes demoted (backed) or plain (a shortfall).
// Neither changes an owner's capacity (S5): T2 selects, the owner's fenced reclaim frees; T1 only
// starts write-backs. The tiers read the routes, the gets and the reclaims through a TierContext the
// router hands them; the write-backs they start go into the placement it names.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "fluxon/master/get_leases.hpp"
#include "fluxon/master/master_counters.hpp"
#include "fluxon/master/reclaim_registry.hpp"
#include "fluxon/master/replica_placement.hpp"
#include "fluxon/master/route_registry.hpp"
#include "fluxon/runtime/weighted_cache.hpp"

namespace fluxon {

struct TierContext {
  const RouteRegistry& routes;
  const GetLeases& gets;
  const ReclaimRegistry& reclaims;
  ReplicaPlacement& placement;  // where the write-backs the tiers start go
  Millis now;
};

class RouteTiers {
 public:
  static constexpr Millis kTierHandMs = 10000;  // a handed victim's time to go
  static constexpr uint32_t kTierPollMs = 200;  // how often an owner with tiers asks for its victims

  MasterTiersCounters counters;

  void set_ratios(double tier2_ratio, double tier1_ratio) { t2_ratio_ = tier2_ratio, t1_ratio_ = tier1_ratio; }
  bool active() const { return !tiers_.empty(); }
  bool has(uint32_t node) const { return tiers_.count(node) != 0; }
  // The node registered (its segment and role known): its tiers, or none.
  void registered(uint32_t node, const RouteRegistry& routes);
  // A replica of key entered / left the table on node.
  void enter(uint32_t node, const std::string& key, const Version& v, uint64_t bytes, const TierContext& ctx);
  void leave(uint32_t node, const std::string& key);
  // A get the master served read node's copy.
  void read(uint32_t node, const std::string& key, const Version& v, uint64_t bytes, const TierContext& ctx);
  // The victims ready for `node` go on its reply.
  void hand(uint32_t node, Envelope& reply, Millis now);
  void tick(const TierContext& ctx);
  // Ring B: a member of req is a T2 duplicate victim on node whose other copy is gone; if so, every
  // duplicate victim of req goes back into T2 (true).
  bool duplicate_victim_now_last(uint32_t node, const wire::ReclaimT& req, const RouteRegistry& routes);

  // (T2 bytes, T1 bytes, victims' bytes) of a node's tiers (tests, gauges).
  struct Sizes {
    uint64_t t2 = 0, t1 = 0, victims = 0, t2_capacity = 0, t1_capacity = 0;
  };
  Sizes sizes(uint32_t node) const;
  Sizes total() const;
  size_t victim_count() const;
  std::vector<uint32_t> nodes() const;
  bool in_tier1(uint32_t node, const std::string& key) const;
  // A node's T2 victims now and their state: 0 fenced (awaiting its copy), 1 to hand, 2 handed (tests).
  std::map<std::string, int> victims(uint32_t node) const;

 private:
  using RouteTier = WeightedCache<std::string, Version>;
  struct Victim {
    Version ver;
    uint64_t bytes = 0;
    enum class State : uint8_t { kFenced, kReady, kHanded } state = State::kReady;
    bool demote = false;
    // A target-role node's victim chosen because another copy served the key (ring B's first pass):
    // if that copy is gone by the time the owner fences it (a demotion relied on this one), the
    // reclaim is answered Kept and the victim goes back into T2, to be chosen again on what is true now.
    bool duplicate = false;
    Millis until = 0;  // kFenced: the fence's bound; kHanded: when it goes back to T2 if still here
    uint32_t hands = 0;
  };
  struct NodeTiers {
    std::unique_ptr<RouteTier> t2, t1;  // t2 null: no T2; t1 null: a target-role node, or no T1
    uint64_t cap2 = 0, cap1 = 0;
    // Selected out of T2, their replica not dropped yet. Bound: derived, T2's overflow (each victim
    // left T2, whose size its capacity bounds, and leaves with its replica or back into T2).
    std::map<std::string, Victim> victims;
    uint64_t victim_bytes = 0;
    std::deque<std::string> ready;  // victims to hand (checked against `victims` when handed)
  };
  void tier1_evicted(uint32_t node, const std::string& key, const Version& v, const TierContext& ctx);
  void select(uint32_t node, NodeTiers& t, const TierContext& ctx);
  // Bound: one entry per registered node.
  std::map<uint32_t, NodeTiers> tiers_;
  // (until, node, key): a fenced victim's bound, a handed victim's; stale entries are skipped. Bound:
  // derived, the timings of the last kTierHandMs / kWriteBackTaskMs (each leaves when its time passes).
  std::deque<std::tuple<Millis, uint32_t, std::string>> victim_timers_;
  static constexpr size_t kVictimsPerReply = 256;
  static constexpr uint32_t kHands = 3;
  double t2_ratio_ = 0, t1_ratio_ = 0;
};

}  // namespace fluxon
