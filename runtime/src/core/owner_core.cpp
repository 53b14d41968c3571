#include "fluxon/core/owner_core.hpp"

#include <algorithm>

#include "fluxon/runtime/batch.hpp"

namespace fluxon {

OwnerCore::OwnerCore(OwnerConfig cfg, uint64_t generation, std::string segment_name, uint64_t segment_len)
    : cfg_(std::move(cfg)),
      generation_(generation),
      segment_name_(std::move(segment_name)),
      segment_len_(segment_len),
      pool_(segment_len, cfg_.grant_bytes, cfg_.expected_capacity),
      local_(segment_len, cfg_.hot_writeback_ratio, cfg_.eviction_tp_cohorts),
      eviction_({cfg_.eviction, cfg_.eviction_max_bytes_per_round, cfg_.eviction_free_watermark}) {}

void OwnerCore::start(Millis now, Outbox& out) {
  now_ = now;
  register_token_ = new_token(JobKind::kRegister);  // an older attempt's reply is dropped from now on
  register_sent_ = now;
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, register_token_, register_request()});
}

Envelope OwnerCore::register_request() const {
  wire::RegisterOwnerT r;
  r.node_id = cfg_.node_id;
  r.generation = generation_;
  r.role = cfg_.role;
  r.segment_len = segment_len_;
  r.data_host = data_host_;
  r.data_port = data_port_;
  return make_envelope(std::move(r));
}

void OwnerCore::reply(OwnerOut::Kind k, uint64_t session, uint64_t token, Envelope env, Outbox& out) {
  out.push_back(OwnerOut{k, session, token, std::move(env)});
}

void OwnerCore::reply_error(uint64_t session, uint64_t token, const Status& s, Outbox& out) {
  counters_.errors_total++;
  if (s.code() == Code::kMalformedMessage) counters_.malformed_total++;
  if (s.code() == Code::kGenerationMismatch) counters_.generation_mismatch_total++;
  reply(OwnerOut::Kind::kReply, session, token, error_envelope(s), out);
}

std::vector<std::pair<uint64_t, uint64_t>> OwnerCore::take_new_grant_ranges() {
  std::vector<std::pair<uint64_t, uint64_t>> r;
  for (uint32_t g : pool_.take_new_grants()) r.emplace_back(uint64_t(g) * cfg_.grant_bytes, cfg_.grant_bytes);
  return r;
}

int OwnerCore::local_state(const std::string& key) const {
  auto it = local_.find(key);
  if (it == local_.end()) return 0;
  return it->second.live ? 2 : 1;
}

void OwnerCore::on_client_request(uint64_t token, Envelope& req, Millis now, Outbox& out) {
  now_ = now;
  dispatch_client(token, req, now, out);
  if (pool_.take_freed()) serve_waiters(out);
}

