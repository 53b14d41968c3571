// OwnerCore's read path: get_start's per-key split into local pins, joins and leaders (G1-G4), the
// per-key flights that materialise remote keys (G6, G7), their batched master jobs (G8), the data
// plane batches, the prefix decision with its immediate tail release (G5), and get_transfer.
//
// The core runs on one actor thread: each key is linearised by that thread, no lock spans a batch,
// nothing waits inside a call (G3, G10). A flight's marker is installed before its BatchGetStart
// leaves, so an overlapping batch joins it instead of starting its own fetch.
#include <algorithm>

#include "fluxon/core/owner_core.hpp"
#include "fluxon/runtime/batch.hpp"

namespace fluxon {

void OwnerCore::get_start(uint64_t token, uint64_t session, wire::GetStartReqT& req, Millis now, Outbox& out) {
  const size_t n = req.keys.size();
  std::optional<std::vector<uint32_t>> groups;
  if (!req.atomic_group_lens.empty()) groups = req.atomic_group_lens;
  Status st = validate_keys(req.keys);
  if (st.is_ok()) st = validate_group_lens(groups, n);
  if (!st.is_ok()) return reply_error(session, token, st, out);
  counters_.get_start_total++;
  counters_.get_keys_total += n;
  counters_.get_required_keys_total += n;
  const Millis wait = req.max_wait_ms ? std::min<Millis>(req.max_wait_ms, cfg_.get_start_wait_ms) : cfg_.get_start_wait_ms;
  PendingGet pg{token, session, groups, req.prefix_best_effort, std::vector<GetItem>(n), now + wait};
  GetJob start{GetJob::Kind::kStart, {}, {}, {}, 0};
  uint64_t batch = 0;
  uint32_t group = 0, left = groups ? (*groups)[0] : 1;
  for (size_t i = 0; i < n; ++i) {
    if (left == 0) {
      group++;
      left = groups ? (*groups)[group] : 1;
    }
    left--;
    const std::string& key = req.keys[i];
    // LocalJoin: pinned at once (G2). V1: a precommit entry is a local hit, exactly like a live one.
    if (auto it = local_.find(key); it != local_.end()) {
      const Entry& e = it->second;
      if (e.live) {  // eviction and write-back order follow reads too
        local_.touch(key);
      }
      const uint64_t hid = sessions_.hold(pool_, e.slot, session);
      pg.items[i] = GetItem{GetItem::Kind::kLocal, hid, e.len, false};
      continue;
    }
    // InflightJoin: a waiter on the key's flight; no second slot, GetStart or transfer (G6).
    if (auto f = flight_of_.find(key); f != flight_of_.end()) {
      flights_.at(f->second).interest++;
      counters_.get_joins_total++;
      pg.items[i] = GetItem{GetItem::Kind::kFlight, f->second, 0, false};
      continue;
    }
    if (alone()) {  // the only owner of the cluster: no other copy exists
      counters_.get_alone_misses_total++;
      continue;
    }
    // Leader: its marker is visible to every later batch before the master hears of it (G2, G3).
    if (flights_.size() >= cfg_.limits.flights) {  // the bound: no new fetch, the key is a miss
      counters_.flights_full_total++;
      continue;  // pg.items[i] stays a miss
    }
    if (batch == 0) batch = next_put_id_++;
    const uint64_t fid = next_flight_++;
    Flight fl;
    fl.key = key;
    fl.interest = 1;
    fl.batch = batch;
    fl.group = group;
    flights_.emplace(fid, std::move(fl));
    flight_of_[key] = fid;
    start.get_ids.push_back(fid);
    start.keys.push_back(key);
    pg.items[i] = GetItem{GetItem::Kind::kFlight, fid, 0, true};
  }
  if (!start.keys.empty()) {
    // G8: every leader of the batch in one BatchGetStart; G9: with the leaders of the other
    // get_starts that arrive before the driver calls flush_gets() (the owner actor: once its mailbox
    // holds nothing older; the simulator: at the next tick), so concurrent batches (TP ranks) share it.
    counters_.get_flights_started_total += start.keys.size();
    start_buffer_.get_ids.insert(start_buffer_.get_ids.end(), start.get_ids.begin(), start.get_ids.end());
    start_buffer_.keys.insert(start_buffer_.keys.end(), start.keys.begin(), start.keys.end());
    counters_.get_leader_requests_total++;
  }
  if (!waits_for_master(pg)) {  // all local (the hot path), or joins past Starting: answer now
    const bool remote = std::any_of(pg.items.begin(), pg.items.end(),
                                    [](const GetItem& i) { return i.kind == GetItem::Kind::kFlight; });
    decide_get(pg, now, out);
    if (remote) launch_transfers(now, out);
    return;
  }
  pending_gets_.emplace(next_pending_get_++, std::move(pg));
}

bool OwnerCore::waits_for_master(const PendingGet& pg) const {
  for (const auto& item : pg.items)
    if (item.kind == GetItem::Kind::kFlight && flights_.at(item.id).phase == Phase::kStarting) return true;
  return false;
}

void OwnerCore::serve_pending_gets(Millis now, Outbox& out, bool expire) {
  std::vector<uint64_t> ready;
  for (auto& [id, pg] : pending_gets_) {
    const bool starting = waits_for_master(pg);
    if (!starting || (expire && now >= pg.deadline)) {
      if (starting) counters_.get_wait_timeouts_total++;
      ready.push_back(id);
    }
  }
  for (uint64_t id : ready) {
    auto it = pending_gets_.find(id);
    PendingGet pg = std::move(it->second);
    pending_gets_.erase(it);
    decide_get(pg, now, out);
  }
  if (!ready.empty()) launch_transfers(now, out);
}

void OwnerCore::decide_get(PendingGet& pg, Millis now, Outbox& out) {
  const size_t n = pg.items.size();
  // A flight that is Ready by now is a local copy: pin it and drop the interest.
  for (auto& item : pg.items) {
    if (item.kind != GetItem::Kind::kFlight) continue;
    Flight& f = flights_.at(item.id);
    if (f.phase != Phase::kReady) continue;
    const uint64_t hid = sessions_.hold(pool_, *f.slot, pg.session);
    const uint64_t fid = item.id;
    const bool leader = item.leader;
    item = GetItem{GetItem::Kind::kLocal, hid, f.len, leader};
    drop_interest(fid, now, out);
  }
  // G4: every result sits at its original index before the prefix is computed.
  std::vector<bool> hits(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& item = pg.items[i];
    if (item.kind == GetItem::Kind::kLocal) hits[i] = true;
    if (item.kind == GetItem::Kind::kFlight) {
      const Phase p = flights_.at(item.id).phase;
      hits[i] = p == Phase::kStarted || p == Phase::kFinishing;
    }
  }
  PrefixResult pr = compute_prefix(hits, pg.groups, pg.best_effort);
  const uint32_t tl = pr.transferable_len;
  // G5: everything past transferable_len goes at once: pins, waiters, prepared gets.
  for (size_t i = tl; i < n; ++i) {
    if (pg.items[i].kind != GetItem::Kind::kMiss) counters_.get_suffix_released_total++;
    release_item(pg.items[i], now, out);
  }
  wire::GetStartReplyT r;
  r.raw_prefix_hit_len = pr.raw_prefix_hit_len;
  r.transferable_len = tl;
  r.prefix_hit_groups = pr.prefix_hit_groups;
  r.first_miss_index = pr.first_miss_index ? int64_t(*pr.first_miss_index) : -1;
  r.first_miss_group_index = pr.first_miss_group_index ? int64_t(*pr.first_miss_group_index) : -1;
  bool all_local = true;
  for (uint32_t i = 0; i < tl; ++i) {
    const auto& item = pg.items[i];
    if (item.kind == GetItem::Kind::kLocal) r.local_keys++;
    else if (item.leader) r.leader_keys++;
    else r.joined_keys++;
    r.sources.push_back(item.kind == GetItem::Kind::kLocal ? 0 : item.leader ? 2 : 1);
    all_local = all_local && item.kind == GetItem::Kind::kLocal;
  }
  counters_.get_hit_keys_total += tl;
  counters_.get_local_keys_total += r.local_keys;
  counters_.get_joined_keys_total += r.joined_keys;
  counters_.get_leader_keys_total += r.leader_keys;
  if (tl > 0) {
    Handle h{pg.session, {}, now + cfg_.get_handle_ttl_ms};
    h.transferable_len = tl;
    h.groups = pg.groups;
    if (all_local) {  // InlineLocal: the items travel with this reply
      for (uint32_t i = 0; i < tl; ++i) {
        const auto& item = pg.items[i];
        h.holdings.push_back(item.id);
        r.offsets.push_back(pool_.slot_offset(sessions_.holding(item.id)->slot));
        r.lens.push_back(item.len);
        r.holding_ids.push_back(item.id);
      }
    } else {  // OwnerRpc: the owner keeps the prefix until get_transfer
      r.owner_rpc = true;
      h.owner_rpc = true;
      for (uint32_t i = 0; i < tl; ++i) {
        const auto& item = pg.items[i];
        const bool local = item.kind == GetItem::Kind::kLocal;
        h.holdings.push_back(local ? item.id : 0);
        h.flights.push_back(local ? 0 : item.id);
        h.lens.push_back(local ? item.len : 0);
        if (!local) flights_.at(item.id).wanted = true;
      }
    }
    r.handle_id = next_handle_++;
    sessions_.of(pg.session).handles.insert(r.handle_id);
    handle_ttl_.emplace(h.deadline, r.handle_id);
    handles_.emplace(r.handle_id, std::move(h));
  }
  reply(OwnerOut::Kind::kReply, pg.session, pg.token, make_envelope(std::move(r)), out);
}

void OwnerCore::release_item(const GetItem& item, Millis now, Outbox& out) {
  if (item.kind == GetItem::Kind::kLocal) {
    if (const auto* h = sessions_.holding(item.id)) release_holding(item.id, h->session);
  } else if (item.kind == GetItem::Kind::kFlight) {
    drop_interest(item.id, now, out);
  }
}

void OwnerCore::drop_interest(uint64_t flight_id, Millis now, Outbox& out) {
  auto it = flights_.find(flight_id);
  if (it == flights_.end()) return;
  Flight& f = it->second;
  if (f.interest > 0) f.interest--;
  if (f.interest > 0) return;
  switch (f.phase) {
    case Phase::kStarting:   // the GetStart reply decides: Started with no interest is revoked
    case Phase::kFinishing:  // the transfer or GetDone settles first (a slot being written stays)
      return;
    case Phase::kStarted:
      fail_flight(flight_id, "no request retains it", true, now, out);
      return;
    case Phase::kReady:
    case Phase::kFailed:
      erase_flight_if_done(flight_id);
      return;
  }
}

void OwnerCore::fail_flight(uint64_t flight_id, std::string why, bool revoke, Millis now, Outbox& out) {
  Flight& f = flights_.at(flight_id);
  clear_marker(f.key, flight_id);
  if (revoke) {
    counters_.get_revoked_total++;
    queue_get_job(GetJob{GetJob::Kind::kRevoke, {flight_id}, {f.key}, {}, 0}, now, out);
  }
  // The master learns a target only from GetDone: a slot it was never told of (or told of and
  // refused) is free at once. Never called while a transfer writes the slot.
  if (f.slot) {
    if (pool_.slot(*f.slot).state == SlotState::kPending) pool_.pending_abort(*f.slot);
    else pool_.abort(*f.slot);
    f.slot.reset();
  }
  f.phase = Phase::kFailed;
  f.error = std::move(why);
  counters_.get_flights_failed_total++;
  erase_flight_if_done(flight_id);
}

void OwnerCore::erase_flight_if_done(uint64_t flight_id) {
  auto it = flights_.find(flight_id);
  if (it == flights_.end()) return;
  Flight& f = it->second;
  if (f.interest > 0 || (f.phase != Phase::kReady && f.phase != Phase::kFailed)) return;
  if (f.pinned) pool_.release_holder(*f.slot);
  clear_marker(f.key, flight_id);
  flights_.erase(it);
}

void OwnerCore::clear_marker(const std::string& key, uint64_t flight_id) {
  auto m = flight_of_.find(key);
  if (m != flight_of_.end() && m->second == flight_id) flight_of_.erase(m);
}

void OwnerCore::launch_transfers(Millis now, Outbox& out) {
  std::map<std::tuple<uint32_t, uint64_t, std::string, uint16_t>, TransferBatch> batches;
  std::map<std::tuple<uint32_t, uint64_t, std::string, uint16_t>, std::vector<uint64_t>> members;
  std::vector<std::pair<uint64_t, std::string>> failed;
  std::map<uint64_t, uint64_t> need;  // slot class -> bytes to make room for
  for (auto& [fid, f] : flights_) {
    if (f.phase != Phase::kStarted || !f.wanted || f.interest == 0) continue;
    if (!f.slot) {
      auto c = pool_.try_claim(f.len, 1);
      if (!c.ok()) {
        failed.emplace_back(fid, c.status().message());
        continue;
      }
      if (!c->has_value()) {
        if (now - f.since >= cfg_.hard_timeout_ms)
          failed.emplace_back(fid, "no local slot became free within " + std::to_string(cfg_.hard_timeout_ms) + " ms");
        else
          need[slot_size_for(f.len)] += slot_size_for(f.len);
        continue;
      }
      f.slot = (**c)[0];
    }
    pool_.begin_pending(*f.slot);
    f.phase = Phase::kFinishing;
    auto k = std::make_tuple(f.source_node, f.source_generation, f.host, f.port);
    TransferBatch& b = batches[k];
    b.source_node = f.source_node;
    b.source_generation = f.source_generation;
    b.host = f.host;
    b.port = f.port;
    b.items.push_back(TransferItem{f.src_offset, f.len, pool_.slot_offset(*f.slot)});
    members[k].push_back(fid);
  }
  for (auto& [fid, why] : failed) fail_flight(fid, why, true, now, out);
  for (auto& [ss, bytes] : need) evict_for(ss, bytes, now, out);
  for (auto& [k, b] : batches) {
    b.id = next_transfer_++;
    counters_.transfer_batches_total++;
    counters_.transfer_keys_total += b.items.size();
    for (const auto& it : b.items) counters_.transfer_bytes_total += it.len;
    transfers_[b.id] = std::move(members[k]);
    OwnerOut o{OwnerOut::Kind::kTransfer, 0, 0, {}, std::move(b)};
    out.push_back(std::move(o));
  }
}

void OwnerCore::on_transfer_done(uint64_t id, const Status& result, Millis now, Outbox& out) {
  now_ = now;
  auto t = transfers_.find(id);
  if (t == transfers_.end()) return;
  const std::vector<uint64_t> fids = std::move(t->second);
  transfers_.erase(t);
  if (!result.is_ok()) counters_.transfer_failures_total++;
  GetJob done{GetJob::Kind::kDone, {}, {}, {}, 0};
  for (uint64_t fid : fids) {
    Flight& f = flights_.at(fid);  // a Finishing flight is never erased
    if (!result.is_ok()) {
      fail_flight(fid, "fetch from node " + std::to_string(f.source_node) + " failed: " + result.message(), true, now,
                  out);
      continue;
    }
    if (f.interest == 0) {
      fail_flight(fid, "no request retains it", true, now, out);
      continue;
    }
    done.get_ids.push_back(fid);
    done.keys.push_back(f.key);
    done.offsets.push_back(pool_.slot_offset(*f.slot));
  }
  if (!done.keys.empty()) queue_get_job(std::move(done), now, out);  // G8: one BatchGetDone per batch
  serve_transfers(now, out);
  if (pool_.take_freed()) serve_waiters(out);
}

void OwnerCore::flush_gets(Millis now, Outbox& out) {
  if (start_buffer_.keys.empty()) return;
  counters_.get_master_batches_total++;
  GetJob job{GetJob::Kind::kStart, {}, {}, {}, 0};
  std::swap(job, start_buffer_);
  queue_get_job(std::move(job), now, out);
}

uint64_t OwnerCore::queue_get_job(GetJob job, Millis now, Outbox& out) {
  const uint64_t id = next_get_job_++;
  auto [it, _] = get_jobs_.emplace(id, std::move(job));
  send_get_job(id, it->second, now, out);
  return id;
}

void OwnerCore::send_get_job(uint64_t job_id, GetJob& job, Millis now, Outbox& out) {
  Envelope env;
  auto items = [&](auto& vec, auto make) {
    for (size_t i = 0; i < job.keys.size(); ++i) vec.push_back(make(i));
  };
  switch (job.kind) {
    case GetJob::Kind::kStart: {
      wire::BatchGetStartT m;
      m.node_id = cfg_.node_id;
      m.generation = generation_;
      items(m.items, [&](size_t i) { return std::make_unique<wire::GetItemT>(wire::GetItemT{{}, job.keys[i], job.get_ids[i]}); });
      env = make_envelope(std::move(m));
      break;
    }
    case GetJob::Kind::kDone: {
      wire::BatchGetDoneT m;
      m.node_id = cfg_.node_id;
      m.generation = generation_;
      items(m.items, [&](size_t i) {
        return std::make_unique<wire::GetDoneItemT>(
            wire::GetDoneItemT{{}, job.keys[i], job.get_ids[i], job.offsets[i], flights_.at(job.get_ids[i]).batch});
      });
      env = make_envelope(std::move(m));
      break;
    }
    case GetJob::Kind::kRevoke: {
      wire::BatchGetRevokeT m;
      m.node_id = cfg_.node_id;
      m.generation = generation_;
      items(m.items, [&](size_t i) { return std::make_unique<wire::GetItemT>(wire::GetItemT{{}, job.keys[i], job.get_ids[i]}); });
      env = make_envelope(std::move(m));
      break;
    }
  }
  // T1: every attempt carries the same get ids; any reply for this identity settles the job.
  const uint64_t tok = new_token(JobKind::kGet);
  get_jobs_.attempt(job_id, tok);
  get_jobs_.schedule(job_id, now + cfg_.publish_retry_ms);
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, tok, std::move(env)});
}

