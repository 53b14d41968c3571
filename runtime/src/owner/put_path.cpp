#include "fluxon/owner/put_path.hpp"

#include <algorithm>

#include "fluxon/runtime/batch.hpp"

namespace fluxon {

namespace {
// The budget a put asks for (kv_score_pressure_budget), if any of its fields is set.
std::optional<ReplicaBudgetArgs> budget_args(const wire::PutStartReqT& req) {
  if (req.replica_budget_pages == 0 && req.replica_group_priorities.empty() && req.replica_group_ids.empty())
    return std::nullopt;
  return ReplicaBudgetArgs{req.replica_budget_pages, req.replica_group_priorities, req.replica_group_ids,
                           req.replica_decision_shares};
}
}  // namespace

std::optional<RoomNeeded> PutPath::start(uint64_t token, uint64_t session, Envelope& env, Millis now, Outbox& out,
                                         const std::function<bool(const std::string&)>& fetching) {
  s_.counters.put_start_total++;
  if (publish_.size() >= s_.cfg.limits.publish_jobs) {
    s_.counters.publish_backlog_full_total++;
    s_.reply_error(session, token,
                   Status(Code::kTimeout, std::to_string(publish_.size()) +
                                              " committed batches wait for the master (the bound): no new put "
                                              "until it answers"),
                   out);
    return std::nullopt;
  }
  if (waiters_.size() >= s_.cfg.limits.claim_waiters) {
    s_.counters.claim_queue_full_total++;
    Status st(Code::kLocalReserveTimeout,
              std::to_string(waiters_.size()) + " claims wait for slots already (the bound): refused");
    st.stage = "claim_turn";
    s_.reply_error(session, token, st, out);
    return std::nullopt;
  }
  std::optional<RoomNeeded> need;
  // Claim turn: FIFO behind earlier waiters.
  if (waiters_.empty() && try_start(token, session, *env.body.AsPutStartReq(), out, fetching, need)) return need;
  s_.counters.reserve_waits_total++;
  waiters_.push_back(Waiter{token, session, std::make_unique<Envelope>(std::move(env)), now});
  return need;
}

bool PutPath::try_start(uint64_t token, uint64_t session, wire::PutStartReqT& req, Outbox& out,
                        const std::function<bool(const std::string&)>& fetching, std::optional<RoomNeeded>& need) {
  const size_t n = req.keys.size();
  std::optional<std::vector<uint32_t>> groups;
  if (!req.atomic_group_lens.empty()) groups = req.atomic_group_lens;
  std::optional<std::vector<bool>> mask;
  if (!req.make_replica_task_mask.empty()) mask = req.make_replica_task_mask;
  // The client validated already; the owner does not trust the wire.
  Status st = validate_keys(req.keys);
  if (st.is_ok() && req.value_len == 0) st = invalid_argument("value_len: must be > 0");
  if (st.is_ok() && slot_size_for(req.value_len) > s_.cfg.grant_bytes)
    st = invalid_argument("value_len: " + std::to_string(req.value_len) + " is larger than a grant of " +
                          std::to_string(s_.cfg.grant_bytes) + " bytes");
  if (st.is_ok()) st = validate_group_lens(groups, n);
  if (st.is_ok()) st = validate_replica_mask(mask, groups, n);
  std::optional<std::vector<std::string>> parents;
  if (!req.radix_parent_keys.empty()) parents = req.radix_parent_keys;
  if (st.is_ok()) st = validate_parent_keys(parents, req.keys);
  if (st.is_ok() && !req.content_depths.empty())
    st = validate_content_depths(std::optional<std::vector<uint32_t>>(req.content_depths), n);
  const std::optional<ReplicaBudgetArgs> budget = budget_args(req);
  if (st.is_ok()) st = validate_replica_budget(budget, req.make_replica_task, req.write_through, groups, n);
  if (!st.is_ok()) {
    s_.reply_error(session, token, st, out);
    return true;
  }
  Status conflict(Code::kKeyConflict, "");
  for (uint32_t i = 0; i < n; ++i) {
    const auto& k = req.keys[i];
    if (req.reject_if_exist_same_key && s_.local.contains(k)) {
      conflict.indices.push_back(i);
      conflict.reasons.push_back(ConflictReason::kExists);
    } else if (req.reject_if_inflight_same_key && (inflight_.count(k) || fetching(k))) {
      conflict.indices.push_back(i);
      conflict.reasons.push_back(ConflictReason::kInflight);
    }
  }
  if (!conflict.indices.empty()) {
    s_.counters.put_conflict_total++;
    Status s(Code::kKeyConflict, std::to_string(conflict.indices.size()) + " of " + std::to_string(n) +
                                     " keys exist or are inflight (first: '" + req.keys[conflict.indices[0]] +
                                     "')");
    s.indices = std::move(conflict.indices);
    s.reasons = std::move(conflict.reasons);
    s_.reply_error(session, token, s, out);
    return true;
  }
  auto claimed = s_.pool.try_claim(req.value_len, static_cast<uint32_t>(n));
  if (!claimed.ok()) {
    if (claimed.status().code() == Code::kNoSpace) s_.counters.put_nospace_total++;
    s_.reply_error(session, token, claimed.status(), out);
    return true;
  }
  if (!claimed->has_value()) {
    need = RoomNeeded{slot_size_for(req.value_len), uint64_t(n) * slot_size_for(req.value_len)};
    return false;
  }
  const uint64_t put_id = s_.new_local_id();
  Plan plan;
  plan.session = session;
  plan.slots = std::move(**claimed);
  plan.value_len = req.value_len;
  plan.group_lens = req.atomic_group_lens;
  plan.parents = std::move(req.radix_parent_keys);
  plan.depths = std::move(req.content_depths);
  plan.write_through = req.write_through;
  plan.replica.resize(n);
  for (uint32_t i = 0; i < n; ++i)
    plan.replica[i] = !req.write_through && req.make_replica_task && (!mask || (*mask)[i]);
  // Every put moves the pressure the budget follows (recent admissions and evictions, in slots).
  budget_.observe(s_.counters.put_keys_total + s_.counters.transfer_keys_total,
                  s_.counters.evicted_keys_total + s_.counters.demoted_keys_total,
                  std::max<uint64_t>(16, s_.pool.slots_at_most(slot_size_for(req.value_len)) / 4));
  if (budget) apply_replica_budget(*budget, req.atomic_group_lens, plan.replica);
  wire::PutStartReplyT r;
  r.put_id = put_id;
  r.offsets.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    inflight_[req.keys[i]] = put_id;
    r.offsets.push_back(s_.pool.slot_offset(plan.slots[i]));
  }
  plan.keys = std::move(req.keys);
  plans_.emplace(put_id, std::move(plan));
  s_.sessions.of(session).plans.insert(put_id);
  s_.counters.put_keys_total += n;
  s_.reply(session, token, make_envelope(std::move(r)), out);
  return true;
}