void OwnerCore::dispatch_client(uint64_t token, Envelope& req, Millis now, Outbox& out) {
  const uint64_t session = req.session_id;
  if (req.body.AsHello()) {
    const uint64_t sid = sessions_.open();
    wire::HelloReplyT r;
    r.node_id = cfg_.node_id;
    r.generation = generation_;
    r.session_id = sid;
    r.segment_name = segment_name_;
    r.segment_len = segment_len_;
    r.get_handle_ttl_ms = cfg_.get_handle_ttl_ms;
    r.grant_bytes = cfg_.grant_bytes;
    reply(OwnerOut::Kind::kReply, sid, token, make_envelope(std::move(r)), out);
    return;
  }
  if (auto* p = req.body.AsPing()) {
    reply(OwnerOut::Kind::kReply, session, token, make_envelope(wire::PongT{{}, p->seq}), out);
    return;
  }
  if (req.body.AsStatsReq()) {
    reply(OwnerOut::Kind::kReply, session, token, make_envelope(stats()), out);
    return;
  }
  // Identity first: a caller holding an old generation never touches this owner's memory.
  if (req.generation != 0 && req.generation != generation_) {
    reply_error(session, token,
                Status(Code::kGenerationMismatch, "request for owner generation " +
                                                      std::to_string(req.generation) + ", owner is at " +
                                                      std::to_string(generation_)),
                out);
    return;
  }
  if (!sessions_.contains(session)) {
    reply_error(session, token, Status(Code::kClosed, "unknown or closed session " + std::to_string(session)), out);
    return;
  }
  if (auto* p = req.body.AsPutStartReq()) {
    counters_.put_start_total++;
    if (publish_.size() >= cfg_.limits.publish_jobs) {
      counters_.publish_backlog_full_total++;
      return reply_error(session, token,
                         Status(Code::kTimeout, std::to_string(publish_.size()) +
                                                    " committed batches wait for the master (the bound): no new put "
                                                    "until it answers"),
                         out);
    }
    if (waiters_.size() >= cfg_.limits.claim_waiters) {
      counters_.claim_queue_full_total++;
      Status st(Code::kLocalReserveTimeout,
                std::to_string(waiters_.size()) + " claims wait for slots already (the bound): refused");
      st.stage = "claim_turn";
      return reply_error(session, token, st, out);
    }
    if (!waiters_.empty()) {  // claim turn: FIFO behind earlier waiters
      counters_.reserve_waits_total++;
      waiters_.push_back(Waiter{token, session, std::make_unique<Envelope>(std::move(req)), now});
      return;
    }
    if (!try_put_start(token, session, *p, out)) {
      counters_.reserve_waits_total++;
      waiters_.push_back(Waiter{token, session, std::make_unique<Envelope>(std::move(req)), now});
    }
    return;
  }
  if (auto* p = req.body.AsPutCommitReq()) return put_commit(token, session, p->put_id, now, out);
  if (auto* p = req.body.AsPutAbortReq()) return put_abort(token, session, p->put_id, out);
  if (auto* p = req.body.AsGetStartReq()) return get_start(token, session, *p, now, out);
  if (auto* p = req.body.AsGetTransferReq()) return get_transfer(token, session, *p, now, out);
  if (auto* p = req.body.AsExistsReq()) return exists(token, session, *p, now, out);
  if (auto* p = req.body.AsRemovePrefixReq()) return remove_prefix(token, session, *p, now, out);
  if (req.body.AsMasterStatsReq()) {  // forwarded: clients of a daemon owner have no master link
    const uint64_t tok = new_token(JobKind::kProxy);
    proxied_[tok] = {session, token};
    out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, tok, make_envelope(wire::MasterStatsReqT{})});
    return;
  }
  reply_error(session, token,
              Status(Code::kMalformedMessage, std::string("unexpected request ") + body_name(req)), out);
}

bool OwnerCore::try_put_start(uint64_t token, uint64_t session, wire::PutStartReqT& req, Outbox& out) {
  const size_t n = req.keys.size();
  std::optional<std::vector<uint32_t>> groups;
  if (!req.atomic_group_lens.empty()) groups = req.atomic_group_lens;
  std::optional<std::vector<bool>> mask;
  if (!req.make_replica_task_mask.empty()) mask = req.make_replica_task_mask;
  // The client validated already; the owner does not trust the wire.
  Status st = validate_keys(req.keys);
  if (st.is_ok() && req.value_len == 0) st = invalid_argument("value_len: must be > 0");
  if (st.is_ok() && slot_size_for(req.value_len) > cfg_.grant_bytes)
    st = invalid_argument("value_len: " + std::to_string(req.value_len) + " is larger than a grant of " +
                          std::to_string(cfg_.grant_bytes) + " bytes");
  if (st.is_ok()) st = validate_group_lens(groups, n);
  if (st.is_ok()) st = validate_replica_mask(mask, groups, n);
  if (!st.is_ok()) {
    reply_error(session, token, st, out);
    return true;
  }
  Status conflict(Code::kKeyConflict, "");
  for (uint32_t i = 0; i < n; ++i) {
    const auto& k = req.keys[i];
    if (req.reject_if_exist_same_key && local_.contains(k)) {
      conflict.indices.push_back(i);
      conflict.reasons.push_back(ConflictReason::kExists);
    } else if (req.reject_if_inflight_same_key && (inflight_.count(k) || flight_of_.count(k))) {
      conflict.indices.push_back(i);
      conflict.reasons.push_back(ConflictReason::kInflight);
    }
  }
  if (!conflict.indices.empty()) {
    counters_.put_conflict_total++;
    Status s(Code::kKeyConflict, std::to_string(conflict.indices.size()) + " of " + std::to_string(n) +
                                     " keys exist or are inflight (first: '" + req.keys[conflict.indices[0]] +
                                     "')");
    s.indices = std::move(conflict.indices);
    s.reasons = std::move(conflict.reasons);
    reply_error(session, token, s, out);
    return true;
  }
  auto claimed = pool_.try_claim(req.value_len, static_cast<uint32_t>(n));
  if (!claimed.ok()) {
    if (claimed.status().code() == Code::kNoSpace) counters_.put_nospace_total++;
    reply_error(session, token, claimed.status(), out);
    return true;
  }
  if (!claimed->has_value()) {
    evict_for(slot_size_for(req.value_len), uint64_t(n) * slot_size_for(req.value_len), now_, out);
    return false;
  }
  const uint64_t put_id = next_put_id_++;
  PutPlan plan;
  plan.session = session;
  plan.slots = std::move(**claimed);
  plan.value_len = req.value_len;
  plan.group_lens = req.atomic_group_lens;
  plan.replica.resize(n);
  for (uint32_t i = 0; i < n; ++i)
    plan.replica[i] = !req.write_through && req.make_replica_task && (!mask || (*mask)[i]);
  wire::PutStartReplyT r;
  r.put_id = put_id;
  r.offsets.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    inflight_[req.keys[i]] = put_id;
    r.offsets.push_back(pool_.slot_offset(plan.slots[i]));
  }
  plan.keys = std::move(req.keys);
  plans_.emplace(put_id, std::move(plan));
  sessions_.of(session).plans.insert(put_id);
  counters_.put_keys_total += n;
  reply(OwnerOut::Kind::kReply, session, token, make_envelope(std::move(r)), out);
  return true;
}

