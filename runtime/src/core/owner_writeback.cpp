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
  (void)resident_.insert(key, ref, weight);
  if (hot_) hot.push_back({key, ref, weight});
}

void OwnerCore::admit_hot(const HotBatch& batch, Millis now, Outbox& out) {
  // A1: the keys of one reply (whole cohorts) went live together and enter the hot tier together,
  // so no member is evicted (and written back) while another is not live yet.
  if (!hot_ || batch.empty()) return;
  std::vector<std::pair<std::string, ResidentRef>> evicted;
  for (const auto& h : batch) (void)hot_->insert(h.key, h.ref, h.weight, &evicted);
  if (!evicted.empty()) write_back(evicted, now, out);
}

void OwnerCore::write_back(const std::vector<std::pair<std::string, ResidentRef>>& evicted, Millis now,
                           Outbox& out) {
  counters_.hot_evicted_keys_total += evicted.size();
  if (alone() || replica_target_) return;  // nowhere to write to, or the copy would be this one
  for (const auto& [key, ref] : evicted) {
    WriteBackJob job;
    for (const CohortId& id : exact_cohort({ref.put_id, ref.group})) {
      auto c = cohorts_.find(id);
      if (c == cohorts_.end() || writeback_of_.count(id)) continue;  // gone, or on its way already
      bool live = true;
      for (const auto& k : c->second) {
        auto it = index_.find(k);
        live = live && it != index_.end() && it->second.put_id == id.first && it->second.live;
      }
      if (!live) continue;  // not published yet, or leaving: nothing to copy
      job.cohorts.push_back(id);
      for (const auto& k : c->second) {
        job.keys.push_back(k);
        job.versions.push_back(index_.at(k).ver);
        job.put_ids.push_back(id.first);
      }
    }
    if (job.keys.empty()) continue;
    const uint64_t id = next_writeback_++;
    for (const auto& c : job.cohorts) writeback_of_[c] = id;
    counters_.writeback_cohorts_total += job.cohorts.size();
    counters_.writeback_keys_total += job.keys.size();
    job.deadline = now + cfg_.writeback_timeout_ms;
    auto [it, _] = writebacks_.emplace(id, std::move(job));
    send_writeback(id, it->second, now, out);
  }
}

void OwnerCore::send_writeback(uint64_t id, WriteBackJob& job, Millis now, Outbox& out) {
  std::vector<std::unique_ptr<wire::WriteBackItemT>> items;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    auto item = std::make_unique<wire::WriteBackItemT>();
    item->key = job.keys[i];
    item->origin_node = job.versions[i].origin_node;
    item->origin_generation = job.versions[i].origin_generation;
    item->origin_put_id = job.versions[i].put_id;
    items.push_back(std::move(item));
  }
  Envelope env;
  if (job.demoting) {
    wire::DemoteT d;
    d.node_id = cfg_.node_id;
    d.generation = generation_;
    d.items = std::move(items);
    env = make_envelope(std::move(d));
  } else {
    wire::WriteBackT w;
    w.node_id = cfg_.node_id;
    w.generation = generation_;
    w.items = std::move(items);
    env = make_envelope(std::move(w));
  }
  counters_.writeback_requests_total++;
  job.tokens.push_back(next_master_token_++);
  job.next_send = now + cfg_.publish_retry_ms;
  master_tokens_[job.tokens.back()] = {JobKind::kWriteBack, id};
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, job.tokens.back(), std::move(env)});
}

void OwnerCore::end_writeback(uint64_t id) {
  auto j = writebacks_.find(id);
  if (j == writebacks_.end()) return;
  for (uint64_t tok : j->second.tokens) master_tokens_.erase(tok);
  for (const auto& c : j->second.cohorts) {
    auto w = writeback_of_.find(c);
    if (w != writeback_of_.end() && w->second == id) writeback_of_.erase(w);
  }
  writebacks_.erase(j);
}

void OwnerCore::on_writeback_reply(uint64_t id, Envelope& reply_env, Millis now, Outbox& out) {
  auto j = writebacks_.find(id);
  if (j == writebacks_.end()) return;
  WriteBackJob& job = j->second;
  auto settle_tokens = [&] {  // a reply settles every attempt so far; the next one is new
    for (uint64_t tok : job.tokens) master_tokens_.erase(tok);
    job.tokens.clear();
  };
  if (auto* wr = reply_env.body.AsWriteBackReply()) {
    if (job.demoting || wr->status.size() != job.keys.size()) return;  // a late reply of the first phase
    settle_tokens();
    size_t backed = 0;
    for (auto st : wr->status) {
      if (st == wire::WriteBackStatus::Obsolete || st == wire::WriteBackStatus::NoTarget) {
        counters_.writeback_abandoned_total++;  // the value moved on, or nowhere to copy it to
        end_writeback(id);
        return;
      }
      backed += st == wire::WriteBackStatus::Backed;
    }
    if (backed < job.keys.size()) return;  // tasks on their way: asked again at next_send
    counters_.writeback_backed_keys_total += job.keys.size();
    if (!cfg_.writeback_demote) {  // inclusive write-back: both copies stay
      end_writeback(id);
      return;
    }
    job.demoting = true;
    send_writeback(id, job, now, out);
    return;
  }
  auto* dr = reply_env.body.AsDemoteReply();
  if (!dr || !job.demoting) return;
  settle_tokens();
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
    auto it = index_.find(job.keys[i]);
    if (it == index_.end() || it->second.put_id != job.put_ids[i] || !it->second.live) continue;
    const Entry e = it->second;
    erase_entry(it);
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
  std::vector<uint64_t> expired;
  for (auto& [id, job] : writebacks_) {
    if (now >= job.deadline) expired.push_back(id);
    else if (now >= job.next_send) send_writeback(id, job, now, out);
  }
  for (uint64_t id : expired) {
    counters_.writeback_abandoned_total++;
    end_writeback(id);
  }
}

}  // namespace fluxon