void PutPath::apply_replica_budget(const ReplicaBudgetArgs& budget, const std::vector<uint32_t>& group_lens,
                                   std::vector<bool>& replica) {
  auto& c = s_.counters;
  const auto o = budget_.apply(replica, group_lens.empty() ? std::vector<uint32_t>(replica.size(), 1u) : group_lens,
                               budget);
  c.replica_budget_kept_keys_total += o.kept_keys;
  c.replica_budget_cut_keys_total += o.cut_keys;
  c.replica_budget_shared_keys_total += o.memo_keys;
  c.replica_budget_dropped_total = budget_.memo_dropped();
}

std::optional<RoomNeeded> PutPath::serve_waiters(Outbox& out,
                                                 const std::function<bool(const std::string&)>& fetching) {
  std::optional<RoomNeeded> need;
  while (!waiters_.empty()) {
    Waiter& w = waiters_.front();
    if (!try_start(w.token, w.session, *w.req->body.AsPutStartReq(), out, fetching, need)) return need;
    waiters_.pop_front();
  }
  return need;
}

std::optional<RoomNeeded> PutPath::head_need() const {
  if (waiters_.empty()) return std::nullopt;
  const auto* head = waiters_.front().req->body.AsPutStartReq();
  const uint64_t ss = slot_size_for(head->value_len);
  return RoomNeeded{ss, ss * head->keys.size()};
}

