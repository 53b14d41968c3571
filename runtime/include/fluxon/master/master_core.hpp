// MasterCore: the global route table and owner registry as a plain state machine. Every request is
// answered synchronously from its envelope; identity (node, generation, put_id, get_id) makes every
// request idempotent, so duplicated or re-sent messages converge (T1, T2).
//
// A route is `key -> version + replicas`: the version is the put that wrote the value (origin node,
// origin generation, put_id); a replica is an owner slot holding those bytes. Remote gets add
// replicas: BatchGetStart picks a source replica and fences it (an activity lease: its removal is
// Busy while the get reads it), BatchGetDone publishes the requester's copy, BatchGetRevoke drops the
// get. Inflight gets are unique per (key, requester) (G6) and expire after a TTL.
#pragma once
#include "fluxon/master/master_counters.hpp"
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fluxon/master/kv_events.hpp"
#include "fluxon/master/route_table.hpp"
#include "fluxon/master/version.hpp"
#include "fluxon/runtime/expiring_map.hpp"
#include "fluxon/runtime/flat_map.hpp"
#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/weighted_cache.hpp"

namespace fluxon {

using Millis = int64_t;
// Counters: fluxon/master/master_counters.hpp.


class MasterCore {
 public:
  explicit MasterCore(Millis get_ttl_ms = 60000, std::vector<std::string> replica_roles = {"remote_cache"})
      : get_ttl_ms_(get_ttl_ms), replica_roles_(std::move(replica_roles)) {}

  // The master's two route tiers (the design's "Master 两级 Moka 提前写回", master_tiers.cpp),
  // before any owner registers; 0 = off. Per registered owner, weighted by slot size:
  //   T2 (resident, tier2_ratio of its segment, every node): over it, the node's coldest routes are
  //      selected - recoverable ones first (a target-role owner holds the same version: handed with
  //      demote) - and handed to the node on its next reply (Envelope.evict) for its fenced reclaim.
  //      On a target-role node this is the design's ring B: a bounded master index over the copies
  //      the master placed, whose Size eviction may drop the last route (a later miss).
  //   T1 (hot, tier1_ratio < tier2_ratio, source nodes only): inclusive; a route it evicts gets a
  //      write-back (a replica task from its source), a get the master serves promotes it back.
  //      With T1, a T2 victim not backed yet is fenced (E16ba): its write-back is started or
  //      awaited for at most kWriteBackTaskMs, then it goes demoted (backed) or plain (a shortfall).
  // A write-back task's time to finish (re-queued after it); a handed T2 victim's time to go.
  static constexpr Millis kWriteBackTaskMs = 10000;
  static constexpr Millis kTierHandMs = 10000;
  static constexpr uint32_t kTierPollMs = 200;  // how often an owner with tiers asks for its victims
  void set_tiers(double tier2_ratio, double tier1_ratio) { t2_ratio_ = tier2_ratio, t1_ratio_ = tier1_ratio; }
  // The KV-event log (docs/events.md): its bound, and the epoch naming it in readers' cursors (the
  // leader's term; with one master, its start time) - set before any owner registers.
  void set_kv_events(size_t capacity, uint64_t epoch) {
    events_ = KvEventLog(capacity);
    events_.set_epoch(epoch);
  }
  const KvEventLog& kv_events() const { return events_; }
  // With the cluster key: signs each started get's source range for its requester (the data plane
  // serves only granted ranges). A port: the daemon's signer holds the key and reads the wall
  // clock (grants expire by it); none in the simulation.
  struct GrantRequest {
    uint32_t requester_node;
    uint64_t requester_generation, source_generation, offset, len;
  };
  using GrantSigner = std::function<std::string(const GrantRequest&)>;
  void set_grant_signer(GrantSigner s) { grant_signer_ = std::move(s); }
  // (T2 bytes, T1 bytes, victims' bytes) of a node's tiers (tests, gauges).
  struct TierSizes {
    uint64_t t2 = 0, t1 = 0, victims = 0, t2_capacity = 0, t1_capacity = 0;
  };
  TierSizes tier_sizes(uint32_t node) const;
  std::vector<uint32_t> tier_nodes() const;  // the nodes with tiers
  bool in_tier1(uint32_t node, const std::string& key) const;
  // A node's T2 victims now and their state: 0 fenced (awaiting its copy), 1 to hand, 2 handed (tests).
  std::map<std::string, int> tier_victims(uint32_t node) const;