void OwnerCore::serve_waiters(Outbox& out) {
  while (!waiters_.empty()) {
    Waiter& w = waiters_.front();
    if (!try_put_start(w.token, w.session, *w.req->body.AsPutStartReq(), out)) return;
    waiters_.pop_front();
  }
}

void OwnerCore::put_commit(uint64_t token, uint64_t session, uint64_t put_id, Millis now, Outbox& out) {
  auto it = plans_.find(put_id);
  if (it == plans_.end() || it->second.session != session) {
    reply_error(session, token, invalid_argument("put plan " + std::to_string(put_id) + " is unknown or consumed"), out);
    return;
  }
  PutPlan plan = std::move(it->second);
  plans_.erase(it);
  sessions_.of(session).plans.erase(put_id);
  counters_.put_commit_total++;
  PublishJob job;
  job.session = session;
  job.group_lens = plan.group_lens;
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
    pool_.commit_local(plan.slots[i]);
    auto old = local_.find(k);
    if (old != local_.end()) {
      Entry prev = old->second;
      local_.erase(old);
      supersede(k, prev, now, out);
    }
    local_.insert(k, Entry{put_id, plan.slots[i], plan.value_len, false, group, Version{cfg_.node_id, generation_, put_id}});
    job.offsets.push_back(pool_.slot_offset(plan.slots[i]));
    job.lens.push_back(plan.value_len);
  }
  job.superseded.assign(plan.keys.size(), false);
  job.replica = std::move(plan.replica);
  for (bool r : job.replica) counters_.replica_keys_requested_total += r;
  job.keys = std::move(plan.keys);
  job.slots = std::move(plan.slots);
  reply(OwnerOut::Kind::kReply, session, token, make_envelope(wire::PutCommitReplyT{{}, put_id}), out);
  auto [jit, _] = publish_.emplace(put_id, std::move(job));
  send_publish(put_id, jit->second, now, out);
}

void OwnerCore::send_publish(uint64_t put_id, PublishJob& job, Millis now, Outbox& out) {
  wire::PutDoneT pd;
  pd.node_id = cfg_.node_id;
  pd.generation = generation_;
  pd.put_id = put_id;  // T1: every attempt carries the same identity
  pd.atomic_group_lens = job.group_lens;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    auto item = std::make_unique<wire::RouteItemT>();
    item->key = job.keys[i];
    item->offset = job.offsets[i];
    item->len = job.lens[i];
    if (i < job.replica.size()) item->replica = job.replica[i];
    if (!job.origins.empty()) {
      item->origin_node = job.origins[i].origin_node;
      item->origin_generation = job.origins[i].origin_generation;
      item->origin_put_id = job.origins[i].put_id;
    }
    pd.items.push_back(std::move(item));
  }
  // Earlier attempts stay answerable: any reply for this identity settles the job (T1).
  const uint64_t tok = new_token(JobKind::kPublish);
  publish_.attempt(put_id, tok);
  publish_.schedule(put_id, now + cfg_.publish_retry_ms);
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, tok, make_envelope(std::move(pd))});
}