void PutPath::expire_waiters(Millis now, Outbox& out) {
  size_t pos = 0;  // position in the queue before this round's expiries
  for (size_t i = 0; i < waiters_.size(); ++pos) {
    Waiter& w = waiters_[i];
    if (!w.soft_noted && now - w.since >= s_.cfg.soft_wait_ms) {
      w.soft_noted = true;
      s_.counters.reserve_soft_wait_total++;
    }
    const uint32_t asked = w.req->body.AsPutStartReq()->max_wait_ms;
    const Millis limit = asked ? std::min<Millis>(asked, s_.cfg.hard_timeout_ms) : Millis(s_.cfg.hard_timeout_ms);
    if (now - w.since >= limit) {
      s_.counters.reserve_timeout_total++;
      const auto c = s_.pool.counts();
      Status s(Code::kLocalReserveTimeout, "no slot became free within " + std::to_string(limit) + " ms; pool: " +
                                               std::to_string(c.free) + " free, " + std::to_string(c.grants) + "/" +
                                               std::to_string(c.grant_limit) + " grants");
      s.stage = pos == 0 ? "refill" : "claim_turn";
      s_.reply_error(w.session, w.token, s, out);
      waiters_.erase(waiters_.begin() + i);
    } else {
      ++i;
    }
  }
}

PutPath::Committed PutPath::commit(uint64_t token, uint64_t session, uint64_t put_id, Millis now, Outbox& out) {
  Committed done;
  auto it = plans_.find(put_id);
  if (it == plans_.end() || it->second.session != session) {
    s_.reply_error(session, token, invalid_argument("put plan " + std::to_string(put_id) + " is unknown or consumed"),
                   out);
    return done;
  }
  Plan plan = std::move(it->second);
  plans_.erase(it);
  s_.sessions.of(session).plans.erase(put_id);
  s_.counters.put_commit_total++;
  PublishJob job;
  job.session = session;
  job.group_lens = plan.group_lens;
  job.write_through = plan.write_through;
  uint32_t group = 0, group_left = plan.group_lens.empty() ? 1 : plan.group_lens[0];
  for (size_t i = 0; i < plan.keys.size(); ++i) {
    const std::string& k = plan.keys[i];
    if (group_left == 0) {
      group++;
      group_left = plan.group_lens.empty() ? 1 : plan.group_lens[group];
    }
    group_left--;
    auto inf = inflight_.find(k);
    if (inf != inflight_.end() && inf->second == put_id) inflight_.erase(inf);
    // V1: local-read-ready at once; the master is not consulted.
    s_.pool.commit_local(plan.slots[i]);
    auto old = s_.local.find(k);
    if (old != s_.local.end()) {
      const Entry prev = old->second;
      s_.local.erase(old);
      if (auto r = supersede(k, prev)) done.removals.push_back(std::move(*r));
    }
    s_.local.insert(k, Entry{put_id, plan.slots[i], plan.value_len, false, group, s_.version_of(put_id)},
                    plan.parents.empty() ? nullptr : &plan.parents[i],
                    plan.depths.empty() ? LocalIndex::kNoDepth : plan.depths[i]);
    job.groups.push_back(group);
    job.offsets.push_back(s_.pool.slot_offset(plan.slots[i]));
    job.lens.push_back(plan.value_len);
  }
  job.superseded.assign(plan.keys.size(), false);
  job.replica = std::move(plan.replica);
  for (bool r : job.replica) s_.counters.replica_keys_requested_total += r;
  job.keys = std::move(plan.keys);
  job.slots = std::move(plan.slots);
  s_.reply(session, token, make_envelope(wire::PutCommitReplyT{{}, put_id}), out);
  publish_.emplace(put_id, std::move(job));
  done.put_id = put_id;
  return done;
}

