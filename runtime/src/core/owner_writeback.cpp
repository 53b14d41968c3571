// Owner-hot write-back and single-copy demotion (the design's E16ap): live entries also sit in a
// hot W-TinyLFU tier smaller than the segment; when it evicts a key, the key's exact cohort gets a
// copy on a target-role owner (remote_cache) through the replica tasks the master queues, and, with
// writeback_demote, this owner's copies then go in one all-or-none Demote that the master grants
// only while the remote copy of the same version stays. Nothing here waits: capacity eviction may
// take the cohort first (S3), a lost reply is answered again (T1: WriteBack and Demote are
// idempotent), and a write-back that does not finish is given up, the entries staying.
#include <algorithm>

#include "fluxon/core/owner_core.hpp"

namespace fluxon {

void OwnerCore::index_live(const std::string& key, ResidentRef ref, uint64_t weight, HotBatch& hot) {
  local_.enter_resident(key, ref, weight);
  // A target-role owner is where write-backs go: it keeps no hot tier of its own.
  if (local_.hot() && !replica_target_) hot.push_back({key, ref, weight});
}

void OwnerCore::admit_hot(const HotBatch& batch, Millis now, Outbox& out) {
  // A1: the keys of one reply (whole cohorts) went live together and enter the hot tier together,
  // so no member is evicted (and written back) while another is not live yet.
  auto* hot_tier = local_.hot();
  if (!hot_tier || batch.empty()) return;
  std::vector<std::pair<std::string, ResidentRef>> evicted;
  for (const auto& h : batch) (void)hot_tier->insert(h.key, h.ref, h.weight, &evicted);
  if (!evicted.empty()) write_back(evicted, now, out);
}

void OwnerCore::write_back(const std::vector<std::pair<std::string, ResidentRef>>& evicted, Millis now,
                           Outbox& out) {
  counters_.hot_evicted_keys_total += evicted.size();
  if (alone() || replica_target_) return;  // nowhere to write to, or the copy would be this one
  std::vector<uint64_t> fresh;
  for (const auto& [key, ref] : evicted) {
    WriteBackJob job;
    for (const CohortId& id : local_.exact_cohort({ref.put_id, ref.group})) {
      const auto* c = local_.cohort(id);
      if (!c || writeback_of_.count(id)) continue;  // gone, or on its way already
      bool live = true;
      for (const auto& k : *c) {
        auto it = local_.find(k);
        live = live && it != local_.end() && it->second.put_id == id.first && it->second.live;
      }
      if (!live) continue;  // not published yet, or leaving: nothing to copy
      job.cohorts.push_back(id);
      for (const auto& k : *c) {
        job.keys.push_back(k);
        job.versions.push_back(local_.at(k).ver);
        job.put_ids.push_back(id.first);
      }
    }
    if (job.keys.empty()) continue;
    const uint64_t id = next_writeback_++;
    for (const auto& c : job.cohorts) writeback_of_[c] = id;
    counters_.writeback_cohorts_total += job.cohorts.size();
    counters_.writeback_keys_total += job.keys.size();
    job.deadline = now + cfg_.writeback_timeout_ms;
    writebacks_.emplace(id, std::move(job));
    fresh.push_back(id);
  }
  if (!fresh.empty()) send_writeback_batch(fresh, now, out);
}

void OwnerCore::send_writeback_batch(const std::vector<uint64_t>& jobs, Millis now, Outbox& out) {
  wire::WriteBackT w;
  w.node_id = cfg_.node_id;
  w.generation = generation_;
  WriteBackBatch batch;
  batch.expires = now + 2 * Millis(cfg_.master_rpc_timeout_ms);
  for (uint64_t id : jobs) {
    WriteBackJob& job = writebacks_.at(id);
    batch.jobs.emplace_back(id, job.keys.size());
    for (size_t i = 0; i < job.keys.size(); ++i)
      w.items.push_back(std::make_unique<wire::WriteBackItemT>(wire::WriteBackItemT{
          {}, job.keys[i], job.versions[i].origin_node, job.versions[i].origin_generation, job.versions[i].put_id}));
    writebacks_.schedule(id, now + cfg_.publish_retry_ms);
  }
  counters_.writeback_requests_total++;
  const uint64_t tok = new_token(JobKind::kWriteBackBatch);
  writeback_batches_[tok] = std::move(batch);
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, tok, make_envelope(std::move(w))});
}

void OwnerCore::on_writeback_batch_reply(uint64_t token, Envelope& reply_env, Millis now, Outbox& out) {
  auto b = writeback_batches_.find(token);
  auto* wr = reply_env.body.AsWriteBackReply();
  if (b == writeback_batches_.end() || !wr) return;
  const auto jobs = std::move(b->second.jobs);
  writeback_batches_.erase(b);
  size_t total = 0;
  for (const auto& [id, n] : jobs) total += n;
  if (total != wr->status.size()) return;  // not this request's answer: its jobs ask again
  size_t at = 0;
  for (const auto& [id, n] : jobs) {
    // A job that ended, or moved on to its Demote, since this request left skips its part.
    auto j = writebacks_.find(id);
    if (j != writebacks_.end() && !j->second.demoting) settle_writeback(id, wr->status.data() + at, now, out);
    at += n;
  }
}