void OwnerCore::supersede(const std::string& key, Entry old, Millis now, Outbox& out) {
  auto resync = publish_.find(old.put_id);
  if (old.live && resync != publish_.end() && resync->second.resync) {
    // A re-publication of this route is in flight: remove it once its outcome is known, or a
    // late re-publication could bring back a route to a freed slot.
    for (size_t i = 0; i < resync->second.keys.size(); ++i)
      if (resync->second.keys[i] == key) resync->second.superseded[i] = true;
    return;
  }
  if (old.live) {
    // Route first: the slot stays route_live until the master confirms the removal.
    queue_remove({key}, {old.ver}, {old.slot}, {old.put_id}, now, out);
  } else {
    // Its publish job still runs: mark the item superseded; the job settles it on reply.
    auto j = publish_.find(old.put_id);
    if (j != publish_.end()) {
      for (size_t i = 0; i < j->second.keys.size(); ++i)
        if (j->second.keys[i] == key) j->second.superseded[i] = true;
    }
  }
}

void OwnerCore::queue_remove(std::vector<std::string> keys, std::vector<Version> versions, std::vector<SlotRef> slots,
                             std::vector<uint64_t> instances, Millis now, Outbox& out) {
  const uint64_t id = next_remove_job_++;
  auto [it, _] = removes_.emplace(
      id, RemoveJob{std::move(keys), std::move(versions), std::move(slots), std::move(instances), 0});
  send_remove(id, it->second, now, out);
}

void OwnerCore::send_remove(uint64_t job_id, RemoveJob& job, Millis now, Outbox& out) {
  wire::RemoveRoutesT rr;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    auto item = std::make_unique<wire::RemoveRouteT>();
    item->key = job.keys[i];
    item->node_id = cfg_.node_id;
    item->generation = generation_;
    item->put_id = job.versions[i].put_id;
    item->origin_node = job.versions[i].origin_node;
    item->origin_generation = job.versions[i].origin_generation;
    item->instance = job.instances[i];
    rr.items.push_back(std::move(item));
  }
  const uint64_t tok = new_token(JobKind::kRemove);
  removes_.attempt(job_id, tok);
  removes_.schedule(job_id, now + cfg_.publish_retry_ms);
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, tok, make_envelope(std::move(rr))});
}

void OwnerCore::remove_key(const std::string& key, Millis now, Outbox& out) {
  auto it = local_.find(key);
  if (it == local_.end()) return;
  Entry e = it->second;
  local_.erase(it);
  supersede(key, e, now, out);
}

void OwnerCore::settle_evicting(SlotRef slot) {
  if (eviction_.settle(slot)) counters_.eviction_settled_keys_total++;
}

void OwnerCore::keep_free(Millis now, Outbox& out) {
  for (const auto& [size, bytes] : eviction_.deficits(pool_)) {
    const uint64_t rounds = counters_.eviction_rounds_total;
    evict_for(size, bytes, now, out);
    if (counters_.eviction_rounds_total > rounds) counters_.pressure_evictions_total++;
  }
}

void OwnerCore::evict_for(uint64_t slot_size, uint64_t bytes, Millis now, Outbox& out) {
  if (removes_.size() >= cfg_.limits.remove_jobs) {  // removals in flight at their bound: wait for them
    counters_.eviction_paused_total++;
    return;
  }
  const auto victims = eviction_.select(local_, pool_, slot_size, bytes);
  if (victims.empty()) return;
  counters_.eviction_rounds_total++;
  for (const auto& cohort : victims) evict_cohort(cohort, now, out);
}

void OwnerCore::evict_cohort(CohortId cohort, Millis now, Outbox& out) {
  for (const auto& id : local_.exact_cohort(cohort)) evict_one_cohort(id, now, out);
}

void OwnerCore::evict_one_cohort(CohortId cohort, Millis now, Outbox& out) {
  const auto* c = local_.cohort(cohort);
  if (!c) return;  // already evicted with another member
  const std::vector<std::string> members = *c;  // A1: the exact cohort, never part of it
  // A write-back of this cohort has nothing left to copy or demote: capacity eviction came first (S3).
  if (auto w = writeback_of_.find(cohort); w != writeback_of_.end()) end_writeback(w->second);
  for (const auto& key : members) {
    auto it = local_.find(key);
    if (it == local_.end() || it->second.put_id != cohort.first) continue;
    const Entry e = it->second;
    local_.erase(it);
    const uint64_t bytes = pool_.slot_size(e.slot);
    eviction_.chose(e.slot, bytes);
    counters_.evicted_keys_total++;
    counters_.evicted_bytes_total += bytes;
    supersede(key, e, now, out);  // route first; the slot is Free once no holder remains (S2)
  }
}

