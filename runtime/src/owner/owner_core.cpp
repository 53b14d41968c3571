// The router: each input goes to the component that owns it; what a step means for another
// component is handed on here, in the order the step produced it.
#include "fluxon/owner/owner_core.hpp"

#include "fluxon/core/stat_values.hpp"

namespace fluxon {

OwnerCore::OwnerCore(const OwnerCoreConfig& cfg, uint64_t generation, std::string segment_name, uint64_t segment_len)
    : s_(cfg, generation, segment_len),
      segment_name_(std::move(segment_name)),
      segment_len_(segment_len),
      put_(s_),
      removal_(s_),
      eviction_({cfg.eviction, cfg.eviction_max_bytes_per_round, cfg.eviction_free_watermark}),
      reclaim_(s_),
      gets_(s_),
      replicas_(s_, gets_),
      writeback_(s_),
      exists_(s_) {
  // Expected capacity: its grants were carved by the pool at construction (the warm-up).
  if (cfg.expected_capacity) warmup_bytes_ = s_.pool.counts().grant_limit * cfg.grant_bytes;
}

// ---- registration ------------------------------------------------------------------------------

void OwnerCore::start(Millis now, Outbox& out) {
  now_ = now;
  registered_ = false;
  register_token_ = s_.new_token(JobKind::kRegister);  // an older attempt's reply is dropped from now on
  register_sent_ = now;
  s_.to_master(register_token_, register_request(), out);
}

Envelope OwnerCore::register_request() const {
  wire::RegisterOwnerT r;
  r.node_id = s_.cfg.node_id;
  r.generation = s_.generation;
  r.role = s_.cfg.role;
  r.segment_len = segment_len_;
  r.data_host = data_host_;
  r.data_port = data_port_;
  return make_envelope(std::move(r));
}

void OwnerCore::on_master_reconnected(Millis now, Outbox& out) {
  now_ = now;
  start(now, out);
  put_.resync(now, out);
  removal_.resend_all(now, out);
  reclaim_.resend_all(now, out);
  gets_.resend_all(now, out);
}

// ---- client requests and notes -----------------------------------------------------------------

void OwnerCore::on_client_request(uint64_t token, Envelope& req, Millis now, Outbox& out) {
  now_ = now;
  dispatch_client(token, req, now, out);
  serve_waiters_if_freed(out);
}

void OwnerCore::dispatch_client(uint64_t token, Envelope& req, Millis now, Outbox& out) {
  const uint64_t session = req.session_id;
  if (req.body.AsHello()) {
    if (s_.sessions.size() >= s_.cfg.limits.sessions) {  // the bound: no new client
      s_.counters.sessions_full_total++;
      return s_.reply_error(0, token,
                            Status(Code::kNoSpace, std::to_string(s_.sessions.size()) +
                                                       " client sessions are open (the bound): Hello refused"),
                            out);
    }
    const uint64_t sid = s_.sessions.open();
    wire::HelloReplyT r;
    r.node_id = s_.cfg.node_id;
    r.generation = s_.generation;
    r.session_id = sid;
    r.segment_name = segment_name_;
    r.segment_len = segment_len_;
    r.get_handle_ttl_ms = s_.cfg.get_handle_ttl_ms;
    r.grant_bytes = s_.cfg.grant_bytes;
    return s_.reply(sid, token, make_envelope(std::move(r)), out);
  }
  if (auto* p = req.body.AsPing()) return s_.reply(session, token, make_envelope(wire::PongT{{}, p->seq}), out);
  if (req.body.AsStatsReq()) return s_.reply(session, token, make_envelope(stats_reply()), out);
  if (!admits(token, session, req.generation, out)) return;
  if (req.body.AsPutStartReq()) {
    auto fetching = [this](const std::string& k) { return gets_.fetching(k); };
    if (auto room = put_.start(token, session, req, now, out, fetching)) want_room(*room);
    return;
  }
  if (auto* p = req.body.AsPutCommitReq()) return commit(token, session, p->put_id, now, out);
  if (auto* p = req.body.AsPutAbortReq()) return put_.abort(token, session, p->put_id, out);
  if (auto* p = req.body.AsGetStartReq()) {
    key_views_.assign(p->keys.begin(), p->keys.end());
    return get_start(token, session, GetStartArgs{key_views_, p->atomic_group_lens, p->prefix_best_effort, p->max_wait_ms},
                     now, out);
  }
  if (auto* p = req.body.AsGetTransferReq()) return gets_.get_transfer(token, session, *p, now, out);
  if (auto* p = req.body.AsExistsReq()) return exists_.ask(token, session, *p, now, out);
  if (auto* p = req.body.AsRemovePrefixReq()) return remove_prefix(token, session, *p, now, out);
  // Forwarded, the master's answer passed back: clients of a daemon owner have no master link.
  if (req.body.AsMasterStatsReq() || req.body.AsKvEventsReq()) {
    const uint64_t tok = s_.new_token(JobKind::kProxy);
    proxied_[tok] = {session, token};
    Envelope fwd;
    fwd.body = std::move(req.body);
    return s_.to_master(tok, std::move(fwd), out);
  }
  s_.reply_error(session, token, Status(Code::kMalformedMessage, std::string("unexpected request ") + body_name(req)),
                 out);
}

bool OwnerCore::admits(uint64_t token, uint64_t session, uint64_t generation, Outbox& out) {
  // Identity first: a caller holding an old generation never touches this owner's memory.
  if (generation != 0 && generation != s_.generation) {
    s_.reply_error(session, token,
                   Status(Code::kGenerationMismatch, "request for owner generation " + std::to_string(generation) +
                                                         ", owner is at " + std::to_string(s_.generation)),
                   out);
    return false;
  }
  if (!s_.sessions.contains(session)) {
    s_.reply_error(session, token, Status(Code::kClosed, "unknown or closed session " + std::to_string(session)), out);
    return false;
  }
  return true;
}

void OwnerCore::on_get_start(uint64_t token, uint64_t session, uint64_t generation, const GetStartArgs& args,
                             Millis now, Outbox& out) {
  now_ = now;
  if (admits(token, session, generation, out)) get_start(token, session, args, now, out);
  serve_waiters_if_freed(out);
}

void OwnerCore::get_start(uint64_t token, uint64_t session, const GetStartArgs& args, Millis now, Outbox& out) {
  if (gets_.get_start(token, session, args, now, out)) launch_transfers(now, out);
}

void OwnerCore::on_client_note(Envelope& note, Millis now, Outbox& out) {
  now_ = now;
  if (note.generation != 0 && note.generation != s_.generation) {
    s_.counters.generation_mismatch_total++;
    return;  // holdings of an old generation died with it
  }
  if (auto* ack = note.body.AsAckBatch()) gets_.on_ack(*ack, note.session_id, now, out);
  else s_.counters.malformed_total++;
  serve_waiters_if_freed(out);
}

void OwnerCore::close_session(uint64_t session, Outbox& out) {
  auto closed = s_.sessions.close(session);
  if (closed) {
    put_.close_session(*closed, session);
    gets_.close_session(*closed, session, now_, out);
  }
  // Holdings are kept by session id alone: a session that only ever read has them too.
  const size_t held = s_.sessions.release_holdings(s_.pool, session);
  if (closed || held > 0) serve_waiters_if_freed(out);
}

void OwnerCore::remove_prefix(uint64_t token, uint64_t session, const wire::RemovePrefixReqT& req, Millis now,
                              Outbox& out) {
  if (req.prefix.empty())
    return s_.reply_error(session, token,
                          invalid_argument("prefix: must not be empty (it would remove every value)"), out);
  if (removal_.full()) {  // the bound: removals in flight wait for the master
    s_.counters.remove_jobs_full_total++;
    return s_.reply_error(session, token,
                          Status(Code::kNoSpace, std::to_string(removal_.size()) +
                                                     " route removals wait for the master (the bound): remove_prefix refused"),
                          out);
  }
  std::vector<std::string> keys;
  for (const auto& [k, e] : s_.local.entries())
    if (k.size() >= req.prefix.size() && k.compare(0, req.prefix.size(), req.prefix) == 0) keys.push_back(k);
  // Route first, then the slot once its last holder is gone (S2): the path of every removal. The
  // routes leave in RemoveRoutes jobs of kRemoveBatch (one message each, not one per key).
  Removals batch;
  for (const auto& k : keys) {
    if (auto r = take_key(k)) batch.push_back(std::move(*r));
    if (batch.size() == kRemoveBatch) removal_.queue(std::exchange(batch, {}), now, out);
  }
  if (!batch.empty()) removal_.queue(std::move(batch), now, out);
  s_.counters.removed_by_prefix_total += keys.size();
  wire::RemovePrefixReplyT r;
  r.removed = keys.size();
  s_.reply(session, token, make_envelope(std::move(r)), out);
}

// ---- master replies ----------------------------------------------------------------------------

void OwnerCore::on_master_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out) {
  now_ = now;
  // Fencing: a deposed leader's answer (and the tasks and victims it carries) is never acted on;
  // the job stays and its timer re-sends to the leader of the newest term.
  if (reply.term < s_.master_term) {
    s_.counters.stale_term_replies_total++;
    return;
  }
  s_.master_term = reply.term;
  if (!reply.evict.empty()) take_tier_victims(reply, now, out);
  if (!reply.unbacked.empty()) writeback_.unbacked(reply.unbacked, now, out);
  const JobKind kind = OwnerShared::kind_of(token);
  if (kind == JobKind::kProxy) {
    if (auto p = proxied_.find(token); p != proxied_.end()) {
      s_.reply(p->second.first, p->second.second, std::move(reply), out);
      proxied_.erase(p);
    }
    return;
  }
  if (kind == JobKind::kExists) return exists_.on_reply(token, reply, out);
  if (reply.body.AsError()) return;  // keep the job; its timer re-sends with the same identity
  switch (kind) {
    case JobKind::kRegister:
      if (token != register_token_) return;  // an older registration's answer
      register_token_ = 0;
      if (auto* rr = reply.body.AsRegisterOwnerReply()) {
        registered_ = true;
        s_.replica_target = rr->replica_target;
        tier_poll_ms_ = rr->tier_poll_ms;
      }
      break;
    case JobKind::kTierPoll:
      if (token == tier_poll_token_) tier_poll_token_ = 0;
      break;
    case JobKind::kReplicaPoll:
      if (!replicas_.on_reply(token, reply, now, out, [this](const std::string& k) { return put_.in_flight(k); }))
        return;
      break;
    case JobKind::kGet: on_get_reply(token, reply, now, out); break;
    case JobKind::kWriteBackBatch:
      for (const auto& cohorts : writeback_.on_batch_reply(token, reply)) {
        // Backed on a target: one demotion transaction over the job's exact cohort set (A1).
        reclaim_.begin(take_cohorts(cohorts), now, out, true);
      }
      break;
    case JobKind::kPublish: {
      for (auto& settled : put_.on_reply(token, reply, now, out)) {
        went_live(settled, now, out);
        if (auto& wt = settled.write_through)
          writeback_.write_through(wt->put_id, wt->session, std::move(wt->cohorts), std::move(wt->keys),
                                   std::move(wt->versions), now, out);
      }
      break;
    }
    case JobKind::kRemove: removal_.on_reply(token, reply, now); break;
    case JobKind::kReclaim: reclaim_.on_reply(token, reply, now, out, reclaim_busy()); break;
    default: return;  // not a token of this owner
  }
  write_through_done(out);
  serve_waiters_if_freed(out);
}