  // `now` drives the inflight-get TTL only.
  Envelope handle(const Envelope& req, Millis now = 0);
  // Expires inflight gets older than the TTL: their fences go, their requesters' slots stay theirs.
  void tick(Millis now);

  MasterStats stats() const;  // the gauges (with counters(): the stats reply and /metrics)
  size_t route_count() const { return routes_.size(); }
  size_t replica_count() const { return replicas_; }
  size_t owner_count() const { return owners_.size(); }
  size_t inflight_get_count() const { return gets_.size(); }
  // The bound of the prepared gets (kInflightGets unless set; tests set a small one).
  static constexpr size_t kInflightGets = size_t(1) << 20;
  void set_get_bound(size_t n) { get_bound_ = n; }
  // The containers whose size follows from others (their bounds, stated where they are declared):
  // "" when every one holds, else which does not (tests check it after every step).
  std::string derived_bounds_violation() const;
  size_t replica_tasks_queued() const { return replica_queue_.size(); }
  size_t tombstone_count() const { return tombstones_.size(); }
  size_t reclaim_count() const { return reclaims_.size(); }
  size_t reclaim_fence_count() const { return reclaim_fences_.size(); }
  bool reclaim_fenced(const std::string& key, uint32_t node) const {
    return !reclaim_fences_.empty() && reclaim_fences_.count({key, node}) != 0;  // most of the time: none
  }
  // Replica tasks handed to each target node so far (P2: replica target counts).
  const std::map<uint32_t, uint64_t>& replica_targets() const { return replica_targets_; }
  const MasterCounters& counters() const {
    // The expiring maps count their own drops.
    counters_.dropped_ended_gets_total = ended_gets_.dropped();
    counters_.dropped_tombstones_total = tombstones_.dropped();
    counters_.dropped_ended_reclaims_total = ended_reclaims_.dropped();
    counters_.dropped_writeback_tasks_total = writeback_tasks_.dropped();
    counters_.dropped_kv_events_total = events_.dropped();
    return counters_;
  }
  // The route's put_id, or 0 when there is none (tests).
  uint64_t route_put_id(const std::string& key) const;
  // Nodes holding a replica of key (tests).
  std::vector<uint32_t> replica_nodes(const std::string& key) const;
  void count_malformed() { counters_.malformed_total++; counters_.errors_total++; }

 private:
  struct Replica {
    uint32_t node_id;
    uint32_t group;      // its atomic group in its batch: (node, generation, instance, group) is its cohort
    uint64_t generation;
    uint64_t offset;
    uint64_t instance;   // the owner's local identity of this copy (its put or get batch)
    uint64_t slot_size;  // its backing slot: (node, generation, offset, slot_size) pins it (no ABA)
  };
  struct Route {
    Version ver;
    uint64_t len = 0;
    InlineList<Replica> replicas;   // never empty: the last replica's removal erases the route
  };
  struct OwnerInfo {
    uint64_t generation = 0;
    std::string role;
    uint64_t segment_len = 0;
    std::string data_host;
    uint16_t data_port = 0;
  };
  struct GetFlight {             // one prepared get of (key, requester)
    uint64_t get_id;
    uint64_t requester_generation;
    uint32_t source_node;
    Version ver;
    Millis deadline;
  };
  struct Removed {               // a node's removed replica of a key (a late duplicate stays dead)
    Version ver;
    uint64_t generation = 0;
    // A PutDone of (gen, v) is one of the removed copy's late duplicates (or older).
    bool covers(uint64_t gen, const Version& v) const;
  };
  using GetKey = std::pair<std::string, uint32_t>;  // (key, requester node)