void OwnerCore::put_abort(uint64_t token, uint64_t session, uint64_t put_id, Outbox& out) {
  auto it = plans_.find(put_id);
  if (it == plans_.end() || it->second.session != session) {
    reply_error(session, token, invalid_argument("put plan " + std::to_string(put_id) + " is unknown or consumed"), out);
    return;
  }
  for (size_t i = 0; i < it->second.keys.size(); ++i) {
    auto inf = inflight_.find(it->second.keys[i]);
    if (inf != inflight_.end() && inf->second == put_id) inflight_.erase(inf);
    pool_.abort(it->second.slots[i]);
  }
  plans_.erase(it);
  sessions_.of(session).plans.erase(put_id);
  counters_.put_abort_total++;
  reply(OwnerOut::Kind::kReply, session, token, make_envelope(wire::PutAbortReplyT{{}, put_id}), out);
}

void OwnerCore::release_holding(uint64_t holding_id, uint64_t session) {
  sessions_.release(pool_, holding_id, session);
}

void OwnerCore::drop_handle(uint64_t handle_id) {
  auto it = handles_.find(handle_id);
  if (it == handles_.end()) return;
  sessions_.forget_handle(it->second.session, handle_id);
  handle_ttl_.erase({it->second.deadline, handle_id});
  handles_.erase(it);
}

void OwnerCore::on_client_note(Envelope& note, Millis now, Outbox& out) {
  now_ = now;
  const uint64_t session = note.session_id;
  if (note.generation != 0 && note.generation != generation_) {
    counters_.generation_mismatch_total++;
    return;  // holdings of an old generation died with it
  }
  if (auto* ack = note.body.AsAckBatch()) {
    for (auto& hd : ack->handles) {
      auto it = handles_.find(hd->handle_id);
      if (it != handles_.end() && it->second.session == session) {
        // Inline: the client owns the holdings and names the ones it releases. OwnerRpc: the
        // owner still holds everything the handle retains.
        if (it->second.owner_rpc) {
          if (it->second.waiting_token == 0) release_handle(hd->handle_id, now, out);
        } else {
          drop_handle(hd->handle_id);
        }
      }
      counters_.get_tail_released_total += hd->release_holding_ids.size();
      for (uint64_t hid : hd->release_holding_ids) release_holding(hid, session);
    }
    for (uint64_t hid : ack->release) release_holding(hid, session);
  } else {
    counters_.malformed_total++;
  }
  if (pool_.take_freed()) serve_waiters(out);
}

void OwnerCore::on_master_reply(uint64_t token, Envelope& reply_env, Millis now, Outbox& out) {
  now_ = now;
  const JobKind kind = kind_of(token);
  if (kind == JobKind::kProxy) {
    auto p = proxied_.find(token);
    if (p != proxied_.end()) {
      reply(OwnerOut::Kind::kReply, p->second.first, p->second.second, std::move(reply_env), out);
      proxied_.erase(p);
    }
    return;
  }
  if (kind == JobKind::kExists) return on_exists_reply(token, reply_env, out);
  if (reply_env.body.AsError()) return;  // keep the job; tick() re-sends with the same identity
  switch (kind) {
    case JobKind::kRegister:
      if (token != register_token_) return;  // an older registration's answer
      register_token_ = 0;
      if (auto* rr = reply_env.body.AsRegisterOwnerReply()) replica_target_ = rr->replica_target;
      break;
    case JobKind::kReplicaPoll: {
      // Only the poll in flight counts; a late duplicate of a settled poll is dropped.
      if (std::find(replica_poll_tokens_.begin(), replica_poll_tokens_.end(), token) == replica_poll_tokens_.end())
        return;
      auto* rp = reply_env.body.AsReplicaPollReply();
      if (!rp) return;
      replica_poll_tokens_.clear();
      replica_poll_id_ = 0;
      on_replica_tasks(*rp, now, out);
      break;
    }
    case JobKind::kGet:
      if (auto id = get_jobs_.id_of(token)) on_get_job_reply(*id, reply_env, now, out);
      break;
    case JobKind::kDemote:
      if (auto id = writebacks_.id_of(token)) on_demote_reply(*id, reply_env, now, out);
      break;
    case JobKind::kWriteBackBatch:
      on_writeback_batch_reply(token, reply_env, now, out);
      break;
    case JobKind::kPublish:
      if (auto id = publish_.id_of(token)) on_publish_reply(*id, reply_env, now, out);
      break;
    case JobKind::kRemove:
      if (auto id = removes_.id_of(token)) on_remove_reply(*id, reply_env, now, out);
      break;
    default:
      return;  // not a token of this owner
  }
  if (pool_.take_freed()) serve_waiters(out);
}