void PutPath::publish(uint64_t put_id, Millis now, Outbox& out) {
  if (flights_.size() < kWindow && ready_.empty()) {
    send({put_id}, true, now, out);
    return;
  }
  // Earlier publications are on their way: this one goes with the next answer (or its timer).
  s_.counters.publish_coalesced_total++;
  ready_.push_back(put_id);
  publish_.schedule(put_id, now + s_.cfg.publish_retry_ms);
  flush_ready(now, out);
}

void PutPath::flush_ready(Millis now, Outbox& out) {
  size_t from = 0;
  while (flights_.size() < kWindow && from < ready_.size()) {
    std::vector<uint64_t> ids;
    size_t keys = 0;
    for (; from < ready_.size() && ids.size() < kMessageJobs; ++from) {
      auto j = publish_.find(ready_[from]);
      if (j == publish_.end()) continue;  // settled meanwhile (its timer sent it)
      if (!ids.empty() && keys + j->second.keys.size() > kMessageKeys) break;
      keys += j->second.keys.size();
      ids.push_back(ready_[from]);
    }
    if (!ids.empty()) send(ids, true, now, out);
  }
  ready_.erase(ready_.begin(), ready_.begin() + long(from));
}

std::unique_ptr<wire::PutDoneT> PutPath::put_done_of(uint64_t put_id, const PublishJob& job) const {
  auto pd = std::make_unique<wire::PutDoneT>();
  pd->node_id = s_.cfg.node_id;
  pd->generation = s_.generation;
  pd->put_id = put_id;  // T1: every attempt carries the same identity
  pd->atomic_group_lens = job.group_lens;
  pd->items.reserve(job.keys.size());
  for (size_t i = 0; i < job.keys.size(); ++i) {
    auto item = std::make_unique<wire::RouteItemT>();
    item->key = job.keys[i];
    item->offset = job.offsets[i];
    item->len = job.lens[i];
    if (i < job.replica.size()) item->replica = job.replica[i];
    item->group = job.groups[i];
    item->slot_size = s_.pool.slot_size(job.slots[i]);
    if (const std::string* parent = s_.local.parent_of(job.keys[i])) item->parent = *parent;
    item->depth = wire_depth(s_.local.depth_of(job.keys[i]));
    if (!job.origins.empty()) {
      item->origin_node = job.origins[i].origin_node;
      item->origin_generation = job.origins[i].origin_generation;
      item->origin_put_id = job.origins[i].put_id;
    }
    pd->items.push_back(std::move(item));
  }
  return pd;
}

void PutPath::send(const std::vector<uint64_t>& ids, bool first, Millis now, Outbox& out) {
  // Earlier attempts stay answerable: any reply for this identity settles the job (T1).
  const uint64_t tok = s_.new_token(JobKind::kPublish);
  std::unique_ptr<wire::PutDoneT> pd;
  for (uint64_t id : ids) {
    auto one = put_done_of(id, publish_.at(id));
    if (!pd) pd = std::move(one);
    else pd->more.push_back(std::move(one));
    publish_.attempt(id, tok);
    publish_.schedule(id, now + s_.cfg.publish_retry_ms);
  }
  if (ids.size() > 1) s_.counters.publish_messages_shared_total++;
  if (first) flights_.emplace(tok, now);
  s_.to_master(tok, make_envelope(std::move(*pd)), out);
}

void PutPath::drop_plan(uint64_t put_id) {
  auto it = plans_.find(put_id);
  if (it == plans_.end()) return;
  for (size_t i = 0; i < it->second.keys.size(); ++i) {
    auto inf = inflight_.find(it->second.keys[i]);
    if (inf != inflight_.end() && inf->second == put_id) inflight_.erase(inf);
    s_.pool.abort(it->second.slots[i]);
  }
  plans_.erase(it);
}

void PutPath::abort(uint64_t token, uint64_t session, uint64_t put_id, Outbox& out) {
  auto it = plans_.find(put_id);
  if (it == plans_.end() || it->second.session != session) {
    s_.reply_error(session, token, invalid_argument("put plan " + std::to_string(put_id) + " is unknown or consumed"),
                   out);
    return;
  }
  drop_plan(put_id);
  s_.sessions.of(session).plans.erase(put_id);
  s_.counters.put_abort_total++;
  s_.reply(session, token, make_envelope(wire::PutAbortReplyT{{}, put_id}), out);
}