void OwnerCore::on_get_job_reply(uint64_t job_id, Envelope& reply_env, Millis now, Outbox& out) {
  auto j = get_jobs_.find(job_id);
  if (j == get_jobs_.end()) return;
  const size_t n = j->second.keys.size();
  // Identity first: a reply that does not answer this job item by item leaves the job to tick().
  if (j->second.kind == GetJob::Kind::kStart) {
    auto* r = reply_env.body.AsBatchGetStartReply();
    if (!r || r->items.size() != n) return;
    for (size_t i = 0; i < n; ++i)
      if (r->items[i]->get_id != j->second.get_ids[i]) return;
  } else if (j->second.kind == GetJob::Kind::kDone) {
    auto* r = reply_env.body.AsBatchGetDoneReply();
    if (!r || r->results.size() != n) return;
  } else {
    auto* r = reply_env.body.AsBatchGetRevokeReply();
    if (!r || r->known.size() != n) return;
  }
  GetJob job = std::move(j->second);
  get_jobs_.erase(j);
  if (job.kind == GetJob::Kind::kStart) {
    auto* r = reply_env.body.AsBatchGetStartReply();
    for (size_t i = 0; i < n; ++i) {
      const auto& s = *r->items[i];
      auto it = flights_.find(job.get_ids[i]);
      if (it == flights_.end()) continue;  // a Starting flight is never erased; defensive
      Flight& f = it->second;
      if (s.status != wire::GetStartStatus::Started) {
        counters_.get_remote_miss_total++;
        fail_flight(job.get_ids[i], std::string("master: ") + wire::EnumNameGetStartStatus(s.status), false, now, out);
        continue;
      }
      f.phase = Phase::kStarted;
      f.source_node = s.source_node;
      f.source_generation = s.source_generation;
      f.src_offset = s.offset;
      f.len = s.len;
      f.ver = Version{s.origin_node, s.origin_generation, s.origin_put_id};
      f.host = s.data_host;
      f.port = s.data_port;
      f.since = now;
      if (f.len == 0 || slot_size_for(f.len) > cfg_.grant_bytes) {
        fail_flight(job.get_ids[i], "value of " + std::to_string(f.len) + " bytes does not fit a local slot", true,
                    now, out);
        continue;
      }
      if (f.interest == 0) fail_flight(job.get_ids[i], "no request retains it", true, now, out);
    }
    serve_pending_gets(now, out, false);
    launch_transfers(now, out);
  } else if (job.kind == GetJob::Kind::kDone) {
    auto* r = reply_env.body.AsBatchGetDoneReply();
    HotBatch hot;
    for (size_t i = 0; i < n; ++i) {
      Flight& f = flights_.at(job.get_ids[i]);
      if (r->results[i] != wire::GetDoneStatus::Live) {
        counters_.get_done_stale_total++;
        fail_flight(job.get_ids[i], "the value changed or went while it was fetched", false, now, out);
        continue;
      }
      const SlotRef slot = *f.slot;
      pool_.pending_live(slot);
      live_routes_++;
      if (f.interest > 0) {  // every waiter shares this one slot (G7); the flight pins it for them
        pool_.add_holder(slot);
        f.pinned = true;
      }
      if (local_.contains(f.key)) {
        // A local put of the key won meanwhile: this copy's route goes, route first (S2).
        queue_remove({f.key}, {f.ver}, {slot}, {f.batch}, now, out);
      } else {
        local_.insert(f.key, Entry{f.batch, slot, f.len, true, f.group, f.ver});
        index_live(f.key, ResidentRef{f.batch, f.group}, pool_.slot_size(slot), hot);
      }
      f.phase = Phase::kReady;
      counters_.get_flights_ready_total++;
      clear_marker(f.key, job.get_ids[i]);
      erase_flight_if_done(job.get_ids[i]);
    }
    admit_hot(hot, now, out);
    serve_transfers(now, out);
  }
  // kRevoke: the master dropped the get (or had already): the slot was freed when it was revoked.
}

