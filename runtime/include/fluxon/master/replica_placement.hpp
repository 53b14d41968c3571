// ReplicaPlacement: where copies go, a component of MasterCore. Replica tasks (queued by published
// puts that ask for a replica, by owner-hot write-backs and by the tiers), pulled by target-role
// owners through ReplicaPoll; the write-back requests of source owners; and the unbacked notices a
// source hears when the last target-role copy of its key went. It reads the route table; it changes
// nothing but its own state.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "fluxon/master/master_counters.hpp"
#include "fluxon/master/route_registry.hpp"
#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/expiring_map.hpp"

namespace fluxon {

// The bounds of ReplicaPlacement's containers (tests set small ones).
struct ReplicaPlacementBounds {
  size_t queue = size_t(1) << 20;            // replica tasks waiting: the oldest dropped, counted
  size_t writeback_tasks = size_t(1) << 20;  // write-back tasks remembered: the first to expire dropped, counted
  size_t unbacked_per_node = 65536;          // unbacked notices waiting per node: new ones dropped, counted
  size_t unbacked_per_reply = 1024;          // unbacked notices one reply carries
};

class ReplicaPlacement {
 public:
  // A write-back task's time to finish: a re-sent WriteBack queues none again until then; then a lost
  // task (its fetch failed) is queued anew.
  static constexpr Millis kWriteBackTaskMs = 10000;
  struct Task {
    std::string key;
    Version ver;
    uint32_t source_node;
    std::string parent;        // the page before it in its prefix ("": none), handed to the target
    int32_t depth = -1;        // its depth in that prefix (-1: not known), handed to the target
    bool declinable = false;   // an owner-hot write-back's: not handed to a target that would evict it next
  };

  using Bounds = ReplicaPlacementBounds;
  explicit ReplicaPlacement(Bounds b = {}) : bounds_(b), writeback_tasks_(b.writeback_tasks) {}

  MasterPlacementCounters counters;

  // A published put's replica task (the caller checked that a target exists).
  void add_task(Task t);
  // Queues a write-back replica task of key from source, once per version until kWriteBackTaskMs.
  void queue_writeback(const std::string& key, const Version& v, uint32_t source, const std::string& parent,
                       int32_t depth, Millis now, bool declinable = false);
  bool writeback_pending(const std::string& key, const Version& v, Millis now) const;
  // WriteBack from a source owner: each key queued, backed, obsolete, refused or declined.
  Envelope write_back(const wire::WriteBackT& req, const RouteRegistry& routes, Millis now);
  // ReplicaPoll from a target-role owner: the tasks it takes (a re-sent poll gets the same ones).
  Envelope poll(const wire::ReplicaPollT& req, const RouteRegistry& routes);
  // A target-role copy of key went and r (its route) has no other one while sources keep theirs:
  // each source hears of it on its next reply.
  void note_unbacked(const std::string& key, const Route& r, const RouteRegistry& routes);
  void hand_unbacked(uint32_t node, Envelope& reply);
  // The node restarted: what its old generation kept and was told goes.
  void forget_node(uint32_t node) {
    unbacked_.erase(node);
    keep_depth_.erase(node);
  }
  void expire(Millis now) { writeback_tasks_.expire(now); }

  size_t queued() const { return queue_.size(); }
  // Replica tasks handed to each target node so far (P2: replica target counts).
  const std::map<uint32_t, uint64_t>& targets() const { return targets_; }
  // Its table, with the drops its bounded map counted.
  MasterPlacementCounters table() const {
    MasterPlacementCounters c = counters;
    c.dropped_writeback_tasks_total = writeback_tasks_.dropped();
    return c;
  }

 private:
  void push(Task t);
  // Every target-role owner would take a copy at `depth` as its next victim (write-backs decline).
  bool targets_decline(int32_t depth, const RouteRegistry& routes) const;
  Bounds bounds_;
  // FIFO. Bound: bounds_.queue, the oldest dropped when full, counted (dropped_replica_tasks_total).
  std::deque<Task> queue_;
  std::map<uint32_t, uint64_t> targets_;  // target node -> tasks handed to it. Bound: one per node
  struct LastPoll {
    uint64_t generation = 0, poll_id = 0;
    std::vector<std::string> keys, parents;
    std::vector<int32_t> depths;
  };
  std::map<uint32_t, LastPoll> last_poll_;  // the answer a re-sent poll gets again. Bound: one per node
  std::map<uint32_t, int32_t> keep_depth_;  // target node -> ReplicaPoll.keep_depth (-1: any). One per node
  // key -> the version a write-back task was queued for, until kWriteBackTaskMs. Bound:
  // bounds_.writeback_tasks (counted).
  ExpiringMap<std::string, Version, std::unordered_map<std::string, ExpiringSlot<Version>>> writeback_tasks_;
  // Unbacked notices per source node. Bound: bounds_.unbacked_per_node each (counted); one entry per node.
  std::map<uint32_t, std::deque<std::string>> unbacked_;
};

}  // namespace fluxon
