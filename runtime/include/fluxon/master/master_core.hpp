// MasterCore: the master's control logic as a plain state machine (STYLE.md), a router over its
// components, as the owner's core is. Every request is answered synchronously from its envelope;
// identity (node, generation, put_id, get_id) makes every request idempotent, so duplicated or
// re-sent messages converge (T1, T2). No I/O, no threads, no clock of its own: the CAF master actor
// and the deterministic simulator drive it alike.
//
//   component         owns                                                  file
//   RouteRegistry     routes, owners, cohort sizes, tombstones, KV events   route_registry
//   GetLeases         prepared remote gets, their leases on sources (G6)    get_leases
//   ReclaimRegistry   fenced reclaim transactions, their fences             reclaim_registry
//   ReplicaPlacement  replica tasks, write-backs, unbacked notices          replica_placement
//   RouteTiers        the T1/T2 route tiers and their victims               route_tiers
//
// Each component keeps its own state, its bounds and its counter table (master_counters.hpp). They
// read one another only through const references the router hands them, and change nothing but
// their own state - save RouteTiers, which queues the write-backs it starts into the placement its
// TierContext names (the E16ba fence waits for them in the same step). The router's handlers (master_core.cpp: registration, publication, removal,
// lookups; master_gets.cpp: remote gets; master_reclaim.cpp: the reclaim steps) read the
// components and hand what one step means for another on to it, in order: a replica dropped from
// the table leaves its tiers and may leave its sources unbacked, a replica added enters them, a
// restarted owner's gets, reclaims and notices go.
//
// Remote gets: BatchGetStart picks a source replica and leases it (its removal is Busy while the
// get reads it), BatchGetDone publishes the requester's copy, BatchGetRevoke drops the get. Inflight
// gets are unique per (key, requester) (G6) and expire after a TTL.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fluxon/master/get_leases.hpp"
#include "fluxon/master/kv_events.hpp"
#include "fluxon/master/master_counters.hpp"
#include "fluxon/master/reclaim_registry.hpp"
#include "fluxon/master/replica_placement.hpp"
#include "fluxon/master/route_registry.hpp"
#include "fluxon/master/route_tiers.hpp"
#include "fluxon/master/version.hpp"
#include "fluxon/messages/codec.hpp"

namespace fluxon {

class MasterCore {
 public:
  explicit MasterCore(Millis get_ttl_ms = 60000, std::vector<std::string> replica_roles = {"remote_cache"})
      : routes_(std::move(replica_roles)), gets_(get_ttl_ms), reclaims_(get_ttl_ms) {}

  // The master's two route tiers (route_tiers.hpp), before any owner registers; 0 = off.
  static constexpr Millis kWriteBackTaskMs = ReplicaPlacement::kWriteBackTaskMs;
  static constexpr Millis kTierHandMs = RouteTiers::kTierHandMs;
  static constexpr uint32_t kTierPollMs = RouteTiers::kTierPollMs;
  void set_tiers(double tier2_ratio, double tier1_ratio) { tiers_.set_ratios(tier2_ratio, tier1_ratio); }
  // The KV-event log (docs/events.md): its bound, and the epoch naming it in readers' cursors (the
  // leader's term; with one master, its start time) - set before any owner registers.
  void set_kv_events(size_t capacity, uint64_t epoch) {
    routes_.events() = KvEventLog(capacity);
    routes_.events().set_epoch(epoch);
  }
  const KvEventLog& kv_events() const { return routes_.events(); }
  // With the cluster key: signs each started get's source range for its requester (the data plane
  // serves only granted ranges). A port: the daemon's signer holds the key and reads the wall
  // clock (grants expire by it); none in the simulation.
  struct GrantRequest {
    uint32_t requester_node;
    uint64_t requester_generation, source_generation, offset, len;
  };
  using GrantSigner = std::function<std::string(const GrantRequest&)>;
  void set_grant_signer(GrantSigner s) { grant_signer_ = std::move(s); }
  using TierSizes = RouteTiers::Sizes;
  TierSizes tier_sizes(uint32_t node) const { return tiers_.sizes(node); }
  std::vector<uint32_t> tier_nodes() const { return tiers_.nodes(); }
  bool in_tier1(uint32_t node, const std::string& key) const { return tiers_.in_tier1(node, key); }
  // A node's T2 victims now and their state: 0 fenced (awaiting its copy), 1 to hand, 2 handed (tests).
  std::map<std::string, int> tier_victims(uint32_t node) const { return tiers_.victims(node); }

  // `now` drives the TTLs.
  Envelope handle(const Envelope& req, Millis now = 0);
  // Expires inflight gets older than the TTL (their fences go, their requesters' slots stay theirs),
  // and every other expiring entry; times the tiers' victims.
  void tick(Millis now);