bool OwnerCore::known_token(uint64_t token) const {
  switch (kind_of(token)) {
    case JobKind::kRegister: return token == register_token_;
    case JobKind::kProxy: return proxied_.count(token) != 0;
    case JobKind::kExists: return exists_jobs_.count(token) != 0;
    case JobKind::kReplicaPoll:
      return std::find(replica_poll_tokens_.begin(), replica_poll_tokens_.end(), token) != replica_poll_tokens_.end();
    case JobKind::kGet: return get_jobs_.id_of(token).has_value();
    case JobKind::kDemote: return writebacks_.id_of(token).has_value();
    case JobKind::kWriteBackBatch: return writeback_batches_.count(token) != 0;
    case JobKind::kPublish: return publish_.id_of(token).has_value();
    case JobKind::kRemove: return removes_.id_of(token).has_value();
  }
  return false;
}

// PutDone's answer: the batch's routes are live (or refused), its slots follow, the caller learns.
void OwnerCore::on_publish_reply(uint64_t id, Envelope& reply_env, Millis now, Outbox& out) {
  auto j = publish_.find(id);
  auto* pr = reply_env.body.AsPutDoneReply();
  // Identity mismatch: keep the job, tick() re-sends.
  if (j == publish_.end() || !pr || pr->put_id != id || pr->results.size() != j->second.keys.size()) return;
  PublishJob job = publish_.take(j);  // any attempt's reply settles the job and all its attempts
  if (job.resync) return settle_resync(id, job, *pr, now, out);
  Status result = Status::ok();
  std::vector<std::string> rm_keys;
  std::vector<Version> rm_ids;
  std::vector<SlotRef> rm_slots;
  HotBatch hot;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    const bool superseded = job.superseded[i];
    const auto res = pr->results[i];
    if (res == wire::PutItemResult::Live) {
      pool_.route_live(job.slots[i]);
      live_routes_++;
      if (superseded) {
        // A newer version replaced it locally: remove this route, then the slot (S2).
        rm_keys.push_back(job.keys[i]);
        rm_ids.push_back(Version{cfg_.node_id, generation_, id});
        rm_slots.push_back(job.slots[i]);
      } else {
        Entry& e = local_.at(job.keys[i]);
        e.live = true;
        index_live(job.keys[i], ResidentRef{id, e.group}, pool_.slot_size(e.slot), hot);
      }
    } else {
      // Never published: the local copy is dropped (cache semantics), the caller learns why.
      counters_.publish_exists_total++;
      if (!superseded) {
        local_.erase_if_copy(job.keys[i], id);
      }
      pool_.route_dropped(job.slots[i]);
      settle_evicting(job.slots[i]);
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
  if (!rm_keys.empty()) {
    std::vector<uint64_t> instances(rm_keys.size(), id);
    queue_remove(std::move(rm_keys), std::move(rm_ids), std::move(rm_slots), std::move(instances), now, out);
  }
  admit_hot(hot, now, out);
  counters_.put_live_total++;
  if (sessions_.contains(job.session)) {
    wire::PutLiveT live;
    live.put_id = id;
    if (!result.is_ok()) live.error = std::make_unique<wire::ErrorT>(to_wire(result));
    out.push_back(OwnerOut{OwnerOut::Kind::kNote, job.session, 0, make_envelope(std::move(live))});
  }
}

// RemoveRoutes' answer: removed (or absent) items free their slots' routes; busy ones ask again.
void OwnerCore::on_remove_reply(uint64_t id, Envelope& reply_env, Millis now, Outbox& out) {
  auto j = removes_.find(id);
  auto* rr = reply_env.body.AsRemoveRoutesReply();
  if (j == removes_.end() || !rr || rr->removed.size() != j->second.keys.size()) return;
  RemoveJob& job = j->second;
  removes_.forget(id);  // answered: a later reply to an earlier attempt finds nothing
  RemoveJob busy;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    if (i < rr->busy.size() && rr->busy[i]) {
      // A remote get reads this copy now (activity fence): keep the slot, ask again later.
      counters_.remove_busy_total++;
      busy.keys.push_back(job.keys[i]);
      busy.versions.push_back(job.versions[i]);
      busy.slots.push_back(job.slots[i]);
      busy.instances.push_back(job.instances[i]);
      continue;
    }
    // Removed or already absent: either way no master route references the slot now.
    pool_.route_dropped(job.slots[i]);
    settle_evicting(job.slots[i]);
    live_routes_--;
    counters_.route_remove_total++;
  }
  if (busy.keys.empty()) {
    removes_.erase(j);
  } else {
    busy.next_send = job.next_send;  // the timer's key stays valid until schedule() moves it
    job = std::move(busy);
    removes_.schedule(id, now + cfg_.publish_retry_ms);
  }
}