bool OwnerCore::known_token(uint64_t token) const {
  switch (OwnerShared::kind_of(token)) {
    case JobKind::kRegister: return token == register_token_;
    case JobKind::kProxy: return proxied_.count(token) != 0;
    case JobKind::kExists: return exists_.owns(token);
    case JobKind::kReplicaPoll: return replicas_.owns(token);
    case JobKind::kGet: return gets_.owns(token);
    case JobKind::kWriteBackBatch: return writeback_.owns_batch(token);
    case JobKind::kPublish: return put_.owns(token);
    case JobKind::kRemove: return removal_.owns(token);
    case JobKind::kReclaim: return reclaim_.owns(token);
    case JobKind::kTierPoll: return token == tier_poll_token_;
  }
  return false;
}

void OwnerCore::on_master_failure(uint64_t token) {
  // The job stays as it is and its timer re-sends it with the same identity: nothing is freed on
  // a guess (T1). Only the failure is counted. A proxied request is answered by the client's own
  // timeout (it changes nothing); an exists question with its local prefix at the next tick.
  if (!known_token(token)) return;
  s_.counters.master_failures_total++;
  if (OwnerShared::kind_of(token) == JobKind::kExists) exists_.master_failed(token);
  if (OwnerShared::kind_of(token) == JobKind::kPublish) put_.master_failed(token);
  if (OwnerShared::kind_of(token) == JobKind::kProxy) proxied_.erase(token);  // its client times out: no entry left
}

