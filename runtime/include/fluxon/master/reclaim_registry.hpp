// ReclaimRegistry: the master's fenced source reclaims, a component of MasterCore (the design's
// BatchEvictOwnerSource; the steps are in master_reclaim.cpp). Transactions keyed by (node, epoch),
// the fences they hold on their members, and how each ended, kept for the get TTL: a late duplicate
// of an ended epoch's Fence gets that answer again, never a fence nobody will lift.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fluxon/master/master_counters.hpp"
#include "fluxon/master/route_registry.hpp"
#include "fluxon/master/version.hpp"
#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/expiring_map.hpp"

namespace fluxon {

class ReclaimRegistry {
 public:
  struct Member {
    std::string key;
    Version ver;
    uint64_t instance = 0, offset = 0, slot_size = 0;
    uint32_t group = 0;
  };
  struct Txn {
    uint64_t generation = 0;
    std::vector<Member> members;
    bool demote = false;  // single-copy demotion: the target copies it relies on stay while it stands
  };
  struct Ended {  // committed, aborted, or a Fence answered anything but Fenced
    wire::ReclaimResult result = wire::ReclaimResult::Completed;
    wire::ReclaimBusy busy = wire::ReclaimBusy::None;
  };
  static constexpr size_t kEndedReclaims = size_t(1) << 16;
  explicit ReclaimRegistry(Millis ended_ttl_ms, size_t ended_bound = kEndedReclaims)
      : ended_ttl_ms_(ended_ttl_ms), ended_(ended_bound) {}

  MasterReclaimsCounters counters;

  size_t size() const { return reclaims_.size(); }
  size_t fence_count() const { return fences_.size(); }
  // While fenced, a replica is no get's source, its key takes no put from that node, and no other
  // removal touches it.
  bool fenced(const std::string& key, uint32_t node) const {
    return !fences_.empty() && fences_.count({key, node}) != 0;  // most of the time: none
  }
  const Txn* find(uint32_t node, uint64_t epoch) const {
    auto it = reclaims_.find({node, epoch});
    return it == reclaims_.end() ? nullptr : &it->second;
  }
  const Ended* ended(uint32_t node, uint64_t epoch) const { return ended_.find({node, epoch}); }
  // Every member fenced, in one step.
  void fence(uint32_t node, uint64_t epoch, Txn txn);
  // The transaction's fences go; it is remembered as ended `how`.
  void end(uint32_t node, uint64_t epoch, wire::ReclaimResult how, Millis now);
  void note_ended(uint32_t node, uint64_t epoch, wire::ReclaimResult how, wire::ReclaimBusy why, Millis now);
  // The node restarted: its reclaims died with its memory (aborted), and its new generation numbers
  // its epochs from the start again.
  void forget_node(uint32_t node, Millis now);
  // A demotion on another node than `node` fences key (its target copy, maybe node's, must stay):
  // r is key's route.
  bool demotion_relies_on(const std::string& key, const Route& r, uint32_t node) const;
  void expire(Millis now) { ended_.expire(now); }
  // Its table, with the drops its bounded map counted.
  MasterReclaimsCounters table() const {
    MasterReclaimsCounters c = counters;
    c.dropped_ended_reclaims_total = ended_.dropped();
    return c;
  }

 private:
  Millis ended_ttl_ms_;
  // (node, epoch) -> the fenced members. Bound: derived, one per reclaim an owner runs (each owner
  // runs a bounded number at once: its reclaim debt).
  std::map<std::pair<uint32_t, uint64_t>, Txn> reclaims_;
  // (key, node) -> the epoch fencing it. Bound: derived, the members of reclaims_.
  std::map<std::pair<std::string, uint32_t>, uint64_t> fences_;
  // (node, epoch) -> how a reclaim ended, for the get TTL. Bound: kEndedReclaims unless set (counted:
  // a duplicate Fence of a dropped epoch is decided afresh).
  using ReclaimId = std::pair<uint32_t, uint64_t>;
  ExpiringMap<ReclaimId, Ended, std::map<ReclaimId, ExpiringSlot<Ended>>> ended_;
};

}  // namespace fluxon
