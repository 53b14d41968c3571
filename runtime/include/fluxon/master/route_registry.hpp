// RouteRegistry: the master's route table and owner registry, a component of MasterCore.
//
// A route is `key -> version + replicas`: the version is the put that wrote the value (origin node,
// origin generation, put_id); a replica is an owner slot holding those bytes. The registry keeps
// what follows from the table with it: the replica count, the cohort sizes a reclaim's closure is
// checked against, the tombstones that keep removed copies removed, and the KV-event log every
// change is written to. It never reaches into another component: what a change means elsewhere
// (a tier to leave, an unbacked notice) comes back to the router as a value.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "fluxon/master/kv_events.hpp"
#include "fluxon/master/master_counters.hpp"
#include "fluxon/master/route_table.hpp"
#include "fluxon/master/version.hpp"
#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/expiring_map.hpp"
#include "fluxon/runtime/flat_map.hpp"

namespace fluxon {

using Millis = int64_t;

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
  InlineList<Replica> replicas;  // never empty: the last replica's removal erases the route
  Replica* find(uint32_t node_id) {
    for (auto& rep : replicas)
      if (rep.node_id == node_id) return &rep;
    return nullptr;
  }
  const Replica* find(uint32_t node_id) const { return const_cast<Route*>(this)->find(node_id); }
  // The bytes a replica's copy weighs (its slot; the value's length when the slot is not known).
  uint64_t bytes_of(const Replica& rep) const { return rep.slot_size ? rep.slot_size : len; }
};

struct OwnerInfo {
  uint64_t generation = 0;
  std::string role;
  uint64_t segment_len = 0;
  std::string data_host;
  uint16_t data_port = 0;
  // This generation registered with this master (its data address is known). A node this core
  // learned of by another request first - a resync's PutDone that overtook the RegisterOwner after
  // a failover, a new generation's first put - is not read from until it registers.
  bool registered = false;
  // The owner's last OwnerReport (the status page's row): its values by name, and when it came
  // (the master's clock; 0: none yet). At most kMaxReportValues values, names of at most
  // kMaxReportName bytes: one record per registered owner.
  static constexpr size_t kMaxReportValues = 128, kMaxReportName = 64;
  std::vector<std::pair<std::string, uint64_t>> report;
  Millis report_at = 0;
};

// (node, generation, instance, group): the replicas one atomic group of one batch left on a node.
using CohortKey = std::tuple<uint32_t, uint64_t, uint64_t, uint32_t>;

// A route item's version: its origin's, or (origin_node 0) the publisher's own put.
inline Version item_version(uint32_t origin_node, uint64_t origin_generation, uint64_t origin_put_id, uint32_t node,
                            uint64_t generation, uint64_t put_id) {
  if (origin_node == 0) return Version{node, generation, put_id};
  return Version{origin_node, origin_generation, origin_put_id};
}

class RouteRegistry {
 public:
  using Table = RouteTable<Route>;
  using iterator = Table::iterator;
  static constexpr size_t kTombstones = size_t(1) << 22;
  explicit RouteRegistry(std::vector<std::string> replica_roles, size_t tombstone_bound = kTombstones)
      : replica_roles_(std::move(replica_roles)), tombstones_(tombstone_bound) {}

  MasterRoutesCounters counters;

  // --- the table
  size_t size() const { return routes_.size(); }
  size_t replica_count() const { return replicas_; }
  iterator find(std::string_view key) const { return routes_.find(key); }
  iterator end() const { return routes_.end(); }
  size_t count(std::string_view key) const { return routes_.count(key); }
  Route* route(std::string_view key) {
    auto it = routes_.find(key);
    return it == routes_.end() ? nullptr : &it->second;
  }
  const Route* route(std::string_view key) const { return const_cast<RouteRegistry*>(this)->route(key); }
  // A batch's keys prepared for lookup (their misses overlap): probe(i) is the i-th key's, until the
  // next prepare. `key_at(i)` gives the i-th key.
  template <class KeyAt>
  void prepare(size_t n, KeyAt key_at) {
    if (probes_.size() < n) probes_.resize(n);
    for (size_t i = 0; i < n; ++i) routes_.prepare(key_at(i), probes_[i]);
    for (size_t i = 0; i < n; ++i) routes_.prefetch(probes_[i]);
  }
  iterator find_prepared(size_t i) const { return routes_.find(probes_[i]); }
  // A new route of the i-th prepared key (not in the table).
  Route& emplace_prepared(std::string_view key, size_t i, Version v, uint64_t len);
  // Adds a replica: counted, in its cohort's size, a stored event.
  void add_replica(std::string_view key, Route& r, Replica rep);
  // The node's only replica of `r` takes version v (the node's newer put of the same key): a removed
  // and a stored event, its cohort counts moved.
  void replace_own(std::string_view key, Route& r, const Version& v, uint64_t len, uint64_t offset, uint64_t instance,
                   uint32_t group, uint64_t slot_size);
  struct Dropped {
    bool dropped = false;         // the node had a replica of the key: it went
    const Route* left = nullptr;  // the route, if other replicas keep it (valid until the next change)
  };
  // Removes node's replica of key; the route goes with its last replica. cause: the removed event's
  // (a static string: docs/events.md lists them). tombstone: a late re-publication of this copy stays
  // refused.
  Dropped drop_replica(std::string_view key, uint32_t node_id, bool tombstone, const char* cause, Millis now);
  // Every key node has a replica of (a restart's scan).
  std::vector<std::string> keys_of(uint32_t node_id) const;
  // Replicas of a cohort in the table (0: none).
  uint32_t cohort_size(const CohortKey& k) const {
    const uint32_t* n = cohorts_.find(k);
    return n ? *n : 0;
  }