  // A newer generation of a node replaces the old one: its memory is gone, so are its replicas.
  uint64_t admit_generation(uint32_t node_id, uint64_t generation);
  Replica* find_replica(Route& r, uint32_t node_id);
  // Removes node's replica of key; the route goes with its last replica. Returns true if removed.
  // cause: the removed event's (a static string: docs/events.md lists them).
  bool drop_replica(const std::string& key, uint32_t node_id, bool tombstone, const char* cause);
  // The route tiers (master_tiers.cpp).
  using RouteTier = WeightedCache<std::string, Version>;
  struct TierVictim {
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
    std::map<std::string, TierVictim> victims;  // selected out of T2, their replica not dropped yet
    uint64_t victim_bytes = 0;
    std::deque<std::string> ready;  // victims to hand (checked against `victims` when handed)
  };
  std::map<uint32_t, NodeTiers> tiers_;
  // (until, node, key): a fenced victim's bound, a handed victim's; stale entries are skipped.
  std::deque<std::tuple<Millis, uint32_t, std::string>> victim_timers_;
  static constexpr size_t kVictimsPerReply = 256;
  double t2_ratio_ = 0, t1_ratio_ = 0;
  void tiers_registered(uint32_t node);
  void tier_enter(uint32_t node, const std::string& key, const Version& v, uint64_t bytes);
  void tier_leave(uint32_t node, const std::string& key);
  void tier_read(uint32_t node, const std::string& key, const Version& v, uint64_t bytes);
  void tier1_evicted(uint32_t node, const std::string& key, const Version& v);
  void tier2_select(uint32_t node, NodeTiers& t);
  void tiers_tick(Millis now);
  // The victims ready for `node` go on its reply.
  void hand_victims(uint32_t node, Envelope& reply);
  // Unbacked notices: a target-role copy went and no other one is left, while sources keep theirs;
  // each source hears of it on its next reply (Envelope.unbacked), at most kUnbackedPerNode waiting.
  std::map<uint32_t, std::deque<std::string>> unbacked_;
  static constexpr size_t kUnbackedPerNode = 65536, kUnbackedPerReply = 1024;
  void note_unbacked(const std::string& key, const Route& r);
  void hand_unbacked(uint32_t node, Envelope& reply);
  // Queues a write-back replica task of key from source (once per version until kWriteBackTaskMs).
  void queue_writeback(const std::string& key, const Version& v, uint32_t source, const std::string& parent, int32_t depth,
                       Millis now, bool declinable = false);
  bool writeback_pending(const std::string& key, const Version& v, Millis now) const;
  void end_get(std::map<GetKey, GetFlight>::iterator it);
  // T1: a get id is answered once. A get that ended (done, revoked, expired) or was answered "not
  // started" (busy, miss) stays ended: get ids grow per requester generation, so a BatchGetStart
  // for an id at or below the last ended one of its (key, requester) is a late duplicate, answered
  // Miss, and nothing starts (or its fence would be held until the TTL by a get its owner forgot).
  // Kept for the get TTL; a new generation clears its own.
  void note_ended(const GetKey& gk, uint64_t get_id);
  // (key, requester) -> the highest get id ended, for the get TTL. Bound: kEndedGets (counted).
  static constexpr size_t kEndedGets = size_t(1) << 20;
  ExpiringMap<GetKey, uint64_t, std::map<GetKey, ExpiringSlot<uint64_t>>> ended_gets_{kEndedGets};
  bool fenced(const std::string& key, uint32_t node_id) const;
  // A route item's version: its origin's, or (origin_node 0) the publisher's own put.
  static Version item_version(uint32_t origin_node, uint64_t origin_generation, uint64_t origin_put_id, uint32_t node,
                              uint64_t generation, uint64_t put_id);

  Envelope put_done(const wire::PutDoneT& pd);
  Envelope get_start(const wire::BatchGetStartT& req, Millis now);
  Envelope get_done(const wire::BatchGetDoneT& req);
  Envelope get_revoke(const wire::BatchGetRevokeT& req);
  Envelope remove_routes(const wire::RemoveRoutesT& req);
  // Fenced source reclaim (master_reclaim.cpp).
  Envelope reclaim(const wire::ReclaimT& req);
  Envelope reclaim_fence(const wire::ReclaimT& req);
  Envelope reclaim_commit(const wire::ReclaimT& req);
  Envelope reclaim_abort(const wire::ReclaimT& req);
  void end_reclaim(uint32_t node, uint64_t epoch, wire::ReclaimResult how);
  enum class MemberState { kPresent, kAbsent, kChanged };
  MemberState member_state(const wire::ReclaimMemberT& m, uint32_t node, uint64_t generation);
  // The target-role owners other than `node` that hold a copy of every member's key (the route's
  // version): where a demoted cohort stays recoverable whole.
  std::vector<uint32_t> common_targets(const std::vector<std::unique_ptr<wire::ReclaimMemberT>>& members,
                                       uint32_t node) const;
  // A demotion on another node than `node` fences key (its target copy, maybe node's, must stay).
  bool demotion_relies_on(const std::string& key, uint32_t node) const;
  void add_replica(const std::string& key, Route& r, Replica rep);  // counted, in its cohort's size and tiers
  void count_cohort(uint32_t node, const Replica& rep, int delta);
  Envelope replica_poll(const wire::ReplicaPollT& req);
  Envelope write_back(const wire::WriteBackT& req, Millis now);
  bool is_replica_target(uint32_t node_id) const;
  // reclaim_fence: a member of req is a T2 duplicate victim here whose other copy is gone; if so,
  // every duplicate victim of req goes back into T2.
  bool duplicate_victim_now_last(uint32_t node, const wire::ReclaimT& req);
  // A target-role owner other than `node` is registered (replica tasks have somewhere to go).
  bool target_besides(uint32_t node) const;
  // A target-role owner other than `source` holds a replica of the route's version.
  bool backed_elsewhere(const Route& r, uint32_t source) const;

