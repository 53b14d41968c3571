// The owner's local reserve pool (SPEC §4): the segment is cut into grants; a grant serving a slot
// class is cut into exact-fit slots of that class. S1: the unit of use and reuse is one slot; a grant
// is only a container and goes back (shrink) only when every slot in it is Free.
// Plain state machine: no I/O, no clock, no threads. The owner core serialises calls.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fluxon/runtime/status.hpp"

namespace fluxon {

constexpr uint64_t kMinSlotBytes = 4096;
constexpr uint64_t kDefaultGrantBytes = 512ull << 20;

uint64_t slot_size_for(uint64_t value_len);

struct ExpectedCapacity {
  uint64_t value_len = 0;
  uint64_t payload_capacity_bytes = 0;
};

struct ExpectedGrants {
  uint64_t slot_size = 0;
  uint64_t slots_per_grant = 0;
  uint64_t expected_grants = 0;
};
// slots_per_grant = floor(grant / slot_size); expected = ceil(payload / (slots_per_grant*slot_size)).
Result<ExpectedGrants> expected_grants(const ExpectedCapacity& cap, uint64_t grant_bytes);

enum class SlotState : uint8_t { kFree, kPrepared, kPendingLocalVisible, kPending, kCommitted };
const char* slot_state_name(SlotState s);

// Slot identity: grant index and slot index inside the grant.
struct SlotRef {
  uint32_t grant = 0;
  uint32_t index = 0;
  uint64_t packed() const { return (uint64_t(grant) << 32) | index; }
  static SlotRef unpack(uint64_t v) { return {uint32_t(v >> 32), uint32_t(v)}; }
  bool operator==(const SlotRef&) const = default;
};

struct Slot {
  SlotState state = SlotState::kFree;
  bool route_live = false;     // a live master route references this slot
  uint32_t holder_refs = 0;    // resident holder (precommit entry) + exported holdings
};

struct PoolCounts {
  uint64_t free = 0, prepared = 0, pending_local_visible = 0, pending = 0, committed = 0;
  uint64_t grants = 0;          // grants serving a slot class
  uint64_t grants_total = 0;    // grants the segment can hold
  uint64_t grant_limit = 0;     // hard limit (expected grants when configured)
};

class ReservePool {
 public:
  ReservePool(uint64_t segment_bytes, uint64_t grant_bytes, std::optional<ExpectedCapacity> expected);

  uint64_t grant_bytes() const { return grant_bytes_; }
  uint64_t slot_offset(SlotRef r) const;
  // The slot that starts at `offset`, if a grant serving a class holds one there.
  std::optional<SlotRef> slot_at(uint64_t offset) const;
  uint64_t slot_size(SlotRef r) const { return grants_[r.grant].slot_size; }
  const Slot& slot(SlotRef r) const { return grants_[r.grant].slots[r.index]; }

  // Claims n Free slots of the class of value_len, all or nothing, moving them to Prepared.
  // Returns nullopt when the pool cannot satisfy the claim now (the caller waits and retries);
  // NoSpace when it never could (more slots than the configured capacity of the class).
  Result<std::optional<std::vector<SlotRef>>> try_claim(uint64_t value_len, uint32_t n);

  // Prepared -> Free (put_abort, validation failure after claim).
  void abort(SlotRef r);
  // Prepared -> PendingLocalVisible; the precommit entry takes the resident holder (V1).
  void commit_local(SlotRef r);
  // PendingLocalVisible -> Committed: the resident holder becomes the route reference (V3).
  void route_live(SlotRef r);
  // Remote get target (Free -> Prepared -> Pending -> Committed): Prepared -> Pending before the
  // data plane writes into it; Pending -> Committed(route_live) when GetDone published it;
  // Pending -> Free when the get was revoked or found stale (never while a transfer writes it).
  void begin_pending(SlotRef r);
  void pending_live(SlotRef r);
  void pending_abort(SlotRef r);
  // The route is gone (removed, superseded, or never published). S2: Free when no holder remains.
  void route_dropped(SlotRef r);
  // A reclaim's release (the owner prepared it: no holder is left): the route reference and the
  // resident holder go in this one update, Committed -> Free; no state in between is seen.
  void reclaim(SlotRef r);
  void add_holder(SlotRef r);
  void release_holder(SlotRef r);

