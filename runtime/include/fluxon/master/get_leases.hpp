// GetLeases: the master's prepared remote gets, a component of MasterCore. One prepared get per
// (key, requester) (G6), each an activity lease on the source replica it reads (S2 across owners:
// while a get reads a copy, its removal is Busy), until the get is done, revoked, expired by the TTL
// or its requester restarts. A get id is answered once (T1): a get that ended stays ended.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "fluxon/master/master_counters.hpp"
#include "fluxon/master/version.hpp"
#include "fluxon/runtime/expiring_map.hpp"

namespace fluxon {

class GetLeases {
 public:
  using Millis = int64_t;
  using GetKey = std::pair<std::string, uint32_t>;  // (key, requester node)
  struct Flight {  // one prepared get of (key, requester)
    uint64_t get_id;
    uint64_t requester_generation;
    uint32_t source_node;
    Version ver;
    Millis deadline;
  };
  static constexpr size_t kEndedGets = size_t(1) << 20;
  explicit GetLeases(Millis ttl_ms, size_t ended_bound = kEndedGets) : ttl_ms_(ttl_ms), ended_gets_(ended_bound) {}

  MasterGetsCounters counters;

  Millis ttl_ms() const { return ttl_ms_; }
  size_t size() const { return gets_.size(); }
  const Flight* find(const GetKey& gk) const {
    auto it = gets_.find(gk);
    return it == gets_.end() ? nullptr : &it->second;
  }
  // Gets reading node's copy of key now (its activity leases).
  uint32_t reading(const std::string& key, uint32_t node) const {
    if (reads_.empty()) return 0;
    auto it = reads_.find({key, node});
    return it == reads_.end() ? 0 : it->second;
  }
  // Starts a get: false (counted) at the bound, nothing started - the requester's miss for now.
  bool start(const GetKey& gk, Flight f);
  // Ends the get of gk (done, revoked): its lease goes, its id is ended. False if none.
  bool end(const GetKey& gk, Millis now);
  // The get id was answered "not started" (busy, miss): ended for good.
  void note_ended(const GetKey& gk, uint64_t get_id, Millis now);
  // A get id at or below the last ended one of its (key, requester): a late duplicate.
  bool ended(const GetKey& gk, uint64_t get_id) const {
    const uint64_t* e = ended_gets_.find(gk);
    return e && get_id <= *e;
  }
  // The requester restarted: its prepared gets died with its memory, and its new generation numbers
  // its gets from the start again.
  void forget_requester(uint32_t node, Millis now);
  // Expires gets older than the TTL (their leases go; their requesters' slots stay theirs).
  void expire(Millis now);

  // The bound of the prepared gets (kInflightGets unless set; tests set a small one).
  static constexpr size_t kInflightGets = size_t(1) << 20;
  void set_bound(size_t n) { bound_ = n; }
  // Its table, with the drops its bounded map counted.
  MasterGetsCounters table() const {
    MasterGetsCounters c = counters;
    c.dropped_ended_gets_total = ended_gets_.dropped();
    return c;
  }
  // "" when the leases agree with the gets and the bound holds, else what does not.
  std::string derived_bounds_violation() const;

 private:
  void end(std::map<GetKey, Flight>::iterator it, Millis now);
  Millis ttl_ms_;
  // Prepared remote gets: (key, requester) -> the get. Bound: bound_ (kInflightGets): at it a new get
  // is answered Busy, counted (refused_gets_total).
  std::map<GetKey, Flight> gets_;
  size_t bound_ = kInflightGets;
  // Activity leases: (key, source node) -> the gets of gets_ reading that replica now. Bound: derived,
  // one entry per source some get reads, the counts summing to gets_.size().
  std::map<std::pair<std::string, uint32_t>, uint32_t> reads_;
  // (key, requester) -> the highest get id ended, for the get TTL. Bound: kEndedGets unless set
  // (counted: an id dropped early lets its late duplicate start a get nobody will end but the TTL).
  ExpiringMap<GetKey, uint64_t, std::map<GetKey, ExpiringSlot<uint64_t>>> ended_gets_;
};

}  // namespace fluxon