// ---- the data plane and the clock --------------------------------------------------------------

void OwnerCore::flush_gets(Millis now, Outbox& out) { gets_.flush(now, out); }

void OwnerCore::on_transfer_done(uint64_t id, const Status& result, Millis now, Outbox& out) {
  now_ = now;
  gets_.on_transfer_done(id, result, now, out);
  serve_waiters_if_freed(out);
}

void OwnerCore::on_peer_reads(const std::vector<uint64_t>& offsets, uint64_t dropped_total) {
  s_.counters.peer_reads_dropped_total = std::max(s_.counters.peer_reads_dropped_total, dropped_total);
  for (const uint64_t off : offsets) {
    const auto slot = s_.pool.slot_at(off);
    const auto* entry = slot ? s_.local.at_slot(*slot) : nullptr;
    if (!entry || !entry->second.live) continue;  // gone since (evicted, replaced), or leaving
    s_.local.touch(entry->first);
    s_.counters.peer_read_keys_total++;
  }
}

void OwnerCore::tick(Millis now, Outbox& out) {
  now_ = now;
  gets_.flush(now, out);
  exists_.expire(now, out);
  // Deadline-ordered: only the jobs whose re-send time has come are touched.
  put_.retry_due(now, out);
  removal_.retry_due(now, out);
  reclaim_.retry_due(now, out);
  gets_.retry_due(now, out);
  gets_.expire_handles(now, out);
  if (gets_.serve_pending(now, out, true)) launch_transfers(now, out);
  gets_.serve_transfers(now, out);
  launch_transfers(now, out);
  replicas_.settle(now, out);
  replicas_.poll(now, out, [this](const std::string& k) { return put_.in_flight(k); });
  writeback_.retry(now, out);
  tier_poll(now, out);
  if (register_token_ && now - register_sent_ >= Millis(s_.cfg.publish_retry_ms)) start(now, out);
  // Reserve waits: the head waiter keeps eviction going while it waits (pressure, bounded per
  // round), the soft wait is noted, the hard timeout fails the claim naming its stage.
  serve_waiters(out);
  if (auto room = put_.head_need()) want_room(*room);
  pressure(now, out);
  put_.expire_waiters(now, out);
  write_through_done(out);
  shrink_idle_grants(now);
}

