#include "fluxon/runtime/reserve_pool.hpp"

#include <algorithm>
#include <cassert>
#include <limits>

namespace fluxon {

uint64_t slot_size_for(uint64_t value_len) {
  // Saturates: a length within a slot of 2^64 would round up past it to 0, a class of no bytes
  // that every "larger than a grant" check lets through (the owner's fuzzer found one).
  constexpr uint64_t kLargest = std::numeric_limits<uint64_t>::max() / kMinSlotBytes * kMinSlotBytes;
  if (value_len > kLargest) return kLargest;
  uint64_t v = std::max(value_len, kMinSlotBytes);
  return (v + kMinSlotBytes - 1) / kMinSlotBytes * kMinSlotBytes;
}

Result<ExpectedGrants> expected_grants(const ExpectedCapacity& cap, uint64_t grant_bytes) {
  if (cap.value_len == 0) return invalid_argument("expected_capacity.value_len: must be > 0");
  if (cap.payload_capacity_bytes == 0)
    return invalid_argument("expected_capacity.payload_capacity_bytes: must be > 0");
  ExpectedGrants g;
  g.slot_size = slot_size_for(cap.value_len);
  if (g.slot_size > grant_bytes)
    return invalid_argument("expected_capacity.value_len: slot of " + std::to_string(g.slot_size) +
                            " bytes exceeds the grant of " + std::to_string(grant_bytes));
  g.slots_per_grant = grant_bytes / g.slot_size;
  const uint64_t per_grant = g.slots_per_grant * g.slot_size;
  g.expected_grants = (cap.payload_capacity_bytes + per_grant - 1) / per_grant;
  return g;
}

const char* slot_state_name(SlotState s) {
  switch (s) {
    case SlotState::kFree: return "free";
    case SlotState::kPrepared: return "prepared";
    case SlotState::kPendingLocalVisible: return "pending_local_visible";
    case SlotState::kPending: return "pending";
    case SlotState::kCommitted: return "committed";
  }
  return "?";
}

ReservePool::ReservePool(uint64_t segment_bytes, uint64_t grant_bytes,
                         std::optional<ExpectedCapacity> expected)
    : grant_bytes_(grant_bytes), grants_(segment_bytes / grant_bytes) {
  grant_limit_ = grants_.size();
  counts_.grants_total = grants_.size();
  if (expected) {
    auto eg = expected_grants(*expected, grant_bytes);
    // Config validation rejected bad values and a warm-up larger than the segment before this.
    assert(eg.ok() && eg->expected_grants <= grants_.size());
    grant_limit_ = eg->expected_grants;
    // Warm-up: the expected grants are carved at start; they are also the hard limit.
    refill(eg->slot_size, uint32_t(eg->expected_grants * eg->slots_per_grant));
  }
  counts_.grant_limit = grant_limit_;
}

uint64_t ReservePool::slot_offset(SlotRef r) const {
  return uint64_t(r.grant) * grant_bytes_ + uint64_t(r.index) * grants_[r.grant].slot_size;
}

std::optional<SlotRef> ReservePool::slot_at(uint64_t offset) const {
  const uint64_t g = offset / grant_bytes_;
  if (g >= grants_.size() || grants_[g].slot_size == 0) return std::nullopt;
  const uint64_t within = offset - g * grant_bytes_;
  if (within % grants_[g].slot_size != 0 || within / grants_[g].slot_size >= grants_[g].slots.size())
    return std::nullopt;
  return SlotRef{uint32_t(g), uint32_t(within / grants_[g].slot_size)};
}

uint64_t ReservePool::available_slots(uint64_t slot_size) const {
  auto c = classes_.find(slot_size);
  const uint64_t free = c == classes_.end() ? 0 : c->second.free.size();
  return free + uint64_t(grant_limit_ - std::min(grants_in_use_, grant_limit_)) * (grant_bytes_ / slot_size);
}

uint64_t ReservePool::max_slots_for(uint64_t slot_size) const {
  return grant_limit_ * (grant_bytes_ / slot_size);
}

bool ReservePool::refill(uint64_t slot_size, uint32_t need) {
  SlotClass& cls = classes_[slot_size];
  const uint32_t per_grant = uint32_t(grant_bytes_ / slot_size);
  while (cls.free.size() < need) {
    // An unused grant first, then shrink: a grant of another class whose slots are all Free.
    std::optional<uint32_t> pick;
    if (grants_in_use_ < grant_limit_) {
      for (uint32_t g = 0; g < grants_.size(); ++g)
        if (grants_[g].slot_size == 0) { pick = g; break; }
    }
    if (!pick) {
      for (uint32_t g = 0; g < grants_.size(); ++g) {
        Grant& gr = grants_[g];
        if (gr.slot_size != 0 && gr.slot_size != slot_size && gr.free_slots == gr.slots.size()) {
          drop_grant(g);
          pick = g;
          break;
        }
      }
    }
    if (!pick) return false;
    Grant& gr = grants_[*pick];
    gr.slot_size = slot_size;
    gr.slots.assign(per_grant, Slot{});
    gr.free_slots = per_grant;
    for (uint32_t i = per_grant; i-- > 0;) cls.free.push_back(SlotRef{*pick, i});
    cls.grants++;
    new_grants_.push_back(*pick);
    grants_in_use_++;
    counts_.grants++;
    counts_.free += per_grant;
  }
  return true;
}

void ReservePool::drop_grant(uint32_t g) {
  Grant& gr = grants_[g];
  SlotClass& cls = classes_[gr.slot_size];
  std::erase_if(cls.free, [g](SlotRef r) { return r.grant == g; });
  cls.grants--;
  counts_.free -= gr.slots.size();
  counts_.grants--;
  gr = Grant{};
  grants_in_use_--;
}

std::optional<uint32_t> ReservePool::drain_for(uint64_t slot_size) {
  std::optional<uint32_t> pick;
  for (uint32_t g = 0; g < grants_.size(); ++g) {
    const Grant& gr = grants_[g];
    if (gr.drain_for == slot_size) return g;
    if (gr.slot_size == 0 || gr.slot_size == slot_size || gr.drain_for != 0) continue;
    if (!pick || used_bytes(g) < used_bytes(*pick)) pick = g;  // the least to evict
  }
  if (!pick) return std::nullopt;
  Grant& gr = grants_[*pick];
  gr.drain_for = slot_size;
  const uint32_t g = *pick;
  std::erase_if(classes_[gr.slot_size].free, [g](SlotRef r) { return r.grant == g; });
  return pick;
}

std::vector<uint32_t> ReservePool::idle_grants() const {
  std::vector<uint32_t> out;
  for (uint32_t g = 0; g < grants_.size(); ++g)
    if (grants_[g].slot_size != 0 && grants_[g].free_slots == grants_[g].slots.size()) out.push_back(g);
  return out;
}

bool ReservePool::release_grant(uint32_t g) {
  if (g >= grants_.size() || grants_[g].slot_size == 0 || grants_[g].free_slots != grants_[g].slots.size())
    return false;
  drop_grant(g);
  return true;
}

Result<std::optional<std::vector<SlotRef>>> ReservePool::try_claim(uint64_t value_len, uint32_t n) {
  const uint64_t ss = slot_size_for(value_len);
  if (ss > grant_bytes_)
    return invalid_argument("value_len: " + std::to_string(value_len) +
                            " bytes does not fit in one grant of " + std::to_string(grant_bytes_));
  if (n > max_slots_for(ss))
    return Status(Code::kNoSpace, "batch of " + std::to_string(n) + " slots of " +
                                      std::to_string(ss) + " bytes exceeds the pool capacity of " +
                                      std::to_string(max_slots_for(ss)) + " slots");
  SlotClass& cls = classes_[ss];
  if (cls.free.size() < n && !refill(ss, n)) return std::optional<std::vector<SlotRef>>{};
  std::vector<SlotRef> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    SlotRef r = cls.free.back();
    cls.free.pop_back();
    Slot& s = grants_[r.grant].slots[r.index];
    assert(s.state == SlotState::kFree);
    s.state = SlotState::kPrepared;
    grants_[r.grant].free_slots--;
    out.push_back(r);
  }
  counts_.free -= n;
  counts_.prepared += n;
  cls.claimed += n;
  return std::optional<std::vector<SlotRef>>(std::move(out));
}