void OwnerCore::get_transfer(uint64_t token, uint64_t session, const wire::GetTransferReqT& req, Millis now,
                             Outbox& out) {
  auto it = handles_.find(req.handle_id);
  if (it == handles_.end() || it->second.session != session || !it->second.owner_rpc ||
      it->second.waiting_token != 0)
    return reply_error(session, token,
                       invalid_argument("get_transfer: unknown or consumed handle " + std::to_string(req.handle_id)),
                       out);
  Handle& h = it->second;
  const uint32_t consume = req.consume_prefix_len;
  // A bad length leaves the handle usable.
  if (consume == 0 || consume > h.transferable_len)
    return reply_error(session, token,
                       invalid_argument("consume_prefix_len: " + std::to_string(consume) + " not in [1, " +
                                        std::to_string(h.transferable_len) + "]"),
                       out);
  Status st = validate_consume_prefix(consume, h.transferable_len, h.groups);
  if (!st.is_ok()) return reply_error(session, token, st, out);
  // G5: the tail goes now.
  for (uint32_t i = consume; i < h.transferable_len; ++i) {
    counters_.get_tail_released_total++;
    if (h.holdings[i]) release_holding(h.holdings[i], session);
    if (h.flights[i]) drop_interest(h.flights[i], now, out);
  }
  // drop_interest may have touched handles_: look the handle up again.
  Handle& hh = handles_.at(req.handle_id);
  hh.holdings.resize(consume);
  hh.flights.resize(consume);
  hh.lens.resize(consume);
  hh.transferable_len = consume;
  hh.waiting_token = token;
  hh.transfer_deadline = now + (req.max_wait_ms ? std::min<Millis>(req.max_wait_ms, cfg_.hard_timeout_ms)
                                                : Millis(cfg_.hard_timeout_ms));
  waiting_handles_.insert(req.handle_id);
  try_finish_transfer(req.handle_id, now, out);
}