void OwnerCore::shrink_idle_grants(Millis now) {
  // Dynamic mode only: with an expected capacity its grants are the floor (and the limit).
  if (s_.cfg.idle_grant_shrink_ms == 0 || s_.cfg.expected_capacity || now < next_shrink_check_) return;
  next_shrink_check_ = now + std::max<Millis>(1, Millis(s_.cfg.idle_grant_shrink_ms) / 4);
  std::map<uint32_t, Millis> still;
  for (uint32_t g : s_.pool.idle_grants()) {
    auto it = idle_since_.find(g);
    const Millis since = it == idle_since_.end() ? now : it->second;
    if (now - since >= Millis(s_.cfg.idle_grant_shrink_ms) && s_.pool.release_grant(g)) {
      s_.counters.grants_shrunk_total++;
      released_.emplace_back(uint64_t(g) * s_.cfg.grant_bytes, s_.cfg.grant_bytes);
      continue;
    }
    still.emplace(g, since);  // a grant used meanwhile starts over the next time it is idle
  }
  idle_since_ = std::move(still);
}

void OwnerCore::write_through_done(Outbox& out) {
  // A write_through put's future completes here: its remote copy exists, or it cannot.
  for (auto& d : writeback_.take_write_through_done()) {
    if (!s_.sessions.contains(d.session)) continue;
    wire::PutLiveT live;
    live.put_id = d.put_id;
    if (!d.status.is_ok()) live.error = std::make_unique<wire::ErrorT>(to_wire(d.status));
    s_.note(d.session, make_envelope(std::move(live)), out);
  }
}

