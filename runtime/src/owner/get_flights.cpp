// GetFlights' flights: their lifecycle (Starting -> Started -> Finishing -> Ready | Failed), the
// batched master jobs that move them (G8, G9, retried as is: T1), and the data-plane rounds.
#include "fluxon/owner/get_flights.hpp"

#include "fluxon/runtime/batch.hpp"

namespace fluxon {

uint64_t GetFlights::new_flight(const std::string& key, uint64_t batch, uint32_t group, bool wanted) {
  const uint64_t fid = next_flight_++;
  Flight fl;
  fl.key = key;
  fl.interest = 1;
  fl.wanted = wanted;  // Starting: fetchable once Started
  fl.batch = batch;
  fl.group = group;
  flights_.emplace(fid, std::move(fl));
  flight_of_[key] = fid;
  return fid;
}

GetFlights::Phase GetFlights::phase(uint64_t flight_id) const {
  auto it = flights_.find(flight_id);
  return it == flights_.end() ? Phase::kFailed : it->second.phase;
}

void GetFlights::drop_interest(uint64_t flight_id, Millis now, Outbox& out) {
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

void GetFlights::fail_flight(uint64_t flight_id, std::string why, bool revoke, Millis now, Outbox& out) {
  Flight& f = flights_.at(flight_id);
  clear_marker(f.key, flight_id);
  if (revoke) {
    s_.counters.get_revoked_total++;
    queue_job(Job{Job::Kind::kRevoke, {flight_id}, {f.key}, {}, 0}, now, out);
  }
  // The master learns a target only from GetDone: a slot it was never told of (or told of and
  // refused) is free at once. Never called while a transfer writes the slot.
  if (f.slot) {
    if (s_.pool.slot(*f.slot).state == SlotState::kPending) s_.pool.pending_abort(*f.slot);
    else s_.pool.abort(*f.slot);
    f.slot.reset();
  }
  f.phase = Phase::kFailed;
  fetchable_.erase(flight_id);
  f.error = std::move(why);
  s_.counters.get_flights_failed_total++;
  erase_flight_if_done(flight_id);
}

void GetFlights::erase_flight_if_done(uint64_t flight_id) {
  auto it = flights_.find(flight_id);
  if (it == flights_.end()) return;
  Flight& f = it->second;
  if (f.interest > 0 || (f.phase != Phase::kReady && f.phase != Phase::kFailed)) return;
  if (f.pinned) s_.pool.release_holder(*f.slot);
  clear_marker(f.key, flight_id);
  flights_.erase(it);
}

void GetFlights::clear_marker(const std::string& key, uint64_t flight_id) {
  auto m = flight_of_.find(key);
  if (m != flight_of_.end() && m->second == flight_id) flight_of_.erase(m);
}

GetFlights::TransferRound GetFlights::prepare_transfers(Millis now, Outbox& out) {
  using PeerKey = std::tuple<uint32_t, uint64_t, std::string, uint16_t, bool>;
  std::map<PeerKey, TransferBatch> batches;
  std::map<PeerKey, std::vector<uint64_t>> members;
  std::vector<std::pair<uint64_t, std::string>> failed;
  std::map<uint64_t, uint64_t> need;  // slot class -> bytes to make room for
  // Only the flights that may fetch now (Started and wanted), in id order: no scan of the others.
  for (const uint64_t fid : std::vector<uint64_t>(fetchable_.begin(), fetchable_.end())) {
    Flight& f = flights_.at(fid);
    if (f.interest == 0) continue;
    if (!f.slot) {
      auto c = s_.pool.try_claim(f.len, 1);
      if (!c.ok()) {
        failed.emplace_back(fid, c.status().message());
        continue;
      }
      if (!c->has_value()) {
        if (now - f.since >= s_.cfg.hard_timeout_ms)
          failed.emplace_back(fid, "no local slot became free within " + std::to_string(s_.cfg.hard_timeout_ms) +
                                       " ms");
        else
          need[slot_size_for(f.len)] += slot_size_for(f.len);
        continue;
      }
      f.slot = (**c)[0];
    }
    s_.pool.begin_pending(*f.slot);
    f.phase = Phase::kFinishing;
    fetchable_.erase(fid);
    // Reads for a reader and copies for a replica task travel apart: the source counts the first.
    const PeerKey k{f.source_node, f.source_generation, f.host, f.port, !f.held};
    TransferBatch& b = batches[k];
    b.read = !f.held;
    b.source_node = f.source_node;
    b.source_generation = f.source_generation;
    b.host = f.host;
    b.port = f.port;
    b.items.push_back(TransferItem{f.src_offset, f.len, s_.pool.slot_offset(*f.slot), f.grant});
    members[k].push_back(fid);
  }
  for (auto& [fid, why] : failed) fail_flight(fid, why, true, now, out);
  TransferRound round;
  for (auto& [ss, bytes] : need) round.room.push_back(RoomNeeded{ss, bytes});
  for (auto& [k, b] : batches) {
    b.id = next_transfer_++;
    transfers_[b.id] = std::move(members[k]);
    round.batches.push_back(std::move(b));
  }
  return round;
}

void GetFlights::send_transfers(TransferRound& round, Outbox& out) {
  for (auto& b : round.batches) {
    s_.counters.transfer_batches_total++;
    s_.counters.transfer_keys_total += b.items.size();
    for (const auto& it : b.items) s_.counters.transfer_bytes_total += it.len;
    out.push_back(OwnerOut{OwnerOut::Kind::kTransfer, 0, 0, {}, std::move(b)});
  }
  round.batches.clear();
}

void GetFlights::on_transfer_done(uint64_t id, const Status& result, Millis now, Outbox& out) {
  auto t = transfers_.find(id);
  if (t == transfers_.end()) return;
  const std::vector<uint64_t> fids = std::move(t->second);
  transfers_.erase(t);
  if (!result.is_ok()) s_.counters.transfer_failures_total++;
  Job done{Job::Kind::kDone, {}, {}, {}, 0};
  for (uint64_t fid : fids) {
    Flight& f = flights_.at(fid);  // a Finishing flight is never erased
    if (!result.is_ok()) {
      fail_flight(fid, "fetch from node " + std::to_string(f.source_node) + " failed: " + result.message(), true,
                  now, out);
      continue;
    }
    if (f.interest == 0) {
      fail_flight(fid, "no request retains it", true, now, out);
      continue;
    }
    done.get_ids.push_back(fid);
    done.keys.push_back(f.key);
    done.offsets.push_back(s_.pool.slot_offset(*f.slot));
    done.slot_sizes.push_back(s_.pool.slot_size(*f.slot));
  }
  if (!done.keys.empty()) queue_job(std::move(done), now, out);  // G8: one BatchGetDone per batch
  serve_transfers(now, out);
}

void GetFlights::flush(Millis now, Outbox& out) {
  if (start_buffer_.keys.empty()) return;
  s_.counters.get_master_batches_total++;
  Job job{Job::Kind::kStart, {}, {}, {}, 0};
  std::swap(job, start_buffer_);
  queue_job(std::move(job), now, out);
}

std::vector<uint64_t> GetFlights::start_held(const std::vector<std::string>& keys,
                                             const std::vector<std::string>& parents,
                                             const std::vector<uint32_t>& depths, Millis now, Outbox& out) {
  Job start{Job::Kind::kStart, {}, {}, {}, 0};
  std::vector<uint64_t> ids;
  if (keys.empty()) return ids;
  const uint64_t batch = s_.new_local_id();
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    const uint64_t fid = new_flight(key, batch, uint32_t(start.keys.size()), /*wanted=*/true);
    if (i < parents.size()) flights_.at(fid).parent = parents[i];
    if (i < depths.size()) flights_.at(fid).depth = depths[i];
    flights_.at(fid).held = true;
    ids.push_back(fid);
    start.get_ids.push_back(fid);
    start.keys.push_back(key);
  }
  s_.counters.get_flights_started_total += start.keys.size();
  s_.counters.get_master_batches_total++;
  queue_job(std::move(start), now, out);
  return ids;
}

void GetFlights::queue_job(Job job, Millis now, Outbox& out) {
  const uint64_t id = next_job_++;
  auto [it, _] = jobs_.emplace(id, std::move(job));
  send_job(id, it->second, now, out);
}

void GetFlights::send_job(uint64_t job_id, Job& job, Millis now, Outbox& out) {
  // One message of the job's kind for its items, from this owner's identity.
  auto message = [&](auto m, auto make_item) {
    m.node_id = s_.cfg.node_id;
    m.generation = s_.generation;
    for (size_t i = 0; i < job.keys.size(); ++i) m.items.push_back(make_item(i));
    return make_envelope(std::move(m));
  };
  auto get_item = [&](size_t i) { return std::make_unique<wire::GetItemT>(wire::GetItemT{{}, job.keys[i], job.get_ids[i]}); };
  Envelope env;
  switch (job.kind) {
    case Job::Kind::kStart: env = message(wire::BatchGetStartT{}, get_item); break;
    case Job::Kind::kRevoke: env = message(wire::BatchGetRevokeT{}, get_item); break;
    case Job::Kind::kDone:
      env = message(wire::BatchGetDoneT{}, [&](size_t i) {
        return std::make_unique<wire::GetDoneItemT>(
            wire::GetDoneItemT{{}, job.keys[i], job.get_ids[i], job.offsets[i], flights_.at(job.get_ids[i]).batch,
                               flights_.at(job.get_ids[i]).group, job.slot_sizes[i]});
      });
      break;
  }
  // T1: every attempt carries the same get ids; any reply for this identity settles the job.
  const uint64_t tok = s_.new_token(JobKind::kGet);
  jobs_.attempt(job_id, tok);
  jobs_.schedule(job_id, now + s_.cfg.publish_retry_ms);
  s_.to_master(tok, std::move(env), out);
}

void GetFlights::retry_due(Millis now, Outbox& out) {
  for (uint64_t id : jobs_.due(now)) {
    s_.counters.get_master_retry_total++;
    send_job(id, jobs_.at(id), now, out);
  }
}

void GetFlights::resend_all(Millis now, Outbox& out) {
  for (auto& [id, job] : jobs_) send_job(id, job, now, out);
}

GetFlights::JobSettled GetFlights::on_job_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out) {
  JobSettled settled;
  auto job_id = jobs_.id_of(token);
  if (!job_id) return settled;
  auto j = jobs_.find(*job_id);
  if (j == jobs_.end()) return settled;
  const size_t n = j->second.keys.size();
  // Identity first: a reply that does not answer this job item by item leaves the job to its timer.
  if (j->second.kind == Job::Kind::kStart) {
    auto* r = reply.body.AsBatchGetStartReply();
    if (!r || r->items.size() != n) return settled;
    for (size_t i = 0; i < n; ++i)
      if (r->items[i]->get_id != j->second.get_ids[i]) return settled;
  } else if (j->second.kind == Job::Kind::kDone) {
    auto* r = reply.body.AsBatchGetDoneReply();
    if (!r || r->results.size() != n) return settled;
  } else {
    auto* r = reply.body.AsBatchGetRevokeReply();
    if (!r || r->known.size() != n) return settled;
  }
  Job job = jobs_.take(j);
  if (job.kind == Job::Kind::kStart) {
    auto* r = reply.body.AsBatchGetStartReply();
    for (size_t i = 0; i < n; ++i) {
      const auto& s = *r->items[i];
      auto it = flights_.find(job.get_ids[i]);
      if (it == flights_.end()) continue;  // a Starting flight is never erased; defensive
      Flight& f = it->second;
      if (s.status != wire::GetStartStatus::Started) {
        s_.counters.get_remote_miss_total++;
        fail_flight(job.get_ids[i], std::string("master: ") + wire::EnumNameGetStartStatus(s.status), false, now,
                    out);
        continue;
      }
      f.phase = Phase::kStarted;
      if (f.wanted) fetchable_.insert(job.get_ids[i]);
      f.source_node = s.source_node;
      f.source_generation = s.source_generation;
      f.src_offset = s.offset;
      f.len = s.len;
      f.ver = Version{s.origin_node, s.origin_generation, s.origin_put_id};
      f.host = s.data_host;
      f.port = s.data_port;
      f.grant.assign(s.grant.begin(), s.grant.end());
      f.since = now;
      if (f.len == 0 || slot_size_for(f.len) > s_.cfg.grant_bytes) {
        fail_flight(job.get_ids[i], "value of " + std::to_string(f.len) + " bytes does not fit a local slot", true,
                    now, out);
        continue;
      }
      if (f.interest == 0) fail_flight(job.get_ids[i], "no request retains it", true, now, out);
    }
    settled.started = true;
  } else if (job.kind == Job::Kind::kDone) {
    auto* r = reply.body.AsBatchGetDoneReply();
    for (size_t i = 0; i < n; ++i) {
      Flight& f = flights_.at(job.get_ids[i]);
      if (r->results[i] != wire::GetDoneStatus::Live) {
        s_.counters.get_done_stale_total++;
        fail_flight(job.get_ids[i], "the value changed or went while it was fetched", false, now, out);
        continue;
      }
      const SlotRef slot = *f.slot;
      s_.pool.pending_live(slot);
      s_.live_routes++;
      if (f.interest > 0) {  // every waiter shares this one slot (G7); the flight pins it for them
        s_.pool.add_holder(slot);
        f.pinned = true;
      }
      if (s_.local.contains(f.key)) {
        // A local put of the key won meanwhile: this copy's route goes, route first (S2).
        settled.removals.push_back({Removal{f.key, f.ver, slot, f.batch}});
      } else {
        s_.local.insert(f.key, LocalIndex::Entry{f.batch, slot, f.len, true, f.group, f.ver},
                        f.parent.empty() ? nullptr : &f.parent, f.depth);
        settled.live.push_back(LiveEntry{f.key, {f.batch, f.group}, s_.pool.slot_size(slot)});
      }
      f.phase = Phase::kReady;
      s_.counters.get_flights_ready_total++;
      clear_marker(f.key, job.get_ids[i]);
      erase_flight_if_done(job.get_ids[i]);
    }
    settled.done = true;
  }
  // kRevoke: the master dropped the get (or had already): the slot was freed when it was revoked.
  return settled;
}

void GetFlights::fill_stats(OwnerStats& r) const {
  r.active_get_handles = handles_.size();
  for (const auto& [id, f] : flights_) {
    if (f.phase == Phase::kStarting) r.flights_starting++;
    else if (f.phase == Phase::kStarted) r.flights_started++;
    else if (f.phase == Phase::kFinishing) r.flights_finishing++;
  }
  for (const auto& [id, j] : jobs_)
    if (j.kind == Job::Kind::kRevoke) r.flights_revoking += j.keys.size();
  r.get_jobs = jobs_.size();
  r.pending_gets = pending_gets_.size();
}

}  // namespace fluxon
