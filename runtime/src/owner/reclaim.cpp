#include "fluxon/owner/reclaim.hpp"

#include <algorithm>

namespace fluxon {

void Reclaim::begin(std::vector<Member> members, Millis now, Outbox& out, bool demote) {
  if (members.empty()) return;
  const uint64_t id = next_id_++;
  Txn t;
  t.demote = demote;
  for (auto& m : members) {
    m.bytes = s_.pool.slot_size(m.e.slot);
    if (!demote) debt_bytes_ += m.bytes;
    const LocalIndex::CohortId c{m.e.put_id, m.e.group};
    if (cohorts_.emplace(c, id).second) t.cohorts.push_back(c);
  }
  if (demote)
    s_.counters.demote_started_keys_total += members.size();
  else
    s_.counters.reclaim_started_total++;
  t.members = std::move(members);
  t.epoch = s_.new_unique();
  auto [it, _] = txns_.emplace(id, std::move(t));
  send(id, it->second, now, out);
}

void Reclaim::send(uint64_t id, Txn& t, Millis now, Outbox& out) {
  wire::ReclaimT r;
  r.node_id = s_.cfg.node_id;
  r.generation = s_.generation;
  r.epoch = t.epoch;  // T1: every attempt of a step carries the same epoch
  r.tp_closure = s_.cfg.eviction_tp_cohorts;
  r.demote = t.demote;
  r.step = t.phase == Phase::kCommitting ? wire::ReclaimStep::Commit
           : t.phase == Phase::kAborting ? wire::ReclaimStep::Abort
                                         : wire::ReclaimStep::Fence;
  for (const Member& m : t.members) {
    auto w = std::make_unique<wire::ReclaimMemberT>();
    w->key = m.key;
    w->origin_node = m.e.ver.origin_node;
    w->origin_generation = m.e.ver.origin_generation;
    w->put_id = m.e.ver.put_id;
    w->instance = m.e.put_id;
    w->group = m.e.group;
    w->offset = s_.pool.slot_offset(m.e.slot);
    w->slot_size = m.bytes;
    r.members.push_back(std::move(w));
  }
  const uint64_t tok = s_.new_token(JobKind::kReclaim);
  txns_.attempt(id, tok);
  txns_.schedule(id, now + s_.cfg.publish_retry_ms);
  s_.to_master(tok, make_envelope(std::move(r)), out);
}

bool Reclaim::is_current(const Member& m) const {
  auto it = s_.local.find(m.key);
  return it != s_.local.end() && it->second.put_id == m.e.put_id && it->second.slot == m.e.slot && it->second.live;
}

void Reclaim::on_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out, const BusyCheck& busy) {
  auto id = txns_.id_of(token);
  if (!id) return;
  auto it = txns_.find(*id);
  auto* rr = reply.body.AsReclaimReply();
  if (it == txns_.end() || !rr || rr->epoch != it->second.epoch) return;  // another attempt's answer
  Txn& t = it->second;
  txns_.forget(*id);  // answered: a later reply to an earlier attempt finds nothing
  using R = wire::ReclaimResult;
  switch (t.phase) {
    case Phase::kFencing:
      switch (rr->result) {
        case R::Fenced:
        case R::AlreadyInProgress: return prepare(*id, t, true, now, out, busy);
        case R::Completed: return prepare(*id, t, false, now, out, busy);  // no replica left to fence
        case R::Aborted: return back_off(*id, t, now);  // (an ended attempt's answer: nothing fenced)
        case R::Kept:  // a demotion without its target copy, or a T2 victim now a last copy: it stays
          if (t.demote) s_.counters.demote_kept_total++;
          else s_.counters.reclaim_kept_last_copy_total++;
          restore(t, End::kKept);
          return finish(it);
        case R::RetryableBusy:
          switch (rr->busy) {
            case wire::ReclaimBusy::Activity: s_.counters.reclaim_master_activity_total++; break;
            case wire::ReclaimBusy::Partial: s_.counters.reclaim_master_partial_total++; break;
            case wire::ReclaimBusy::Closure: s_.counters.reclaim_master_closure_total++; break;
            default: s_.counters.reclaim_master_other_total++; break;
          }
          return back_off(*id, t, now);
        default:  // Stale: the route or this generation moved on; the pending selection ends
          s_.counters.reclaim_route_changed_total++;
          restore(t, End::kObsolete);
          return finish(it);
      }
    case Phase::kCommitting:  // Completed, or Stale (removed without a fence): the replicas are gone
      committed(t);
      if (t.attempts > 0) s_.counters.reclaim_retry_completed_total++;
      return finish(it);
    case Phase::kAborting:  // Aborted, or Stale (nothing was fenced): the fences are gone
      return back_off(*id, t, now);
    case Phase::kWaiting: return;  // not expecting an answer
  }
}