// ---- hand-offs ---------------------------------------------------------------------------------

void OwnerCore::commit(uint64_t token, uint64_t session, uint64_t put_id, Millis now, Outbox& out) {
  auto done = put_.commit(token, session, put_id, now, out);
  if (done.put_id == 0) return;
  if (!done.removals.empty()) removal_.queue(std::move(done.removals), now, out);  // the versions it replaced, one job
  put_.publish(done.put_id, now, out);
}

void OwnerCore::serve_waiters(Outbox& out) {
  if (auto room = put_.serve_waiters(out, [this](const std::string& k) { return gets_.fetching(k); }))
    want_room(*room);
}

void OwnerCore::serve_waiters_if_freed(Outbox& out) {
  if (s_.pool.take_freed()) serve_waiters(out);
}

void OwnerCore::went_live(PutPath::Settled& settled, Millis now, Outbox& out) {
  if (!settled.removals.empty()) removal_.queue(std::move(settled.removals), now, out);
  writeback_.admit(settled.live, now, out, /*puts=*/true);
}

std::optional<Removal> OwnerCore::take_key(const std::string& key) {
  auto it = s_.local.find(key);
  if (it == s_.local.end()) return std::nullopt;
  const Entry e = it->second;
  s_.local.erase(it);
  return put_.supersede(key, e);
}

void OwnerCore::remove_key(const std::string& key, Millis now, Outbox& out) {
  if (auto r = take_key(key)) removal_.queue({std::move(*r)}, now, out);
}

void OwnerCore::launch_transfers(Millis now, Outbox& out) {
  auto round = gets_.prepare_transfers(now, out);
  for (const auto& room : round.room) want_room(room);  // fetched values need slots too
  gets_.send_transfers(round, out);
}

void OwnerCore::on_get_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out) {
  auto settled = gets_.on_job_reply(token, reply, now, out);
  if (settled.started) {
    if (gets_.serve_pending(now, out, false)) launch_transfers(now, out);
    launch_transfers(now, out);
  }
  if (settled.done) {
    for (auto& r : settled.removals) removal_.queue(std::move(r), now, out);
    writeback_.admit(settled.live, now, out);
    gets_.serve_transfers(now, out);
  }
}

Reclaim::BusyCheck OwnerCore::reclaim_busy() {
  // A member is not released while a put of its key is open here, a remote get brings the key
  // here, or its route is being re-published (its reclaim is tried again later).
  return [this](const std::string& key, const Entry& e) -> const char* {
    if (put_.in_flight(key)) return "put";
    if (gets_.fetching(key)) return "fetch";
    if (put_.resyncing(e.put_id)) return "resync";
    return nullptr;
  };
}

void OwnerCore::want_room(RoomNeeded room) {
  uint64_t& b = room_[room.slot_size];
  b = std::max(b, room.bytes);
}