bool PutPath::resyncing(uint64_t put_id) const {
  auto j = publish_.find(put_id);
  return j != publish_.end() && j->second.resync;
}

std::optional<Removal> PutPath::supersede(const std::string& key, const Entry& old) {
  auto j = publish_.find(old.put_id);
  // A live route whose re-publication is in flight: removed once its outcome is known, or a late
  // re-publication could bring back a route to a freed slot. A route not live yet: its publish job
  // settles the item on reply.
  if (j != publish_.end() && (j->second.resync || !old.live)) {
    for (size_t i = 0; i < j->second.keys.size(); ++i)
      if (j->second.keys[i] == key) j->second.superseded[i] = true;
    return std::nullopt;
  }
  if (!old.live) return std::nullopt;
  // Route first: the slot stays route_live until the master confirms the removal.
  return Removal{key, old.ver, old.slot, old.put_id};
}

// PutDone's answer: each batch's routes are live (or refused), its slots follow, the caller learns.
std::vector<PutPath::Settled> PutPath::on_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out) {
  std::vector<Settled> all;
  const bool first = flights_.erase(token) != 0;
  if (auto* pr = reply.body.AsPutDoneReply()) {
    Settled one;
    if (settle(token, pr, one, out)) all.push_back(std::move(one));
    for (const auto& more : pr->more) {
      Settled m;
      if (more && settle(token, more.get(), m, out)) all.push_back(std::move(m));
    }
  }
  if (first) flush_ready(now, out);
  return all;
}

bool PutPath::settle(uint64_t token, const wire::PutDoneReplyT* pr, Settled& settled, Outbox& out) {
  const uint64_t id = pr->put_id;
  auto j = publish_.find(id);
  // Identity mismatch (not a job this message carried, or malformed): keep the job, the retry
  // timer re-sends.
  if (j == publish_.end() || !publish_.attempted(id, token) || pr->results.size() != j->second.keys.size())
    return false;
  PublishJob job = publish_.take(j);  // any attempt's reply settles the job and all its attempts
  if (job.resync) {
    settle_resync(id, job, *pr, settled);
    return true;
  }
  Status result = Status::ok();
  for (size_t i = 0; i < job.keys.size(); ++i) {
    const bool superseded = job.superseded[i];
    const auto res = pr->results[i];
    if (res == wire::PutItemResult::Live) {
      s_.pool.route_live(job.slots[i]);
      s_.live_routes++;
      if (superseded) {
        // A newer version replaced it locally: remove this route, then the slot (S2).
        settled.removals.push_back(Removal{job.keys[i], s_.version_of(id), job.slots[i], id});
      } else {
        Entry& e = s_.local.at(job.keys[i]);
        e.live = true;
        settled.live.push_back(LiveEntry{job.keys[i], {id, e.group}, s_.pool.slot_size(e.slot)});
      }
    } else {
      // Never published: the local copy is dropped (cache semantics), the caller learns why.
      s_.counters.publish_exists_total++;
      if (!superseded) s_.local.erase_if_copy(job.keys[i], id);
      s_.pool.route_dropped(job.slots[i]);
      settled.unrouted.push_back(job.slots[i]);
      if (result.is_ok()) {
        result = Status(res == wire::PutItemResult::Exists ? Code::kKeyConflict : Code::kGenerationMismatch,
                        "route for key '" + job.keys[i] + "' was not published: " +
                            wire::EnumNamePutItemResult(res));
      }
      if (res == wire::PutItemResult::Exists) {
        result.indices.push_back(uint32_t(i));
        result.reasons.push_back(ConflictReason::kExists);
      }
    }
  }
  s_.counters.put_live_total++;
  if (job.write_through && result.is_ok()) {
    // Published: the future waits for the copy on a target-role owner (the design's write-through).
    PutPath::WriteThrough wt{id, job.session, {}, {}, {}};
    for (const auto& e : settled.live) {
      if (wt.cohorts.empty() || wt.cohorts.back() != LocalIndex::CohortId{e.ref.put_id, e.ref.group})
        wt.cohorts.emplace_back(e.ref.put_id, e.ref.group);
      wt.keys.push_back(e.key);
      wt.versions.push_back(s_.local.at(e.key).ver);
    }
    s_.counters.write_through_puts_total++;
    settled.write_through = std::move(wt);
    return true;
  }
  if (s_.sessions.contains(job.session)) {
    wire::PutLiveT live;
    live.put_id = id;
    if (!result.is_ok()) live.error = std::make_unique<wire::ErrorT>(to_wire(result));
    s_.note(job.session, make_envelope(std::move(live)), out);
  }
  return true;
}