  // --- the owner registry
  OwnerInfo& owner(uint32_t node_id) { return owners_[node_id]; }
  const std::map<uint32_t, OwnerInfo>& owners() const { return owners_; }
  bool is_replica_target(uint32_t node_id) const;
  // A target-role owner other than `node` is registered (replica tasks have somewhere to go).
  bool target_besides(uint32_t node) const;
  // A target-role owner other than `source` holds a replica of the route's version.
  bool backed_elsewhere(const Route& r, uint32_t source) const;

  // --- tombstones: a removed copy's late re-publications stay refused.
  // A tombstone only has to outlive the late duplicates of its PutDone (retries are seconds apart):
  // it expires after kTombstoneMs, so removed keys do not grow the table forever. Per (key, node): a
  // late PutDone of that version or an older one from that node's generation is refused, whether or
  // not another node's copy keeps the route: it would route to a slot the node has freed.
  static constexpr Millis kTombstoneMs = 10 * 60 * 1000;
  void entomb(std::string_view key, uint32_t node, const Version& ver, uint64_t generation, Millis now);
  // A tombstone of (key, node) covering the copy (generation, v).
  bool entombed(std::string_view key, uint32_t node, uint64_t generation, const Version& v) const;
  // False when no tombstone can cover a node's own put (generation, put_id): it is newer than every
  // own version entombed, so a fresh put skips the lookup, a miss in a table of millions.
  bool tomb_possible(uint32_t node, uint64_t generation, uint64_t put_id) const;
  bool any_tombstone() const { return !tombstones_.empty(); }
  void prefetch_tomb(std::string_view key, uint32_t node) const { tombstones_.map().prefetch(tomb_key(key, node)); }
  // For a new route: a tombstone of (key, node) that covers (generation, v) refuses it (true); one
  // that does not is dropped (an older copy's).
  bool refuse_or_clear_tomb(std::string_view key, uint32_t node, uint64_t generation, const Version& v);
  size_t tombstone_count() const { return tombstones_.size(); }

  // --- the KV-event log (docs/events.md)
  KvEventLog& events() { return events_; }
  const KvEventLog& events() const { return events_; }
  Envelope read_events(const wire::KvEventsReqT& req);

  void expire(Millis now) { tombstones_.expire(now); }
  // Its table, with the drops its bounded maps counted.
  MasterRoutesCounters table() const {
    MasterRoutesCounters c = counters;
    c.dropped_tombstones_total = tombstones_.dropped();
    c.dropped_kv_events_total = events_.dropped();
    return c;
  }
  // "" when the cohort counts agree with the table, else what does not.
  std::string derived_bounds_violation() const;

 private:
  std::vector<std::string> replica_roles_;
  Table routes_;
  std::vector<Table::Probe> probes_;
  size_t replicas_ = 0;
  std::map<uint32_t, OwnerInfo> owners_;  // Bound: one entry per node that ever registered or asked
  // Cohort sizes: (node, generation, instance, group) -> replicas of that cohort in the table. A
  // reclaim's members must be all of them (the cohort's closure), never part. Bound: derived, one
  // entry per cohort with a replica in the table, the counts summing to replica_count().
  struct CohortHash {
    size_t operator()(const CohortKey& k) const noexcept {
      const auto& [node, gen, instance, group] = k;
      return MixHash{}(instance * 0x9e3779b97f4a7c15ull ^ (gen << 20) ^ (uint64_t(node) << 40) ^ group);
    }
  };
  FlatMap<CohortKey, uint32_t, CohortHash> cohorts_;
  void count_cohort(uint32_t node, const Replica& rep, int delta);
  struct Removed {  // a node's removed replica of a key (a late duplicate stays dead)
    Version ver;
    uint64_t generation = 0;
    // A PutDone of (gen, v) is one of the removed copy's late duplicates (or older).
    bool covers(uint64_t gen, const Version& v) const {
      return generation == gen && ver.origin_node == v.origin_node && ver.origin_generation == v.origin_generation &&
             v.put_id <= ver.put_id;
    }
  };
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
  // Bound: kTombstones unless set (counted: a tombstone dropped early lets a late duplicate of its
  // copy in).
  ExpiringMap<TombKey, Removed, FlatMap<TombKey, ExpiringSlot<Removed>, TombHash>> tombstones_;
  // Per node, the newest generation its own versions were entombed under and the highest put_id
  // entombed in it (tomb_possible). Bound: one entry per node.
  struct OwnEntombed {
    uint64_t generation = 0, put_id = 0;
  };
  std::unordered_map<uint32_t, OwnEntombed> own_entombed_;
  // Bound: its capacity (kv_event_log_capacity; 0 until MasterCore::set_kv_events), the oldest
  // dropped, counted.
  KvEventLog events_;
};

}  // namespace fluxon