void OwnerCore::pressure(Millis now, Outbox& out) {
  // The one caller of eviction: a round at most every eviction_interval_ms, selecting, per slot
  // class, what waiting claims and fetches need now and the free watermark lacks, less the debt.
  // A need still real is said again by the next tick (the head waiter, a fetch without a slot):
  // between rounds none is kept, so a round never acts on one that was served meanwhile.
  if (now < next_pressure_) {
    room_.clear();
    return;
  }
  for (const auto& [size, bytes] : eviction_.deficits(s_.pool)) {
    uint64_t& b = room_[size];
    if (bytes > b) {
      b = bytes;
      s_.counters.pressure_evictions_total++;
    }
  }
  if (room_.empty()) return;
  auto wanted = std::exchange(room_, {});
  if (reclaim_.full()) {  // transactions at their bound: wait for them
    s_.counters.eviction_paused_total++;
    return;
  }
  next_pressure_ = now + s_.cfg.eviction_interval_ms;
  bool selected = false;
  // Only a leaf pass reads what puts on their way continue: without chains or the depth order, no set.
  const std::unordered_set<std::string> continued =
      s_.local.chained() || s_.local.depth_order() ? put_.continued() : std::unordered_set<std::string>{};
  const Eviction::Marks marks{[this](LocalIndex::CohortId c) { return reclaim_.owns_cohort(c); },
                              [this](LocalIndex::CohortId c) { return writeback_.writing_back(c); }, &continued};
  for (auto [size, bytes] : wanted) {
    // A class that cannot get its slots in its own grants (none free enough, none left to carve)
    // has a grant of another class drained for it: all of that grant's entries are wanted.
    std::optional<uint32_t> drain;
    if (!s_.pool.can_carve() && s_.pool.available_slots(size) * size < bytes && (drain = s_.pool.drain_for(size)))
      bytes = std::max(bytes, s_.pool.used_bytes(*drain));
    const auto victims = eviction_.select(s_.local, s_.pool, size, bytes, reclaim_.debt_bytes(), marks, drain);
    for (const auto& cohort : victims) evict_cohort(cohort, now, out);
    selected = selected || !victims.empty();
  }
  if (selected) s_.counters.eviction_rounds_total++;
}

void OwnerCore::evict_cohort(LocalIndex::CohortId cohort, Millis now, Outbox& out) {
  // A1: the exact cohort (with the other TP ranks' same group), never part of it: one transaction.
  std::vector<Reclaim::Member> members;
  for (const auto& id : s_.local.exact_cohort(cohort)) {
    if (reclaim_.owns_cohort(id)) continue;  // a transaction has it already
    // E16ba: what this eviction loses - nothing for a remote-complete cohort; a write-back still
    // copying it (nothing else could go) is a shortfall of the lead window.
    const bool recoverable = s_.local.remote_complete(id);
    const bool copying = !recoverable && writeback_.writing_back(id);
    // A write-back of this cohort has nothing left to copy or demote: capacity eviction came first (S3).
    writeback_.cohort_evicted(id);
    for (const auto& m : take_cohorts({id})) {
      const uint64_t bytes = s_.pool.slot_size(m.e.slot);
      s_.counters.evicted_keys_total++;
      s_.counters.evicted_bytes_total += bytes;
      if (recoverable) s_.counters.eviction_recoverable_bytes_total += bytes;
      if (copying) s_.counters.eviction_shortfall_bytes_total += bytes;
      members.push_back(m);
    }
  }
  reclaim_.begin(std::move(members), now, out);
}

void OwnerCore::tier_poll(Millis now, Outbox& out) {
  if (tier_poll_ms_ == 0) return;
  const Millis wait = tier_poll_token_ ? Millis(s_.cfg.publish_retry_ms) : Millis(tier_poll_ms_);
  if (now - tier_poll_sent_ < wait) return;
  tier_poll_sent_ = now;
  tier_poll_token_ = s_.new_token(JobKind::kTierPoll);
  s_.to_master(tier_poll_token_, make_envelope(wire::TierPollT{{}, s_.cfg.node_id, s_.generation}), out);
}

void OwnerCore::take_tier_victims(const Envelope& reply, Millis now, Outbox& out) {
  for (const auto& v : reply.evict) {
    s_.counters.tier_victims_total++;
    auto it = s_.local.find(v->key);
    const Version ver{v->origin_node, v->origin_generation, v->origin_put_id};
    if (it == s_.local.end() || !it->second.live || !(it->second.ver == ver)) {
      s_.counters.tier_victims_stale_total++;  // gone or replaced here: the master learns it from the drop
      continue;
    }
    const LocalIndex::CohortId id{it->second.put_id, it->second.group};
    // Taken already (a victim of the same cohort, a duplicate, this owner's own eviction): it goes.
    if (reclaim_.owns_cohort(id)) {
      s_.counters.tier_victims_taken_total++;
      continue;
    }
    // Held, still being published, or no room for a transaction: the master hands it again or
    // takes it back into T2.
    if (reclaim_.full() || s_.local.cohort_busy(id, s_.pool)) {
      s_.counters.tier_victims_busy_total++;
      continue;
    }
    if (v->demote) {
      s_.counters.tier_victims_demoted_total++;
      reclaim_.begin(take_cohorts(s_.local.exact_cohort(id)), now, out, true);
    } else {
      s_.counters.tier_victims_evicted_total++;
      evict_cohort(id, now, out);
    }
  }
}

