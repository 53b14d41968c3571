// GetFlights' requests: get_start's per-key split (G1-G4), the prefix decision with its immediate
// tail release (G5), handles, get_transfer and the acknowledgements that end them.
#include <algorithm>

#include "fluxon/owner/get_flights.hpp"
#include "fluxon/runtime/batch.hpp"

namespace fluxon {

bool GetFlights::get_start(uint64_t token, uint64_t session, const GetStartArgs& req, Millis now, Outbox& out) {
  const size_t n = req.keys.size();
  std::optional<std::vector<uint32_t>> groups;
  if (!req.group_lens.empty()) groups.emplace(req.group_lens.begin(), req.group_lens.end());
  Status st = validate_keys(req.keys);
  if (st.is_ok()) st = validate_group_lens(groups, n);
  if (st.is_ok() && handles_.size() >= s_.cfg.limits.handles) {  // the bound: nothing is pinned
    s_.counters.handles_full_total++;
    st = Status(Code::kTimeout, std::to_string(handles_.size()) +
                                    " get handles are not consumed yet (the bound): get_start refused");
  }
  if (!st.is_ok()) {
    s_.reply_error(session, token, st, out);
    return false;
  }
  s_.counters.get_start_total++;
  s_.counters.get_keys_total += n;
  s_.counters.get_required_keys_total += n;
  const Millis wait =
      req.max_wait_ms ? std::min<Millis>(req.max_wait_ms, s_.cfg.get_start_wait_ms) : s_.cfg.get_start_wait_ms;
  PendingGet pg{token, session, groups, req.prefix_best_effort, std::vector<Item>(n), now + wait};
  // Every key's entry at once: the batch pays the index's memory misses once, not once per key.
  lookup_.resize(n);
  lookup_hashes_.resize(n);
  s_.local.find_many(req.keys, n, lookup_.data(), lookup_hashes_.data());
  touched_.clear();
  touched_hashes_.clear();
  uint64_t batch = 0;
  size_t leaders = 0;
  uint32_t group = 0, left = groups ? (*groups)[0] : 1;
  for (size_t i = 0; i < n; ++i) {
    if (left == 0) {
      group++;
      left = groups ? (*groups)[group] : 1;
    }
    left--;
    const std::string_view key = req.keys[i];
    // LocalJoin: pinned at once (G2). V1: a precommit entry is a local hit, exactly like a live one.
    if (const LocalIndex::Node* it = lookup_[i]) {
      const LocalIndex::Entry& e = it->second;
      if (e.live) {  // eviction and write-back order follow reads too (touched below, all at once)
        touched_.push_back(&it->first);
        touched_hashes_.push_back(lookup_hashes_[i]);
      }
      const uint64_t hid = s_.sessions.hold(s_.pool, e.slot, session);
      pg.items[i] = Item{Item::Kind::kLocal, hid, e.len, false};
      continue;
    }
    // InflightJoin: a waiter on the key's flight; no second slot, GetStart or transfer (G6).
    if (auto f = flight_of_.find(key); f != flight_of_.end()) {
      flights_.at(f->second).interest++;
      s_.counters.get_joins_total++;
      pg.items[i] = Item{Item::Kind::kFlight, f->second, 0, false};
      continue;
    }
    if (s_.alone()) {  // the only owner of the cluster: no other copy exists
      s_.counters.get_alone_misses_total++;
      continue;
    }
    // Leader: its marker is visible to every later batch before the master hears of it (G2, G3).
    if (flights_.size() >= s_.cfg.limits.flights) {  // the bound: no new fetch, the key is a miss
      s_.counters.flights_full_total++;
      continue;  // pg.items[i] stays a miss
    }
    if (batch == 0) batch = s_.new_local_id();
    const uint64_t fid = new_flight(std::string(key), batch, group, false);
    // A prefix read (prefix_best_effort) names its keys in prefix order: the fetched copy continues
    // the key before it (prefix-aware eviction, as a put's radix_parent_keys).
    if (req.prefix_best_effort && i > 0) flights_.at(fid).parent = std::string(req.keys[i - 1]);
    // G8: every leader of the batch in one BatchGetStart; G9: with the leaders of the other
    // get_starts that arrive before the driver calls flush() (the owner actor: once its mailbox
    // holds nothing older; the simulator: at the next tick), so concurrent batches (TP ranks) share it.
    start_buffer_.get_ids.push_back(fid);
    start_buffer_.keys.emplace_back(key);
    leaders++;
    pg.items[i] = Item{Item::Kind::kFlight, fid, 0, true};
  }
  s_.local.touch_many(touched_.data(), touched_hashes_.data(), touched_.size());
  if (leaders > 0) {
    s_.counters.get_flights_started_total += leaders;
    s_.counters.get_leader_requests_total++;
  }
  if (!waits_for_master(pg) || pending_gets_.size() >= s_.cfg.limits.pending_gets) {
    // All local (the hot path), or joins past Starting: answered now. At the bound, too: what is
    // not known yet is a miss.
    if (waits_for_master(pg)) s_.counters.pending_gets_full_total++;
    const bool remote =
        std::any_of(pg.items.begin(), pg.items.end(), [](const Item& i) { return i.kind == Item::Kind::kFlight; });
    decide(pg, now, out);
    return remote;
  }
  const uint64_t id = next_pending_get_++;
  pending_deadlines_.emplace(pg.deadline, id);
  pending_gets_.emplace(id, std::move(pg));
  return false;
}

bool GetFlights::waits_for_master(const PendingGet& pg) const {
  for (const auto& item : pg.items)
    if (item.kind == Item::Kind::kFlight && flights_.at(item.id).phase == Phase::kStarting) return true;
  return false;
}

bool GetFlights::serve_pending(Millis now, Outbox& out, bool expire) {
  std::vector<uint64_t> ready;
  if (expire) {
    // The clock: only the gets past their deadline. (A get whose flights all left Starting was
    // decided when the master's answer moved them: no other step does.)
    for (auto d = pending_deadlines_.begin(); d != pending_deadlines_.end() && d->first <= now; ++d)
      ready.push_back(d->second);
    std::sort(ready.begin(), ready.end());
    for (uint64_t id : ready)
      if (waits_for_master(pending_gets_.at(id))) s_.counters.get_wait_timeouts_total++;
  } else {
    for (auto& [id, pg] : pending_gets_)
      if (!waits_for_master(pg)) ready.push_back(id);
  }
  for (uint64_t id : ready) {
    auto it = pending_gets_.find(id);
    PendingGet pg = std::move(it->second);
    pending_deadlines_.erase({pg.deadline, id});
    pending_gets_.erase(it);
    decide(pg, now, out);
  }
  return !ready.empty();
}

void GetFlights::decide(PendingGet& pg, Millis now, Outbox& out) {
  const size_t n = pg.items.size();
  // A flight that is Ready by now is a local copy: pin it and drop the interest.
  for (auto& item : pg.items) {
    if (item.kind != Item::Kind::kFlight) continue;
    Flight& f = flights_.at(item.id);
    if (f.phase != Phase::kReady) continue;
    const uint64_t hid = s_.sessions.hold(s_.pool, *f.slot, pg.session);
    const uint64_t fid = item.id;
    const bool leader = item.leader;
    item = Item{Item::Kind::kLocal, hid, f.len, leader};
    drop_interest(fid, now, out);
  }
  // G4: every result sits at its original index before the prefix is computed.
  std::vector<bool> hits(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& item = pg.items[i];
    if (item.kind == Item::Kind::kLocal) hits[i] = true;
    if (item.kind == Item::Kind::kFlight) {
      const Phase p = flights_.at(item.id).phase;
      hits[i] = p == Phase::kStarted || p == Phase::kFinishing;
    }
  }
  PrefixResult pr = compute_prefix(hits, pg.groups, pg.best_effort);
  const uint32_t tl = pr.transferable_len;
  // G5: everything past transferable_len goes at once: pins, waiters, prepared gets.
  for (size_t i = tl; i < n; ++i) {
    if (pg.items[i].kind != Item::Kind::kMiss) s_.counters.get_suffix_released_total++;
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
    if (item.kind == Item::Kind::kLocal) r.local_keys++;
    else if (item.leader) r.leader_keys++;
    else r.joined_keys++;
    r.sources.push_back(item.kind == Item::Kind::kLocal ? 0 : item.leader ? 2 : 1);
    all_local = all_local && item.kind == Item::Kind::kLocal;
  }
  s_.counters.get_hit_keys_total += tl;
  s_.counters.get_local_keys_total += r.local_keys;
  s_.counters.get_joined_keys_total += r.joined_keys;
  s_.counters.get_leader_keys_total += r.leader_keys;
  if (tl > 0) {
    Handle h{pg.session, {}, now + s_.cfg.get_handle_ttl_ms};
    h.transferable_len = tl;
    h.groups = pg.groups;
    if (all_local) {  // InlineLocal: the items travel with this reply
      for (uint32_t i = 0; i < tl; ++i) {
        const auto& item = pg.items[i];
        h.holdings.push_back(item.id);
        r.offsets.push_back(s_.pool.slot_offset(s_.sessions.holding(item.id)->slot));
        r.lens.push_back(item.len);
        r.holding_ids.push_back(item.id);
      }
    } else {  // OwnerRpc: the owner keeps the prefix until get_transfer
      r.owner_rpc = true;
      h.owner_rpc = true;
      for (uint32_t i = 0; i < tl; ++i) {
        const auto& item = pg.items[i];
        const bool local = item.kind == Item::Kind::kLocal;
        h.holdings.push_back(local ? item.id : 0);
        h.flights.push_back(local ? 0 : item.id);
        h.lens.push_back(local ? item.len : 0);
        if (!local) want(item.id);
      }
    }
    r.handle_id = next_handle_++;
    s_.sessions.of(pg.session).handles.insert(r.handle_id);
    handle_ttl_.emplace(h.deadline, r.handle_id);
    handles_.emplace(r.handle_id, std::move(h));
  }
  s_.reply(pg.session, pg.token, make_envelope(std::move(r)), out);
}

void GetFlights::release_item(const Item& item, Millis now, Outbox& out) {
  if (item.kind == Item::Kind::kLocal) {
    if (const auto* h = s_.sessions.holding(item.id)) s_.sessions.release(s_.pool, item.id, h->session);
  } else if (item.kind == Item::Kind::kFlight) {
    drop_interest(item.id, now, out);
  }
}

void GetFlights::get_transfer(uint64_t token, uint64_t session, const wire::GetTransferReqT& req, Millis now,
                              Outbox& out) {
  auto it = handles_.find(req.handle_id);
  if (it == handles_.end() || it->second.session != session || !it->second.owner_rpc ||
      it->second.waiting_token != 0)
    return s_.reply_error(
        session, token, invalid_argument("get_transfer: unknown or consumed handle " + std::to_string(req.handle_id)),
        out);
  Handle& h = it->second;
  const uint32_t consume = req.consume_prefix_len;
  // A bad length leaves the handle usable.
  if (consume == 0 || consume > h.transferable_len)
    return s_.reply_error(session, token,
                          invalid_argument("consume_prefix_len: " + std::to_string(consume) + " not in [1, " +
                                           std::to_string(h.transferable_len) + "]"),
                          out);
  Status st = validate_consume_prefix(consume, h.transferable_len, h.groups);
  if (!st.is_ok()) return s_.reply_error(session, token, st, out);
  // G5: the tail goes now.
  for (uint32_t i = consume; i < h.transferable_len; ++i) {
    s_.counters.get_tail_released_total++;
    if (h.holdings[i]) s_.sessions.release(s_.pool, h.holdings[i], session);
    if (h.flights[i]) drop_interest(h.flights[i], now, out);
  }
  // drop_interest may have touched handles_: look the handle up again.
  Handle& hh = handles_.at(req.handle_id);
  hh.holdings.resize(consume);
  hh.flights.resize(consume);
  hh.lens.resize(consume);
  hh.transferable_len = consume;
  hh.waiting_token = token;
  hh.transfer_deadline = now + (req.max_wait_ms ? std::min<Millis>(req.max_wait_ms, s_.cfg.hard_timeout_ms)
                                                : Millis(s_.cfg.hard_timeout_ms));
  waiting_handles_.insert(req.handle_id);
  try_finish_transfer(req.handle_id, now, out);
}

void GetFlights::serve_transfers(Millis now, Outbox& out) {
  const std::vector<uint64_t> ids(waiting_handles_.begin(), waiting_handles_.end());
  for (uint64_t id : ids) try_finish_transfer(id, now, out);
}

bool GetFlights::try_finish_transfer(uint64_t handle_id, Millis now, Outbox& out) {
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
    s_.counters.get_transfer_failed_total++;
    release_handle(handle_id, now, out);
    Status s = failed.empty() ? Status(Code::kTimeout, "get_transfer: remote keys were not fetched within " +
                                                           std::to_string(s_.cfg.hard_timeout_ms) + " ms")
                              : Status(Code::kKeyNotFound, "get_transfer: " + failed);
    s_.reply_error(session, token, s, out);
    return true;
  }
  wire::GetTransferReplyT r;
  std::vector<uint64_t> drop;
  for (size_t i = 0; i < h.holdings.size(); ++i) {
    uint64_t hid = h.holdings[i];
    uint64_t len = h.lens[i];
    if (!hid) {  // a Ready flight: one more holder on the shared slot, for this reader
      const Flight& f = flights_.at(h.flights[i]);
      hid = s_.sessions.hold(s_.pool, *f.slot, session);
      len = f.len;
      drop.push_back(h.flights[i]);
    }
    r.offsets.push_back(s_.pool.slot_offset(s_.sessions.holding(hid)->slot));
    r.lens.push_back(len);
    r.holding_ids.push_back(hid);
  }
  waiting_handles_.erase(handle_id);
  drop_handle(handle_id);  // the holdings are the reader's now
  for (uint64_t fid : drop) drop_interest(fid, now, out);
  s_.reply(session, token, make_envelope(std::move(r)), out);
  return true;
}