  PoolCounts counts() const;
  // Per slot class (slot size -> (free slots, slots of its grants)), and whether a claim could
  // still carve an unused grant (no eviction needed yet).
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> class_slots() const;
  bool can_carve() const { return grants_in_use_ < grant_limit_; }
  // Slots of class slot_size a claim could get now: its free ones and those of the grants still to
  // carve; and the most the class could ever have (every grant of it).
  uint64_t available_slots(uint64_t slot_size) const;
  uint64_t slots_at_most(uint64_t slot_size) const { return max_slots_for(slot_size); }
  // Slots of class slot_size claimed so far, a running count (what claims take between two looks).
  uint64_t claimed(uint64_t slot_size) const {
    auto c = classes_.find(slot_size);
    return c == classes_.end() ? 0 : c->second.claimed;
  }
  // Slots that became Free since the last call: the owner retries waiting claims then.
  bool take_freed() { bool f = freed_; freed_ = false; return f; }
  // Grants carved since the last call: the owner faults their memory in (a grant is a reservation).
  std::vector<uint32_t> take_new_grants() { return std::exchange(new_grants_, {}); }
  // Grants serving a class whose every slot is Free: what a shrink may give back.
  std::vector<uint32_t> idle_grants() const;
  // Gives idle grant `g` back to the segment, whole (no live compaction); false when it is not
  // idle. Capacity is unchanged (S5): a later claim carves it again.
  bool release_grant(uint32_t g);
  // A class that cannot get a slot (none free, no grant left to carve) gets a grant of another
  // class drained for it: the grant of another class with the fewest slots in use stops handing
  // out its free slots (a slot freed there stays in it), eviction takes what it holds, and once
  // every slot of it is Free the class's next claim carves it (refill's shrink). Without this a
  // new value size waited for a whole grant to empty by chance: on a full owner under steady puts
  // of one size, never (a put of another size met LocalReserveTimeout after 30 s). The grant being
  // drained for `slot_size` (chosen on the first call); none when no other class has a grant.
  std::optional<uint32_t> drain_for(uint64_t slot_size);
  bool draining(uint32_t g) const { return g < grants_.size() && grants_[g].drain_for != 0; }
  uint32_t grant_of(SlotRef r) const { return r.grant; }
  // Bytes of grant g's slots that are not Free.
  uint64_t used_bytes(uint32_t g) const {
    return uint64_t(grants_[g].slots.size() - grants_[g].free_slots) * grants_[g].slot_size;
  }

 private:
  struct Grant {
    uint64_t slot_size = 0;            // 0: not serving a class
    std::vector<Slot> slots;
    uint32_t free_slots = 0;
    uint64_t drain_for = 0;            // being drained for this slot class (0: not)
  };
  struct SlotClass {
    std::deque<SlotRef> free;          // LIFO reuse keeps hot slots warm
    uint64_t grants = 0;
    uint64_t claimed = 0;              // slots claimed so far (a running count)
  };
  bool refill(uint64_t slot_size, uint32_t need);
  void drop_grant(uint32_t g);  // an idle grant leaves its class
  void make_free(SlotRef r);
  uint64_t max_slots_for(uint64_t slot_size) const;

  uint64_t grant_bytes_;
  std::vector<Grant> grants_;
  std::map<uint64_t, SlotClass> classes_;
  uint64_t grant_limit_;
  uint64_t grants_in_use_ = 0;
  bool freed_ = false;
  std::vector<uint32_t> new_grants_;
  PoolCounts counts_;
};

}  // namespace fluxon
