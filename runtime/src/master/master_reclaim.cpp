// MasterCore's steps of fenced source reclaim (the design's BatchEvictOwnerSource); the
// transactions, keyed by (node, epoch), and the fences they hold are ReclaimRegistry's. The owner
// drives the transaction (the master never calls an owner); every step is idempotent on its identity.
//
//   owner                                   master
//   Fence(epoch, exact cohort)      ->      generation, closure, versions, backing, no lease:
//                                   <-      Fenced (all members fenced) | Completed | Stale | RetryableBusy
//   Prepare: no holder, put or fetch        (fenced: no get source, no put, no removal, no demotion)
//   release the slots (one pool update)
//   Commit(epoch)                   ->      the exact replicas go (the last route may), fences go
//                                   <-      Completed
//   or Abort(epoch)                 ->      fences go                          <- Aborted
//
// Single-copy demotion is the same transaction with `demote`: the Fence also requires a copy of
// each member's version on a target-role owner (else Kept, nothing fenced), and while it stands no
// reclaim or removal of those target copies proceeds (Busy), so the Commit leaves the route.
#include <algorithm>
#include <map>
#include <unordered_set>

#include "fluxon/owner/local_index.hpp"  // tp_siblings
#include "fluxon/master/master_core.hpp"

namespace fluxon {

namespace {

Envelope answer(uint64_t epoch, wire::ReclaimResult r, wire::ReclaimBusy why = wire::ReclaimBusy::None) {
  wire::ReclaimReplyT rep;
  rep.epoch = epoch;
  rep.result = r;
  rep.busy = why;
  return make_envelope(std::move(rep));
}

}  // namespace

Envelope MasterCore::reclaim(const wire::ReclaimT& req) {
  auto& c = reclaims_.counters;
  c.reclaim_requests_total++;
  if (req.generation > routes_.owner(req.node_id).generation) admit_generation(req.node_id, req.generation);
  if (req.generation < routes_.owner(req.node_id).generation) {
    // An old generation's memory is gone, and its replicas with it: nothing to fence or remove.
    c.reclaim_stale_total++;
    return answer(req.epoch, wire::ReclaimResult::Stale);
  }
  switch (req.step) {
    case wire::ReclaimStep::Fence: return reclaim_fence(req);
    case wire::ReclaimStep::Commit: return reclaim_commit(req);
    case wire::ReclaimStep::Abort: return reclaim_abort(req);
  }
  router_counters_.malformed_total++;
  return error_envelope(Status(Code::kMalformedMessage, "Reclaim: unknown step"));
}

// A member's replica on the caller: present (the exact version, generation, copy and backing slot),
// absent (no replica of this version there), or changed (the key moved on to another version, or
// the node's copy is another backing: the request is stale, never applied to the newer one).
MasterCore::MemberState MasterCore::member_state(const wire::ReclaimMemberT& m, uint32_t node,
                                                 uint64_t generation) const {
  const Route* route = routes_.route(m.key);
  if (!route) return MemberState::kAbsent;
  const Route& r = *route;
  if (!(r.ver == Version{m.origin_node, m.origin_generation, m.put_id})) return MemberState::kChanged;
  for (const auto& rep : r.replicas) {
    if (rep.node_id != node) continue;
    const bool exact = rep.generation == generation && rep.instance == m.instance && rep.offset == m.offset &&
                       rep.slot_size == m.slot_size;
    return exact ? MemberState::kPresent : MemberState::kChanged;
  }
  return MemberState::kAbsent;
}

std::vector<uint32_t> MasterCore::common_targets(const std::vector<std::unique_ptr<wire::ReclaimMemberT>>& members,
                                                 uint32_t node) const {
  std::vector<uint32_t> common;
  bool first = true;
  for (const auto& m : members) {
    std::vector<uint32_t> here;
    if (const Route* r = routes_.route(m->key))
      for (const auto& rep : r->replicas)
        if (rep.node_id != node && routes_.is_replica_target(rep.node_id)) here.push_back(rep.node_id);
    if (first) common = std::move(here);
    else std::erase_if(common, [&](uint32_t t) { return std::find(here.begin(), here.end(), t) == here.end(); });
    first = false;
    if (common.empty()) break;
  }
  return common;
}

bool MasterCore::demotion_relies_on(const std::string& key, uint32_t node) const {
  if (reclaims_.fence_count() == 0) return false;  // most of the time: no reclaim fences anything
  const Route* r = routes_.route(key);
  return r && reclaims_.demotion_relies_on(key, *r, node);
}

Envelope MasterCore::reclaim_fence(const wire::ReclaimT& req) {
  auto& c = reclaims_.counters;
  const uint32_t node = req.node_id;
  if (req.demote) c.owner_hot_demotion_attempts++;
  if (reclaims_.find(node, req.epoch)) {  // a replay: the fences this identity installed stand
    c.reclaim_in_progress_total++;
    return answer(req.epoch, wire::ReclaimResult::AlreadyInProgress);
  }
  if (const ReclaimRegistry::Ended* e = reclaims_.ended(node, req.epoch)) {
    // A duplicate of an attempt that ended: the answer it ended with, and nothing installed.
    c.reclaim_replays_total++;
    return answer(req.epoch, e->result, e->busy);
  }
  auto ended = [&](wire::ReclaimResult how, wire::ReclaimBusy why = wire::ReclaimBusy::None) {
    reclaims_.note_ended(node, req.epoch, how, why, now_);
    return answer(req.epoch, how, why);
  };
  size_t present = 0, absent = 0;
  for (const auto& m : req.members) {
    switch (member_state(*m, node, req.generation)) {
      case MemberState::kPresent: present++; break;
      case MemberState::kAbsent: absent++; break;
      case MemberState::kChanged:  // version isolation and backing identity: never another copy
        c.reclaim_stale_total++;
        return ended(wire::ReclaimResult::Stale);
    }
  }
  auto busy = [&](wire::ReclaimBusy why, uint64_t& counter) {
    counter++;
    return ended(wire::ReclaimResult::RetryableBusy, why);  // the owner asks anew
  };
  if (present == 0) {  // every source is gone already: nothing to fence
    // The owner frees the slots on this answer: a re-publication of these copies that crosses it
    // (sent before, arriving after) stays refused.
    for (const auto& m : req.members)
      routes_.entomb(m->key, node, Version{m->origin_node, m->origin_generation, m->put_id}, req.generation, now_);
    c.reclaim_completed_total++;
    return ended(wire::ReclaimResult::Completed);
  }
  // A partial cohort is never taken for a new transaction.
  if (absent > 0) return busy(wire::ReclaimBusy::Partial, c.reclaim_busy_partial_total);
  // Ring B: a target-role node's T2 victim chosen as a duplicate whose other copy went meanwhile
  // (its source demoted it, relying on this one): not this way - back into T2, chosen again.
  if (!req.demote && tiers_.duplicate_victim_now_last(node, req, routes_)) {
    tiers_.counters.tier2_duplicate_kept_total++;
    return ended(wire::ReclaimResult::Kept);
  }
  // Demotion: never the last copy - one target-role owner holds a copy of every member's version
  // (every TP rank's group recoverable from the same owner, E16ap), else the cohort stays.
  if (req.demote && common_targets(req.members, node).empty()) {
    c.demote_kept_total++;
    return ended(wire::ReclaimResult::Kept);
  }
  // Closure: the members are every replica of their cohorts on this node and, with tp_closure, the
  // other TP ranks' copies of their keys there.
  std::map<CohortKey, uint32_t> asked;
  std::unordered_set<std::string> keys;
  for (const auto& m : req.members) {
    asked[CohortKey{node, req.generation, m->instance, m->group}]++;
    keys.insert(m->key);
  }
  for (const auto& [cohort, n] : asked)
    if (routes_.cohort_size(cohort) != n) return busy(wire::ReclaimBusy::Closure, c.reclaim_busy_closure_total);
  if (req.tp_closure)
    for (const auto& m : req.members)
      for (const auto& sib : tp_siblings(m->key)) {
        if (keys.count(sib)) continue;
        const Route* r = routes_.route(sib);
        if (!r) continue;
        for (const auto& rep : r->replicas)
          if (rep.node_id == node && rep.generation == req.generation)
            return busy(wire::ReclaimBusy::Closure, c.reclaim_busy_closure_total);
      }
  // Linearisation: a get or replica pull reading a member holds a lease; another reclaim its fence.
  for (const auto& m : req.members) {
    if (gets_.reading(m->key, node)) return busy(wire::ReclaimBusy::Activity, c.reclaim_busy_activity_total);
    if (reclaims_.fenced(m->key, node)) return busy(wire::ReclaimBusy::OtherReclaim, c.reclaim_busy_other_total);
    // A demotion elsewhere relies on this copy; a demotion waits while the copy it relies on is
    // being reclaimed.
    if (demotion_relies_on(m->key, node)) {
      c.demote_relied_busy_total++;
      return busy(wire::ReclaimBusy::OtherReclaim, c.reclaim_busy_other_total);
    }
    if (req.demote)
      for (const auto& rep : routes_.route(m->key)->replicas)
        if (rep.node_id != node && reclaims_.fenced(m->key, rep.node_id))
          return busy(wire::ReclaimBusy::OtherReclaim, c.reclaim_busy_other_total);
  }
  // All members fenced, in this one step (or none above).
  ReclaimRegistry::Txn txn{req.generation, {}, req.demote};
  for (const auto& m : req.members)
    txn.members.push_back(ReclaimRegistry::Member{m->key, Version{m->origin_node, m->origin_generation, m->put_id},
                                                  m->instance, m->offset, m->slot_size, m->group});
  reclaims_.fence(node, req.epoch, std::move(txn));
  c.reclaim_fenced_total++;
  return answer(req.epoch, wire::ReclaimResult::Fenced);
}

Envelope MasterCore::reclaim_commit(const wire::ReclaimT& req) {
  auto& c = reclaims_.counters;
  const uint32_t node = req.node_id;
  // The owner released the backing already: the exact replicas go whatever else happened (a
  // committed backing never rolls back), the fences last, so no new request saw the freed slot.
  const ReclaimRegistry::Txn* txn = reclaims_.find(node, req.epoch);
  const bool demote = txn && txn->demote;
  size_t removed = 0;
  for (const auto& m : req.members) {
    if (member_state(*m, node, req.generation) != MemberState::kPresent) continue;
    const uint64_t len = routes_.route(m->key)->len;
    drop_replica(m->key, node, true, demote ? "demoted" : "reclaimed");
    removed++;
    c.reclaim_replicas_removed_total++;
    (routes_.count(m->key) ? routes_.counters.removed_with_copies_left_total
                           : routes_.counters.removed_last_copy_total)++;
    if (demote) {
      c.demoted_keys_total++;
      c.owner_hot_demotion_selected_bytes += len;
    }
  }
  if (demote) c.owner_hot_demotion_cohorts++;
  if (txn) {
    reclaims_.end(node, req.epoch, wire::ReclaimResult::Completed, now_);
    c.reclaim_completed_total++;
    return answer(req.epoch, wire::ReclaimResult::Completed);
  }
  if (removed == 0) {  // a replay of an answered commit
    c.reclaim_completed_total++;
    return answer(req.epoch, wire::ReclaimResult::Completed);
  }
  c.reclaim_commit_unfenced_total++;  // no transaction, members found: removed, and said so
  c.reclaim_stale_total++;
  return answer(req.epoch, wire::ReclaimResult::Stale);
}

Envelope MasterCore::reclaim_abort(const wire::ReclaimT& req) {
  auto& c = reclaims_.counters;
  if (!reclaims_.find(req.node_id, req.epoch)) {  // no such transaction (a replay, or never fenced)
    c.reclaim_stale_total++;
    return answer(req.epoch, wire::ReclaimResult::Stale);
  }
  reclaims_.end(req.node_id, req.epoch, wire::ReclaimResult::Aborted, now_);
  c.reclaim_aborted_total++;
  return answer(req.epoch, wire::ReclaimResult::Aborted);
}

}  // namespace fluxon