void OwnerCore::on_master_reconnected(Millis now, Outbox& out) {
  now_ = now;
  start(now, out);
  std::map<uint64_t, PublishJob> by_put;  // the original batches: the same identities again
  for (const auto& [key, e] : local_.entries()) {
    if (!e.live) continue;
    PublishJob& j = by_put[e.put_id];
    j.resync = true;
    j.keys.push_back(key);
    j.slots.push_back(e.slot);
    j.offsets.push_back(pool_.slot_offset(e.slot));
    j.lens.push_back(e.len);
    j.origins.push_back(e.ver);
  }
  for (auto& [put_id, job] : by_put) {
    if (publish_.count(put_id)) continue;
    job.superseded.assign(job.keys.size(), false);
    counters_.resync_routes_total += job.keys.size();
    auto [it, _] = publish_.emplace(put_id, std::move(job));
    send_publish(put_id, it->second, now, out);
  }
  for (auto& [put_id, job] : publish_)
    if (!job.resync) send_publish(put_id, job, now, out);
  for (auto& [id, job] : removes_) send_remove(id, job, now, out);
  for (auto& [id, job] : get_jobs_) send_get_job(id, job, now, out);
}

void OwnerCore::settle_resync(uint64_t put_id, PublishJob& job, const wire::PutDoneReplyT& reply, Millis now,
                              Outbox& out) {
  std::vector<std::string> rm_keys;
  std::vector<Version> rm_ids;
  std::vector<SlotRef> rm_slots;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    const bool live = reply.results[i] == wire::PutItemResult::Live;
    if (job.superseded[i]) {
      // Replaced or removed here while the re-publication was in flight: route first, then S2.
      if (live) {
        rm_keys.push_back(job.keys[i]);
        rm_ids.push_back(job.origins.empty() ? Version{cfg_.node_id, generation_, put_id} : job.origins[i]);
        rm_slots.push_back(job.slots[i]);
      } else {
        pool_.route_dropped(job.slots[i]);
        settle_evicting(job.slots[i]);
        live_routes_--;
      }
      continue;
    }
    if (live) continue;  // the master knows the route again
    // Refused: another owner published the key while the master was away. Cache semantics: drop ours.
    counters_.publish_exists_total++;
    local_.erase_if_copy(job.keys[i], put_id);
    pool_.route_dropped(job.slots[i]);
    live_routes_--;
  }
  if (!rm_keys.empty()) {
    std::vector<uint64_t> instances(rm_keys.size(), put_id);
    queue_remove(std::move(rm_keys), std::move(rm_ids), std::move(rm_slots), std::move(instances), now, out);
  }
}

void OwnerCore::on_master_failure(uint64_t token) {
  // The job stays as it is and tick() re-sends it with the same identity when its retry time
  // comes: nothing is freed on a guess (T1). Only the failure is counted.
  if (!known_token(token)) return;
  counters_.master_failures_total++;
  // A proxied request is answered by the client's own timeout (not retried: it changes nothing).
  // An exists question is answered with its local prefix at the next tick.
  if (kind_of(token) == JobKind::kExists)
    if (auto e = exists_jobs_.find(token); e != exists_jobs_.end()) e->second.deadline = 0;
}