void PutPath::settle_resync(uint64_t put_id, PublishJob& job, const wire::PutDoneReplyT& reply, Settled& settled) {
  for (size_t i = 0; i < job.keys.size(); ++i) {
    const bool live = reply.results[i] == wire::PutItemResult::Live;
    if (job.superseded[i]) {
      // Replaced or removed here while the re-publication was in flight: route first, then S2.
      if (live) {
        settled.removals.push_back(Removal{job.keys[i],
                                           job.origins.empty() ? s_.version_of(put_id) : job.origins[i],
                                           job.slots[i], put_id});
      } else {
        s_.pool.route_dropped(job.slots[i]);
        settled.unrouted.push_back(job.slots[i]);
        s_.live_routes--;
      }
      continue;
    }
    if (live) continue;  // the master knows the route again
    // Refused: another owner published the key while the master was away. Cache semantics: drop ours.
    s_.counters.publish_exists_total++;
    s_.local.erase_if_copy(job.keys[i], put_id);
    s_.pool.route_dropped(job.slots[i]);
    s_.live_routes--;
  }
}

void PutPath::resync(Millis now, Outbox& out) {
  std::map<uint64_t, PublishJob> by_put;  // the original batches: the same identities again
  for (const auto& [key, e] : s_.local.entries()) {
    if (!e.live) continue;
    PublishJob& j = by_put[e.put_id];
    j.resync = true;
    j.keys.push_back(key);
    j.slots.push_back(e.slot);
    j.offsets.push_back(s_.pool.slot_offset(e.slot));
    j.lens.push_back(e.len);
    j.groups.push_back(e.group);
    j.origins.push_back(e.ver);
  }
  for (auto& [put_id, job] : by_put) {
    if (publish_.count(put_id)) continue;
    job.superseded.assign(job.keys.size(), false);
    s_.counters.resync_routes_total += job.keys.size();
    publish_.emplace(put_id, std::move(job));
    send({put_id}, false, now, out);
  }
  ready_.clear();  // every job goes now
  for (auto& [put_id, job] : publish_)
    if (!job.resync) send({put_id}, false, now, out);
}

void PutPath::retry_due(Millis now, Outbox& out) {
  // A message unanswered for a retry period no longer holds the window (its jobs re-send on their
  // own timers; a reply still settles them).
  std::erase_if(flights_, [&](const auto& f) { return now - f.second >= Millis(s_.cfg.publish_retry_ms); });
  for (uint64_t put_id : publish_.due(now)) {
    // Still waiting for the window when its timer came: its first send, not a retry.
    if (auto w = std::find(ready_.begin(), ready_.end(), put_id); w != ready_.end()) ready_.erase(w);
    else s_.counters.publish_retry_total++;
    send({put_id}, false, now, out);
  }
  flush_ready(now, out);
}

void PutPath::close_session(const Sessions::Session& s, uint64_t session) {
  for (uint64_t put_id : s.plans) drop_plan(put_id);
  std::erase_if(waiters_, [session](const Waiter& w) { return w.session == session; });
}

std::unordered_set<std::string> PutPath::continued() const {
  std::unordered_set<std::string> out;
  for (const auto& w : waiters_)
    for (const auto& p : w.req->body.AsPutStartReq()->radix_parent_keys)
      if (!p.empty()) out.insert(p);
  for (const auto& [id, plan] : plans_)
    for (const auto& p : plan.parents)
      if (!p.empty()) out.insert(p);
  return out;
}

}  // namespace fluxon