void OwnerCore::serve_transfers(Millis now, Outbox& out) {
  const std::vector<uint64_t> ids(waiting_handles_.begin(), waiting_handles_.end());
  for (uint64_t id : ids) try_finish_transfer(id, now, out);
}

bool OwnerCore::try_finish_transfer(uint64_t handle_id, Millis now, Outbox& out) {
  auto it = handles_.find(handle_id);
  if (it == handles_.end()) {
    waiting_handles_.erase(handle_id);
    return true;
  }
  Handle& h = it->second;
  bool pending = false;
  std::string failed;
  for (uint64_t fid : h.flights) {
    if (!fid) continue;
    const Flight& f = flights_.at(fid);  // the handle's interest keeps it
    if (f.phase == Phase::kFailed && failed.empty()) failed = "key '" + f.key + "': " + f.error;
    if (f.phase != Phase::kFailed && f.phase != Phase::kReady) pending = true;
  }
  if (failed.empty() && pending && now < h.transfer_deadline) return false;
  const uint64_t token = h.waiting_token, session = h.session;
  if (!failed.empty() || pending) {
    counters_.get_transfer_failed_total++;
    release_handle(handle_id, now, out);
    Status s = failed.empty() ? Status(Code::kTimeout, "get_transfer: remote keys were not fetched within " +
                                                           std::to_string(cfg_.hard_timeout_ms) + " ms")
                              : Status(Code::kKeyNotFound, "get_transfer: " + failed);
    reply_error(session, token, s, out);
    return true;
  }
  wire::GetTransferReplyT r;
  std::vector<uint64_t> drop;
  for (size_t i = 0; i < h.holdings.size(); ++i) {
    uint64_t hid = h.holdings[i];
    uint64_t len = h.lens[i];
    if (!hid) {  // a Ready flight: one more holder on the shared slot, for this reader
      const Flight& f = flights_.at(h.flights[i]);
      hid = sessions_.hold(pool_, *f.slot, session);
      len = f.len;
      drop.push_back(h.flights[i]);
    }
    r.offsets.push_back(pool_.slot_offset(sessions_.holding(hid)->slot));
    r.lens.push_back(len);
    r.holding_ids.push_back(hid);
  }
  waiting_handles_.erase(handle_id);
  drop_handle(handle_id);  // the holdings are the reader's now
  for (uint64_t fid : drop) drop_interest(fid, now, out);
  reply(OwnerOut::Kind::kReply, session, token, make_envelope(std::move(r)), out);
  return true;
}