void ReservePool::make_free(SlotRef r) {
  Grant& g = grants_[r.grant];
  Slot& s = g.slots[r.index];
  s = Slot{};
  g.free_slots++;
  if (g.drain_for == 0) classes_[g.slot_size].free.push_back(r);  // a draining grant keeps its slots
  counts_.free++;
  freed_ = true;
}

void ReservePool::abort(SlotRef r) {
  [[maybe_unused]] Slot& s = grants_[r.grant].slots[r.index];
  assert(s.state == SlotState::kPrepared);
  counts_.prepared--;
  make_free(r);
}

void ReservePool::commit_local(SlotRef r) {
  Slot& s = grants_[r.grant].slots[r.index];
  assert(s.state == SlotState::kPrepared);
  s.state = SlotState::kPendingLocalVisible;
  s.holder_refs++;
  counts_.prepared--;
  counts_.pending_local_visible++;
}

void ReservePool::route_live(SlotRef r) {
  Slot& s = grants_[r.grant].slots[r.index];
  assert(s.state == SlotState::kPendingLocalVisible && s.holder_refs > 0);
  s.state = SlotState::kCommitted;
  s.route_live = true;
  s.holder_refs--;
  counts_.pending_local_visible--;
  counts_.committed++;
}

void ReservePool::reclaim(SlotRef r) {
  Slot& s = grants_[r.grant].slots[r.index];
  assert(s.state == SlotState::kCommitted && s.route_live && s.holder_refs == 0);
  s.route_live = false;
  counts_.committed--;
  make_free(r);
}