void GetFlights::release_handle(uint64_t handle_id, Millis now, Outbox& out) {
  auto it = handles_.find(handle_id);
  if (it == handles_.end()) return;
  Handle h = std::move(it->second);
  drop_handle(handle_id);
  waiting_handles_.erase(handle_id);
  for (uint64_t hid : h.holdings)
    if (hid) s_.sessions.release(s_.pool, hid, h.session);
  for (uint64_t fid : h.flights)
    if (fid) drop_interest(fid, now, out);
}

void GetFlights::drop_handle(uint64_t handle_id) {
  auto it = handles_.find(handle_id);
  if (it == handles_.end()) return;
  s_.sessions.forget_handle(it->second.session, handle_id);
  handle_ttl_.erase({it->second.deadline, handle_id});
  handles_.erase(it);
}

void GetFlights::on_ack(const wire::AckBatchT& ack, uint64_t session, Millis now, Outbox& out) {
  for (auto& hd : ack.handles) {
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
    s_.counters.get_tail_released_total += hd->release_holding_ids.size();
    for (uint64_t hid : hd->release_holding_ids) s_.sessions.release(s_.pool, hid, session);
  }
  for (uint64_t hid : ack.release) s_.sessions.release(s_.pool, hid, session);
}

void GetFlights::expire_handles(Millis now, Outbox& out) {
  // Handle TTL: the same release path as cancel (a handle with a parked get_transfer is bounded
  // by its transfer deadline instead).
  std::vector<uint64_t> expired;
  for (auto t = handle_ttl_.begin(); t != handle_ttl_.end() && t->first <= now; ++t)
    if (handles_.at(t->second).waiting_token == 0) expired.push_back(t->second);
  for (uint64_t hid : expired) {
    s_.counters.handle_ttl_expired_total++;
    release_handle(hid, now, out);
  }
}

void GetFlights::close_session(const Sessions::Session& s, uint64_t session, Millis now, Outbox& out) {
  for (auto p = pending_gets_.begin(); p != pending_gets_.end();) {
    if (p->second.session == session) {
      for (const auto& item : p->second.items) release_item(item, now, out);
      pending_deadlines_.erase({p->second.deadline, p->first});
      p = pending_gets_.erase(p);
    } else {
      ++p;
    }
  }
  for (uint64_t h : s.handles) release_handle(h, now, out);
}

}  // namespace fluxon