void OwnerCore::send_demote(uint64_t id, WriteBackJob& job, Millis now, Outbox& out) {
  wire::DemoteT d;  // one exact cohort set per request: the master grants it all or none
  d.node_id = cfg_.node_id;
  d.generation = generation_;
  for (size_t i = 0; i < job.keys.size(); ++i)
    d.items.push_back(std::make_unique<wire::WriteBackItemT>(wire::WriteBackItemT{
        {}, job.keys[i], job.versions[i].origin_node, job.versions[i].origin_generation, job.versions[i].put_id}));
  Envelope env = make_envelope(std::move(d));
  counters_.writeback_requests_total++;
  const uint64_t tok = new_token(JobKind::kDemote);
  writebacks_.attempt(id, tok);
  writebacks_.schedule(id, now + cfg_.publish_retry_ms);
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, tok, std::move(env)});
}

void OwnerCore::end_writeback(uint64_t id) {
  auto j = writebacks_.find(id);
  if (j == writebacks_.end()) return;
  for (const auto& c : j->second.cohorts) {
    auto w = writeback_of_.find(c);
    if (w != writeback_of_.end() && w->second == id) writeback_of_.erase(w);
  }
  writebacks_.erase(j);
}

// The first phase's answer for one job (its keys' statuses, in order).
void OwnerCore::settle_writeback(uint64_t id, const wire::WriteBackStatus* status, Millis now, Outbox& out) {
  WriteBackJob& job = writebacks_.at(id);
  size_t backed = 0;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    if (status[i] == wire::WriteBackStatus::Obsolete || status[i] == wire::WriteBackStatus::NoTarget) {
      counters_.writeback_abandoned_total++;  // the value moved on, or nowhere to copy it to
      end_writeback(id);
      return;
    }
    backed += status[i] == wire::WriteBackStatus::Backed;
  }
  if (backed < job.keys.size()) return;  // tasks on their way: asked again at next_send
  counters_.writeback_backed_keys_total += job.keys.size();
  if (!cfg_.writeback_demote) {  // inclusive write-back: both copies stay
    end_writeback(id);
    return;
  }
  job.demoting = true;
  send_demote(id, job, now, out);
}

// The second phase's answer (Demote, one job per request).
void OwnerCore::on_demote_reply(uint64_t id, Envelope& reply_env, Millis now, Outbox& out) {
  auto j = writebacks_.find(id);
  if (j == writebacks_.end()) return;
  WriteBackJob& job = j->second;
  auto* dr = reply_env.body.AsDemoteReply();
  if (!dr || !job.demoting) return;
  writebacks_.forget(id);  // a reply settles every attempt so far
  if (dr->status == wire::DemoteStatus::Busy) return;  // a remote get reads a copy here: asked again
  if (dr->status == wire::DemoteStatus::Kept) {
    counters_.demote_kept_total++;  // the remote copy went first: these copies stay
    end_writeback(id);
    return;
  }
  // Demoted: the master holds no route to these copies any more; each slot is Free once no reader
  // holds it (S2). An entry replaced or evicted meanwhile is that path's business already. A copy
  // whose re-publication (resync after a master restart) is in flight goes the superseded way, so
  // that the late re-publication is removed again.
  for (size_t i = 0; i < job.keys.size(); ++i) {
    auto it = local_.find(job.keys[i]);
    if (it == local_.end() || it->second.put_id != job.put_ids[i] || !it->second.live) continue;
    const Entry e = it->second;
    local_.erase(it);
    counters_.demoted_keys_total++;
    counters_.demoted_bytes_total += pool_.slot_size(e.slot);
    auto resync = publish_.find(e.put_id);
    if (resync != publish_.end() && resync->second.resync) {
      supersede(job.keys[i], e, now, out);
      continue;
    }
    pool_.route_dropped(e.slot);
    live_routes_--;
  }
  counters_.demoted_cohorts_total += job.cohorts.size();
  end_writeback(id);
  if (pool_.take_freed()) serve_waiters(out);
}

void OwnerCore::retry_writebacks(Millis now, Outbox& out) {
  std::vector<uint64_t> expired, again;
  for (auto& [id, job] : writebacks_) {
    if (now >= job.deadline) expired.push_back(id);
    else if (now >= job.next_send && job.demoting) send_demote(id, job, now, out);
    else if (now >= job.next_send) again.push_back(id);
  }
  if (!again.empty()) send_writeback_batch(again, now, out);
  for (auto b = writeback_batches_.begin(); b != writeback_batches_.end();) {
    if (now < b->second.expires) {
      ++b;
      continue;
    }
    b = writeback_batches_.erase(b);  // no reply came: its jobs were (or will be) asked again
  }
  for (uint64_t id : expired) {
    counters_.writeback_abandoned_total++;
    end_writeback(id);
  }
}

}  // namespace fluxon