void ReservePool::begin_pending(SlotRef r) {
  Slot& s = grants_[r.grant].slots[r.index];
  assert(s.state == SlotState::kPrepared);
  s.state = SlotState::kPending;
  counts_.prepared--;
  counts_.pending++;
}

void ReservePool::pending_live(SlotRef r) {
  Slot& s = grants_[r.grant].slots[r.index];
  assert(s.state == SlotState::kPending);
  s.state = SlotState::kCommitted;
  s.route_live = true;
  counts_.pending--;
  counts_.committed++;
}

void ReservePool::pending_abort(SlotRef r) {
  [[maybe_unused]] Slot& s = grants_[r.grant].slots[r.index];
  assert(s.state == SlotState::kPending);
  counts_.pending--;
  make_free(r);
}

std::map<uint64_t, std::pair<uint64_t, uint64_t>> ReservePool::class_slots() const {
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> out;
  for (const auto& [size, cls] : classes_)
    if (cls.grants > 0) out[size] = {cls.free.size(), cls.grants * (grant_bytes_ / size)};
  return out;
}

void ReservePool::route_dropped(SlotRef r) {
  Slot& s = grants_[r.grant].slots[r.index];
  if (s.state == SlotState::kPendingLocalVisible) {
    // Never published (the master refused it): the precommit entry gives its resident holder up.
    assert(s.holder_refs > 0);
    s.holder_refs--;
    s.state = SlotState::kCommitted;  // readable until the last holder leaves
    counts_.pending_local_visible--;
    counts_.committed++;
  } else {
    assert(s.state == SlotState::kCommitted && s.route_live);
    s.route_live = false;
  }
  // S2: Free only when route_live == false && holder_ref_count == 0, in either order.
  if (!s.route_live && s.holder_refs == 0) {
    counts_.committed--;
    make_free(r);
  }
}

void ReservePool::add_holder(SlotRef r) {
  Slot& s = grants_[r.grant].slots[r.index];
  assert(s.state == SlotState::kPendingLocalVisible || s.state == SlotState::kCommitted);
  s.holder_refs++;
}

void ReservePool::release_holder(SlotRef r) {
  Slot& s = grants_[r.grant].slots[r.index];
  assert(s.holder_refs > 0);
  s.holder_refs--;
  if (s.state == SlotState::kCommitted && !s.route_live && s.holder_refs == 0) {
    counts_.committed--;
    make_free(r);
  }
}

PoolCounts ReservePool::counts() const { return counts_; }

}  // namespace fluxon