void OwnerCore::release_handle(uint64_t handle_id, Millis now, Outbox& out) {
  auto it = handles_.find(handle_id);
  if (it == handles_.end()) return;
  Handle h = std::move(it->second);
  drop_handle(handle_id);
  waiting_handles_.erase(handle_id);
  for (uint64_t hid : h.holdings)
    if (hid) release_holding(hid, h.session);
  for (uint64_t fid : h.flights)
    if (fid) drop_interest(fid, now, out);
}

// ---- replica tasks ----------------------------------------------------------------------------
// The master queues a task for every published key a put asked a replica of; owners of a target
// role (remote_cache by default) pull them and fetch the keys like any remote get: a flight per
// key, one BatchGetStart, one payload batch per source, one BatchGetDone that publishes the copy.
// A failed replica only costs later hits (S3: the source's eviction never waits for it).

void OwnerCore::poll_replica_tasks(Millis now, Outbox& out) {
  constexpr uint32_t kBatch = 256;        // tasks per poll, and replica flights at most in flight
  constexpr Millis kIdlePollMs = 100;     // between polls that found nothing
  if (!replica_target_ || alone()) return;  // not a target role, or alone
  std::vector<std::string> due;
  for (auto it = replica_retry_.begin(); it != replica_retry_.end();) {
    if (it->first > now) {
      ++it;
      continue;
    }
    due.push_back(std::move(it->second));
    it = replica_retry_.erase(it);
  }
  if (!due.empty()) start_replica_flights(due, now, out);
  if (replica_poll_id_ != 0) {  // unanswered: the same poll again, the master answers it the same way
    if (now - replica_poll_sent_ >= Millis(cfg_.publish_retry_ms)) send_replica_poll(now, out);
    return;
  }
  if (now < next_replica_poll_ || replica_flights_.size() >= kBatch) return;
  replica_poll_id_ = next_master_token_++;  // any unique number
  replica_poll_max_ = uint32_t(kBatch - replica_flights_.size());
  next_replica_poll_ = now + kIdlePollMs;
  send_replica_poll(now, out);
}