  Millis get_ttl_ms_;
  std::vector<std::string> replica_roles_;
  GrantSigner grant_signer_;
  struct ReplicaTask {
    std::string key;
    Version ver;
    uint32_t source_node;
    std::string parent;  // the page before it in its prefix ("": none), handed to the target
    int32_t depth = -1;  // its depth in that prefix (-1: not known), handed to the target
    bool declinable = false;  // an owner-hot write-back's: not handed to a target that would evict it next
  };
  std::deque<ReplicaTask> replica_queue_;            // FIFO, bounded (oldest dropped when full)
  std::map<uint32_t, uint64_t> replica_targets_;     // target node -> tasks handed to it
  struct LastPoll {
    uint64_t generation = 0, poll_id = 0;
    std::vector<std::string> keys, parents;
    std::vector<int32_t> depths;
  };
  std::map<uint32_t, LastPoll> last_poll_;           // the answer a re-sent poll gets again
  std::map<uint32_t, int32_t> keep_depth_;           // target node -> ReplicaPoll.keep_depth (-1: any)
  // Every target-role owner would take a copy at `depth` as its next victim (write-backs decline).
  bool targets_decline(int32_t depth) const;
  // Write-back tasks queued, per key: a re-sent WriteBack queues none again until the task had time
  // to finish (kWriteBackTaskMs); then a lost task (its fetch failed) is queued anew.
  // key -> the version a write-back task was queued for, until kWriteBackTaskMs. Bound: kWriteBackTasks.
  static constexpr size_t kWriteBackTasks = size_t(1) << 20;
  ExpiringMap<std::string, Version, std::unordered_map<std::string, ExpiringSlot<Version>>> writeback_tasks_{
      kWriteBackTasks};
  static constexpr size_t kReplicaQueueMax = 1 << 20;
  RouteTable<Route> routes_;
  // A batch's keys prepared for lookup (their misses overlap): probes_[i] is the i-th key's.
  std::vector<RouteTable<Route>::Probe> probes_;
  template <class KeyAt>
  void prepare_probes(size_t n, KeyAt key_at);
  size_t replicas_ = 0;
  // A tombstone only has to outlive the late duplicates of its PutDone (retries are seconds apart):
  // it expires after kTombstoneMs, so removed keys do not grow the table forever.
  // Per (key, node): a late PutDone (a duplicate, a re-publication that crossed the removal) of that
  // version or an older one from that node's generation is refused, whether or not another node's
  // copy keeps the route: it would route to a slot the node has freed.
  // Keyed by the key's 128-bit fingerprint (two independent 64-bit hashes), not its bytes: a
  // tombstone is three words, found in O(1). Two keys sharing a fingerprint (odds ~2^-128 a pair)
  // would at worst refuse one's put as Exists: a cache miss, never a wrong route.
  struct TombKey {
    uint64_t a = 0, b = 0;
    uint32_t node = 0;
    bool operator==(const TombKey&) const = default;
  };
  struct TombHash {
    size_t operator()(const TombKey& k) const noexcept { return k.a ^ (uint64_t(k.node) * 0x9e3779b97f4a7c15ull); }
  };
  static TombKey tomb_key(std::string_view key, uint32_t node);
  // Bound: kTombstones (counted: a tombstone dropped early lets a late duplicate of its copy in).
  static constexpr size_t kTombstones = size_t(1) << 22;
  ExpiringMap<TombKey, Removed, FlatMap<TombKey, ExpiringSlot<Removed>, TombHash>> tombstones_{kTombstones};
  void entomb(const std::string& key, uint32_t node, const Version& ver, uint64_t generation);
  // Per node, the newest generation its own versions were entombed under and the highest put_id
  // entombed in it: a node's own item newer than that (its put_ids grow) has no tombstone, so a
  // fresh put skips the lookup, a miss in a table of millions. Bound: one entry per node.
  struct OwnEntombed {
    uint64_t generation = 0, put_id = 0;
  };
  std::unordered_map<uint32_t, OwnEntombed> own_entombed_;
  bool tomb_possible(uint32_t node, uint64_t generation, uint64_t put_id) const;
  bool entombed(const std::string& key, uint32_t node, uint64_t generation, const Version& v) const;
  static constexpr Millis kTombstoneMs = 10 * 60 * 1000;
  Millis now_ = 0;
  std::map<uint32_t, OwnerInfo> owners_;
  // Prepared remote gets: (key, requester) -> the get, until its done or revoke, its TTL or its
  // requester's restart. Bound: get_bound_ (kInflightGets): at it a new get is answered Busy (the
  // requester's miss for now), counted (refused_gets_total).
  std::map<GetKey, GetFlight> gets_;
  size_t get_bound_ = kInflightGets;
  // Activity leases: (key, source node) -> the gets of gets_ reading that replica now. Bound: derived,
  // one entry per source some get reads, the counts summing to gets_.size().
  std::map<std::pair<std::string, uint32_t>, uint32_t> reads_;
  // Cohort sizes: (node, generation, instance, group) -> replicas of that cohort in the table. A
  // reclaim's members must be all of them (the cohort's closure), never part. Bound: derived, one
  // entry per cohort with a replica in the table, the counts summing to replica_count().
  using CohortKey = std::tuple<uint32_t, uint64_t, uint64_t, uint32_t>;
  struct CohortHash {
    size_t operator()(const CohortKey& k) const noexcept {
      const auto& [node, gen, instance, group] = k;
      return MixHash{}(instance * 0x9e3779b97f4a7c15ull ^ (gen << 20) ^ (uint64_t(node) << 40) ^ group);
    }
  };
  FlatMap<CohortKey, uint32_t, CohortHash> cohorts_;
  // Reclaim transactions, (node, epoch) -> the fenced members; (key, node) -> the epoch fencing it.
  // While fenced a replica is no get's source, its key takes no put from that node, and no other
  // removal touches it; while a demotion fences a key, no other node's copy of it is fenced.
  struct ReclaimMember {
    std::string key;
    Version ver;
    uint64_t instance = 0, offset = 0, slot_size = 0;
    uint32_t group = 0;
  };
  struct ReclaimTxn {
    uint64_t generation = 0;
    std::vector<ReclaimMember> members;
    bool demote = false;  // single-copy demotion: the target copies it relies on stay while it stands
  };
  std::map<std::pair<uint32_t, uint64_t>, ReclaimTxn> reclaims_;
  std::map<std::pair<std::string, uint32_t>, uint64_t> reclaim_fences_;
  // Ended epochs and how (committed, aborted, or a Fence answered anything but Fenced), kept for the
  // get TTL: a late duplicate of an ended epoch's Fence gets that answer again — never a fence that
  // nobody will lift (its owner moved on to another epoch).
  struct EndedReclaim {
    wire::ReclaimResult result = wire::ReclaimResult::Completed;
    wire::ReclaimBusy busy = wire::ReclaimBusy::None;
  };
  // (node, epoch) -> how a reclaim ended, for the get TTL. Bound: kEndedReclaims (counted).
  static constexpr size_t kEndedReclaims = size_t(1) << 16;
  using ReclaimId = std::pair<uint32_t, uint64_t>;
  ExpiringMap<ReclaimId, EndedReclaim, std::map<ReclaimId, ExpiringSlot<EndedReclaim>>> ended_reclaims_{kEndedReclaims};
  void note_reclaim_ended(uint32_t node, uint64_t epoch, wire::ReclaimResult how,
                          wire::ReclaimBusy why = wire::ReclaimBusy::None);
  // Bound: its capacity (kv_event_log_capacity; 0 until set_kv_events), the oldest dropped, counted.
  KvEventLog events_;
  Envelope kv_events_read(const wire::KvEventsReqT& req);
  mutable MasterCounters counters_;  // mutable: counters() reads the maps' drop counts in
};

}  // namespace fluxon