std::vector<Reclaim::Member> OwnerCore::take_cohorts(const std::vector<LocalIndex::CohortId>& ids) {
  // The live members of the cohorts no transaction owns yet, out of the resident tier.
  std::vector<Reclaim::Member> members;
  for (const auto& id : ids) {
    const auto* c = s_.local.cohort(id);
    if (!c || reclaim_.owns_cohort(id)) continue;  // gone, or a transaction has it already
    for (const auto& key : *c) {
      auto it = s_.local.find(key);
      if (it == s_.local.end() || it->second.put_id != id.first || !it->second.live) continue;
      s_.local.leave_resident(key, id.first);
      members.push_back(Reclaim::Member{key, it->second});
    }
  }
  return members;
}

// ---- views -------------------------------------------------------------------------------------

std::vector<std::pair<uint64_t, uint64_t>> OwnerCore::take_new_grant_ranges() {
  std::vector<std::pair<uint64_t, uint64_t>> r;
  for (uint32_t g : s_.pool.take_new_grants()) r.emplace_back(uint64_t(g) * s_.cfg.grant_bytes, s_.cfg.grant_bytes);
  handed_bytes_ += r.size() * s_.cfg.grant_bytes;
  return r;
}

int OwnerCore::local_state(const std::string& key) const {
  auto it = s_.local.find(key);
  if (it == s_.local.end()) return 0;
  return it->second.live ? 2 : 1;
}

bool OwnerCore::remote_complete(const std::string& key) const {
  auto it = s_.local.find(key);
  if (it == s_.local.end()) return false;
  for (const auto& id : s_.local.exact_cohort({it->second.put_id, it->second.group}))
    if (!s_.local.remote_complete(id)) return false;
  return true;
}

OwnerStats OwnerCore::stats() const {
  auto c = s_.pool.counts();
  OwnerStats r;
  r.slots_free = c.free;
  r.slots_prepared = c.prepared;
  r.slots_pending_local_visible = c.pending_local_visible;
  r.slots_pending = c.pending;
  r.slots_committed = c.committed;
  r.grants = c.grants;
  r.warmup_bytes = warmup_bytes_;
  r.warmed_bytes = std::min(populated_bytes_, warmup_bytes_);
  r.populate_backlog_bytes = handed_bytes_ > populated_bytes_ ? handed_bytes_ - populated_bytes_ : 0;
  r.active_put_plans = put_.plans();
  r.holders = s_.sessions.holders();
  r.routes = s_.live_routes;
  r.sessions = s_.sessions.size();
  r.publish_jobs = put_.publish_jobs() + removal_.size();
  r.reclaims = reclaim_.size();
  r.replica_flights = replicas_.in_flight();
  r.replica_retries_waiting = replicas_.retries_waiting();
  r.writeback_jobs = writeback_.pending();
  r.hot_bytes = hot_bytes();
  r.resident_bytes = s_.local.resident_bytes();
  if (const DepthOrder* order = s_.local.depth_order())
    r.eviction_stale_bytes = order->stale_bytes() == UINT64_MAX ? 0 : order->stale_bytes();
  r.replica_budget_pressure_permille = uint64_t(put_.replica_pressure() * 1000 + 0.5);
  r.pending_eviction_reclaim_bytes = reclaim_.debt_bytes();
  gets_.fill_stats(r);
  return r;
}

wire::StatsReplyT OwnerCore::stats_reply() const {
  wire::StatsReplyT r;
  r.values = stat_values(stats(), s_.counters);
  return r;
}

}  // namespace fluxon