void OwnerCore::send_replica_poll(Millis now, Outbox& out) {
  wire::ReplicaPollT p;
  p.node_id = cfg_.node_id;
  p.generation = generation_;
  p.max = replica_poll_max_;
  p.poll_id = replica_poll_id_;
  const uint64_t tok = new_token(JobKind::kReplicaPoll);
  replica_poll_tokens_.push_back(tok);
  replica_poll_sent_ = now;
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, tok, make_envelope(std::move(p))});
}

void OwnerCore::on_replica_tasks(const wire::ReplicaPollReplyT& rep, Millis now, Outbox& out) {
  if (rep.keys.empty()) return;
  next_replica_poll_ = now;  // there may be more: ask again at the next tick
  counters_.replica_tasks_received_total += rep.keys.size();
  start_replica_flights(rep.keys, now, out);
}

void OwnerCore::start_replica_flights(const std::vector<std::string>& keys, Millis now, Outbox& out) {
  GetJob start{GetJob::Kind::kStart, {}, {}, {}, 0};
  const uint64_t batch = next_put_id_++;
  for (const auto& key : keys) {
    if (local_.contains(key) || flight_of_.count(key) || inflight_.count(key)) {
      counters_.replica_tasks_skipped_total++;  // here already, or on its way
      continue;
    }
    const uint64_t fid = next_flight_++;
    Flight fl;
    fl.key = key;
    fl.interest = 1;  // held by the task until the flight is terminal
    fl.wanted = true;
    fl.batch = batch;
    fl.group = uint32_t(start.keys.size());  // each replica its own cohort
    flights_.emplace(fid, std::move(fl));
    flight_of_[key] = fid;
    replica_flights_.emplace(fid, key);
    start.get_ids.push_back(fid);
    start.keys.push_back(key);
  }
  if (start.keys.empty()) return;
  counters_.get_flights_started_total += start.keys.size();
  counters_.get_master_batches_total++;
  queue_get_job(std::move(start), now, out);
}

void OwnerCore::settle_replica_flights(Millis now, Outbox& out) {
  std::vector<uint64_t> done;
  for (const auto& [fid, key] : replica_flights_) {
    auto it = flights_.find(fid);
    if (it == flights_.end() || it->second.phase == Phase::kReady || it->second.phase == Phase::kFailed)
      done.push_back(fid);
  }
  for (uint64_t fid : done) {
    auto rf = replica_flights_.find(fid);
    const std::string key = std::move(rf->second);
    replica_flights_.erase(rf);
    auto it = flights_.find(fid);
    if (it != flights_.end() && it->second.phase == Phase::kReady) {
      counters_.replica_done_total++;
      replica_attempts_.erase(key);
    } else if (const uint32_t n = ++replica_attempts_[key]; n < kReplicaAttempts) {
      counters_.replica_retries_total++;  // 0.5 s, then 1 s later
      replica_retry_.emplace_back(now + 500 * Millis(n), key);
    } else {
      counters_.replica_failed_total++;
      replica_attempts_.erase(key);
    }
    drop_interest(fid, now, out);
  }
}

}  // namespace fluxon