void OwnerCore::tick(Millis now, Outbox& out) {
  now_ = now;
  flush_gets(now, out);
  expire_exists(now, out);
  // Deadline-ordered: only the jobs whose re-send time has come are touched.
  for (uint64_t put_id : publish_.due(now)) {
    counters_.publish_retry_total++;
    send_publish(put_id, publish_.at(put_id), now, out);
  }
  for (uint64_t id : removes_.due(now)) send_remove(id, removes_.at(id), now, out);
  for (uint64_t id : get_jobs_.due(now)) {
    counters_.get_master_retry_total++;
    send_get_job(id, get_jobs_.at(id), now, out);
  }
  // Handle TTL: the same release path as cancel (a handle with a parked get_transfer is bounded
  // by its transfer deadline instead).
  std::vector<uint64_t> expired;
  for (auto t = handle_ttl_.begin(); t != handle_ttl_.end() && t->first <= now; ++t)
    if (handles_.at(t->second).waiting_token == 0) expired.push_back(t->second);
  for (uint64_t hid : expired) {
    counters_.handle_ttl_expired_total++;
    release_handle(hid, now, out);
  }
  serve_pending_gets(now, out, true);
  serve_transfers(now, out);
  launch_transfers(now, out);
  settle_replica_flights(now, out);
  poll_replica_tasks(now, out);
  retry_writebacks(now, out);
  if (register_token_ && now - register_sent_ >= Millis(cfg_.publish_retry_ms)) start(now, out);
  // Reserve waits: the head waiter keeps eviction going while it waits (bounded per round), the
  // soft wait is noted, the hard timeout fails the claim naming its stage.
  serve_waiters(out);
  keep_free(now, out);
  if (!waiters_.empty()) {
    const auto* head = waiters_.front().req->body.AsPutStartReq();
    const uint64_t ss = slot_size_for(head->value_len);
    evict_for(ss, ss * head->keys.size(), now, out);
  }
  size_t pos = 0;  // position in the queue before this tick's expiries
  for (size_t i = 0; i < waiters_.size(); ++pos) {
    Waiter& w = waiters_[i];
    if (!w.soft_noted && now - w.since >= cfg_.soft_wait_ms) {
      w.soft_noted = true;
      counters_.reserve_soft_wait_total++;
    }
    const uint32_t asked = w.req->body.AsPutStartReq()->max_wait_ms;
    const Millis limit = asked ? std::min<Millis>(asked, cfg_.hard_timeout_ms) : Millis(cfg_.hard_timeout_ms);
    if (now - w.since >= limit) {
      counters_.reserve_timeout_total++;
      Status s(Code::kLocalReserveTimeout, "no slot became free within " + std::to_string(limit) +
                                               " ms; pool: " + std::to_string(pool_.counts().free) + " free, " +
                                               std::to_string(pool_.counts().grants) + "/" +
                                               std::to_string(pool_.counts().grant_limit) + " grants");
      s.stage = pos == 0 ? "refill" : "claim_turn";
      reply_error(w.session, w.token, s, out);
      waiters_.erase(waiters_.begin() + i);
    } else {
      ++i;
    }
  }
}

void OwnerCore::close_session(uint64_t session, Outbox& out) {
  auto closed = sessions_.close(session);
  if (!closed) return;
  const Session& s = *closed;
  for (uint64_t put_id : s.plans) {
    auto p = plans_.find(put_id);
    if (p == plans_.end()) continue;
    for (size_t i = 0; i < p->second.keys.size(); ++i) {
      auto inf = inflight_.find(p->second.keys[i]);
      if (inf != inflight_.end() && inf->second == put_id) inflight_.erase(inf);
      pool_.abort(p->second.slots[i]);
    }
    plans_.erase(p);
  }
  for (auto p = pending_gets_.begin(); p != pending_gets_.end();) {
    if (p->second.session == session) {
      for (const auto& item : p->second.items) release_item(item, now_, out);
      p = pending_gets_.erase(p);
    } else {
      ++p;
    }
  }
  for (uint64_t h : s.handles) release_handle(h, now_, out);
  sessions_.release_holdings(pool_, s);
  std::erase_if(waiters_, [session](const Waiter& w) { return w.session == session; });
  if (pool_.take_freed()) serve_waiters(out);
}

wire::StatsReplyT OwnerCore::stats() const {
  auto c = pool_.counts();
  wire::StatsReplyT r;
  r.slots_free = c.free;
  r.slots_prepared = c.prepared;
  r.slots_pending_local_visible = c.pending_local_visible;
  r.slots_pending = c.pending;
  r.slots_committed = c.committed;
  r.grants = c.grants;
  r.active_put_plans = plans_.size();
  r.active_get_handles = handles_.size();
  r.holders = sessions_.holders();
  r.routes = live_routes_;
  r.sessions = sessions_.size();
  r.publish_jobs = publish_.size() + removes_.size();
  for (const auto& [id, f] : flights_) {
    if (f.phase == Phase::kStarting) r.flights_starting++;
    else if (f.phase == Phase::kStarted) r.flights_started++;
    else if (f.phase == Phase::kFinishing) r.flights_finishing++;
  }
  for (const auto& [id, j] : get_jobs_)
    if (j.kind == GetJob::Kind::kRevoke) r.flights_revoking += j.keys.size();
  r.get_jobs = get_jobs_.size();
  r.pending_gets = pending_gets_.size();
  return r;
}

}  // namespace fluxon
