// ReclaimRegistry: reclaim transactions, their fences, and how each ended.
#include "fluxon/master/reclaim_registry.hpp"

namespace fluxon {

void ReclaimRegistry::fence(uint32_t node, uint64_t epoch, Txn txn) {
  for (const auto& m : txn.members) fences_[{m.key, node}] = epoch;
  reclaims_.emplace(std::make_pair(node, epoch), std::move(txn));
}

void ReclaimRegistry::end(uint32_t node, uint64_t epoch, wire::ReclaimResult how, Millis now) {
  auto txn = reclaims_.find({node, epoch});
  if (txn == reclaims_.end()) return;
  for (const auto& m : txn->second.members) {
    auto f = fences_.find({m.key, node});
    if (f != fences_.end() && f->second == epoch) fences_.erase(f);
  }
  reclaims_.erase(txn);
  note_ended(node, epoch, how, wire::ReclaimBusy::None, now);
}

void ReclaimRegistry::note_ended(uint32_t node, uint64_t epoch, wire::ReclaimResult how, wire::ReclaimBusy why,
                                 Millis now) {
  ended_.set({node, epoch}, Ended{how, why}, now + ended_ttl_ms_);
}

void ReclaimRegistry::forget_node(uint32_t node, Millis now) {
  std::vector<uint64_t> epochs;
  for (const auto& [id, txn] : reclaims_)
    if (id.first == node) epochs.push_back(id.second);
  for (uint64_t e : epochs) end(node, e, wire::ReclaimResult::Aborted, now);
  ended_.erase_if([node](const ReclaimId& id, const Ended&) { return id.first == node; });
}

bool ReclaimRegistry::demotion_relies_on(const std::string& key, const Route& r, uint32_t node) const {
  if (fences_.empty()) return false;  // most of the time: no reclaim fences anything
  for (const auto& rep : r.replicas) {
    if (rep.node_id == node) continue;
    auto f = fences_.find({key, rep.node_id});
    if (f == fences_.end()) continue;
    auto t = reclaims_.find({rep.node_id, f->second});
    if (t != reclaims_.end() && t->second.demote) return true;
  }
  return false;
}

}  // namespace fluxon