  MasterStats stats() const;  // the gauges (with counters(): the stats reply and /metrics)
  size_t route_count() const { return routes_.size(); }
  size_t replica_count() const { return routes_.replica_count(); }
  size_t owner_count() const { return routes_.owners().size(); }
  // Every registered owner: what it registered with and its last report (the status page).
  const std::map<uint32_t, OwnerInfo>& owners() const { return routes_.owners(); }
  size_t inflight_get_count() const { return gets_.size(); }
  // The bound of the prepared gets (kInflightGets unless set; tests set a small one).
  static constexpr size_t kInflightGets = GetLeases::kInflightGets;
  void set_get_bound(size_t n) { gets_.set_bound(n); }
  // The containers whose size follows from others (their bounds, stated where they are declared):
  // "" when every one holds, else which does not (tests check it after every step).
  std::string derived_bounds_violation() const;
  size_t replica_tasks_queued() const { return placement_.queued(); }
  size_t tombstone_count() const { return routes_.tombstone_count(); }
  size_t reclaim_count() const { return reclaims_.size(); }
  size_t reclaim_fence_count() const { return reclaims_.fence_count(); }
  bool reclaim_fenced(const std::string& key, uint32_t node) const { return reclaims_.fenced(key, node); }
  // Replica tasks handed to each target node so far (P2: replica target counts).
  const std::map<uint32_t, uint64_t>& replica_targets() const { return placement_.targets(); }
  // Every component's table in one (the stats reply, /metrics, tests).
  const MasterCounters& counters() const;
  // The route's put_id, or 0 when there is none (tests).
  uint64_t route_put_id(const std::string& key) const;
  // Nodes holding a replica of key (tests).
  std::vector<uint32_t> replica_nodes(const std::string& key) const;
  void count_malformed() { router_counters_.malformed_total++, router_counters_.errors_total++; }

 private:
  // A newer generation of a node replaces the old one: its memory is gone, so are its replicas, its
  // prepared gets, its reclaims and what it was told. Returns the replicas dropped (0: not newer).
  uint64_t admit_generation(uint32_t node_id, uint64_t generation);
  // The table's changes, handed on: a replica added enters its node's tiers; one dropped leaves
  // them, and when it was a target-role copy its sources may be left unbacked.
  void add_replica(const std::string& key, Route& r, Replica rep);
  bool drop_replica(const std::string& key, uint32_t node_id, bool tombstone, const char* cause);
  // Any get reading node's copy of key holds it, whatever version it reads; a reclaim in progress
  // holds it until it ends.
  bool fenced(const std::string& key, uint32_t node_id) const {
    return gets_.reading(key, node_id) || reclaims_.fenced(key, node_id);
  }
  TierContext tier_context() { return TierContext{routes_, gets_, reclaims_, placement_, now_}; }
  // The requests that name their node: their replies carry the node's T2 victims and unbacked notices.
  Envelope with_notices(uint32_t node, Envelope reply);

  Envelope register_owner(const wire::RegisterOwnerT& req);
  Envelope owner_report(const wire::OwnerReportT& req);
  Envelope put_done(const wire::PutDoneT& pd);
  Envelope remove_routes(const wire::RemoveRoutesT& req);
  Envelope lookup(const wire::LookupT& req);
  // Remote gets (master_gets.cpp).
  Envelope get_start(const wire::BatchGetStartT& req, Millis now);
  Envelope get_done(const wire::BatchGetDoneT& req);
  Envelope get_revoke(const wire::BatchGetRevokeT& req);
  // Fenced source reclaim (master_reclaim.cpp).
  Envelope reclaim(const wire::ReclaimT& req);
  Envelope reclaim_fence(const wire::ReclaimT& req);
  Envelope reclaim_commit(const wire::ReclaimT& req);
  Envelope reclaim_abort(const wire::ReclaimT& req);
  enum class MemberState { kPresent, kAbsent, kChanged };
  MemberState member_state(const wire::ReclaimMemberT& m, uint32_t node, uint64_t generation) const;
  // The target-role owners other than `node` that hold a copy of every member's key (the route's
  // version): where a demoted cohort stays recoverable whole.
  std::vector<uint32_t> common_targets(const std::vector<std::unique_ptr<wire::ReclaimMemberT>>& members,
                                       uint32_t node) const;
  bool demotion_relies_on(const std::string& key, uint32_t node) const;

  RouteRegistry routes_;
  GetLeases gets_;
  ReclaimRegistry reclaims_;
  ReplicaPlacement placement_;
  RouteTiers tiers_;
  GrantSigner grant_signer_;
  Millis now_ = 0;
  MasterRouterCounters router_counters_;
  mutable MasterCounters counters_;  // the union, made by counters()
};

}  // namespace fluxon