void Reclaim::prepare(uint64_t id, Txn& t, bool fenced, Millis now, Outbox& out, const BusyCheck& busy) {
  // Prepare: every member is still the copy selected, no reader holds it (an exported holding),
  // and no put, fetch or re-publication of its key is on its way here. All of them, or none.
  bool obsolete = false;
  const char* why = nullptr;
  for (const Member& m : t.members) {
    if (!is_current(m)) {
      obsolete = true;
      continue;
    }
    if (s_.pool.slot(m.e.slot).holder_refs > 0) {
      why = "holder";
      s_.counters.reclaim_owner_holder_total++;
      break;
    }
    if ((why = busy(m.key, m.e))) {
      s_.counters.reclaim_owner_write_total++;
      break;
    }
  }
  if (obsolete || why) {
    if (fenced) {  // the fences go before the cohort is tried again
      t.phase = Phase::kAborting;
      return send(id, t, now, out);
    }
    return back_off(id, t, now);
  }
  // Prepared -> Releasing: the entries leave the index (no new local reader finds them), then each
  // slot gives its route reference and resident holder up in one pool update -> Committed (Free).
  for (const Member& m : t.members) {
    s_.local.erase(s_.local.find(m.key));
    s_.pool.reclaim(m.e.slot);
    s_.live_routes--;
  }
  s_.counters.reclaim_released_keys_total += t.members.size();
  if (fenced) {  // the master removes exactly these replicas, then the fences
    t.phase = Phase::kCommitting;
    return send(id, t, now, out);
  }
  committed(t);
  finish(txns_.find(id));
}

void Reclaim::committed(Txn& t) {
  for (const Member& m : t.members) settle(t, m, End::kCommitted);
  if (t.demote) s_.counters.demoted_cohorts_total += t.cohorts.size();
}

void Reclaim::back_off(uint64_t id, Txn& t, Millis now) {
  t.attempts++;
  if (t.attempts >= kMaxAttempts) {  // bounded: the cohort goes back where eviction finds it
    s_.counters.reclaim_restored_total++;
    restore(t, t.demote ? End::kKept : End::kRestored);
    return finish(txns_.find(id));
  }
  s_.counters.reclaim_retry_queued_total++;
  t.phase = Phase::kWaiting;
  txns_.schedule(id, now + std::min(kMaxBackoffMs, kBackoffMs << (t.attempts - 1)));
}

void Reclaim::drop_obsolete(Txn& t) {
  std::erase_if(t.members, [this, &t](const Member& m) {
    if (is_current(m)) return false;
    settle(t, m, End::kObsolete);
    return true;
  });
}

void Reclaim::restore(Txn& t, End current_ends) {
  for (const Member& m : t.members) {
    const bool current = is_current(m);
    if (current) s_.local.enter_resident(m.key, {m.e.put_id, m.e.group}, m.bytes);
    settle(t, m, current ? current_ends : End::kObsolete);
  }
}

void Reclaim::retry_due(Millis now, Outbox& out) {
  for (uint64_t id : txns_.due(now)) {
    auto it = txns_.find(id);
    Txn& t = it->second;
    if (t.phase != Phase::kWaiting) {  // unanswered: the same step, the same epoch
      s_.counters.reclaim_resent_total++;
      send(id, t, now, out);
      continue;
    }
    drop_obsolete(t);
    if (t.members.empty()) {
      finish(it);
      continue;
    }
    t.epoch = s_.new_unique();  // a new attempt: the ended epoch stays ended at the master
    t.phase = Phase::kFencing;
    send(id, t, now, out);
  }
}

void Reclaim::resend_all(Millis now, Outbox& out) {
  for (auto& [id, t] : txns_)
    if (t.phase != Phase::kWaiting) send(id, t, now, out);
}

void Reclaim::settle(const Txn& t, const Member& m, End how) {
  auto& c = s_.counters;
  if (t.demote) {  // not selection debt: the demote_* counters reconcile it
    switch (how) {
      case End::kCommitted:
        c.demoted_keys_total++;
        c.demoted_bytes_total += m.bytes;
        break;
      case End::kObsolete: c.demote_obsolete_keys_total++; break;
      default: c.demote_kept_keys_total++; break;
    }
    return;
  }
  debt_bytes_ -= m.bytes;
  switch (how) {
    case End::kCommitted:
      c.reclaim_committed_keys_total++;
      c.reclaim_committed_bytes_total += m.bytes;
      break;
    case End::kRestored:
    case End::kKept:
      c.reclaim_restored_keys_total++;
      c.reclaim_restored_bytes_total += m.bytes;
      break;
    case End::kObsolete:
      c.reclaim_obsolete_keys_total++;
      c.reclaim_obsolete_bytes_total += m.bytes;
      break;
  }
}

void Reclaim::finish(RetryTable<Txn>::iterator it) {
  if (it == txns_.end()) return;
  for (const auto& c : it->second.cohorts) cohorts_.erase(c);
  txns_.erase(it);
}

}  // namespace fluxon
