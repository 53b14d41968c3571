#include "fluxon/owner/writeback.hpp"

#include <algorithm>

namespace fluxon {

void WriteBack::admit(const std::vector<LiveEntry>& live, Millis now, Outbox& out, bool puts) {
  // A target-role owner is where write-backs go: it keeps no hot tier of its own.
  auto* hot_tier = s_.replica_target ? nullptr : s_.local.hot();
  for (const auto& e : live) s_.local.enter_resident(e.key, e.ref, e.weight);
  // A1: the keys of one reply (whole cohorts) went live together and enter the hot tier together,
  // so no member is evicted (and written back) while another is not live yet.
  if (live.empty()) return;
  // Spill: what goes live while the pool is pressed goes on to a target-role owner (then leaves).
  if (puts && s_.cfg.spill_free_ratio > 0 && !s_.replica_target && pressured(live.front().weight)) {
    std::vector<std::pair<std::string, LocalIndex::ResidentRef>> spilled;
    for (const auto& e : live) spilled.emplace_back(e.key, e.ref);
    write_back(spilled, now, out, true);
  }
  // With the depth order a fetched copy stays out of the hot tier: its source holds the value, so
  // writing it back would spend the pipeline on a copy that exists (it is evicted in the depth
  // order, as the deepest when its depth is not known).
  if (!hot_tier || (!puts && s_.local.depth_order())) return;
  enter_hot(live, now, out);
}

void WriteBack::unbacked(const std::vector<std::string>& keys, Millis now, Outbox& out) {
  auto* hot_tier = s_.replica_target ? nullptr : s_.local.hot();
  std::vector<LiveEntry> back;
  for (const auto& key : keys) {
    auto it = s_.local.find(key);
    if (it == s_.local.end() || !it->second.live) continue;  // gone here too, or leaving
    const auto cohorts = s_.local.exact_cohort({it->second.put_id, it->second.group});
    bool cleared = false;
    for (const CohortId& id : cohorts) cleared = s_.local.clear_remote_complete(id) || cleared;
    if (!cleared) continue;  // never written back by this owner, or heard already
    s_.counters.unbacked_keys_total++;
    if (!hot_tier) continue;  // (a write_through put's copies: nothing to write back again)
    // Its whole exact cohort rejoins the hot tier together (A1), as when it went live.
    for (const CohortId& id : cohorts)
      if (const auto* members = s_.local.cohort(id))
        for (const auto& k : *members) {
          auto m = s_.local.find(k);
          if (m != s_.local.end() && m->second.live && s_.local.resident().contains(k) && !hot_tier->contains(k))
            back.push_back(LiveEntry{k, {m->second.put_id, m->second.group}, s_.pool.slot_size(m->second.slot)});
        }
  }
  if (!back.empty()) enter_hot(back, now, out);
}

void WriteBack::enter_hot(const std::vector<LiveEntry>& live, Millis now, Outbox& out) {
  auto* hot_tier = s_.local.hot();
  std::vector<std::pair<std::string, LocalIndex::ResidentRef>> evicted;
  for (const auto& e : live) (void)hot_tier->insert(e.key, e.ref, e.weight, &evicted);
  if (const DepthOrder* order = s_.local.depth_order()) {
    // eviction_order: prefix_depth - the tier holds what is not written back yet, unbounded; over
    // its share, the victims are taken in the depth order (stale first, then the deepest).
    const uint64_t size = hot_tier->weighted_size(), cap = hot_tier->max_capacity();
    uint64_t over = size > cap ? size - cap : 0;
    if (over > 0)
      order->visit([&](const std::string& k) {
        auto it = s_.local.find(k);
        if (it == s_.local.end() || !hot_tier->contains(k)) return false;
        const LocalIndex::ResidentRef r{it->second.put_id, it->second.group};
        if (!hot_tier->remove_if(k, [&](const LocalIndex::ResidentRef& x) { return x.put_id == r.put_id; }))
          return false;
        evicted.emplace_back(k, r);
        over -= std::min(over, s_.pool.slot_size(it->second.slot));
        return over == 0;
      });
  }
  if (!evicted.empty()) write_back(evicted, now, out);
}

bool WriteBack::pressured(uint64_t slot_size) const {
  // What a claim of this class could still get (free slots and grants to carve) against all it could have.
  return double(s_.pool.available_slots(slot_size)) < s_.cfg.spill_free_ratio * double(s_.pool.slots_at_most(slot_size));
}

void WriteBack::write_back(const std::vector<std::pair<std::string, LocalIndex::ResidentRef>>& evicted, Millis now,
                           Outbox& out, bool spill) {
  if (!spill) s_.counters.hot_evicted_keys_total += evicted.size();
  if (s_.alone() || s_.replica_target) return;  // nowhere to write to, or the copy would be this one
  std::vector<uint64_t> fresh;
  for (const auto& [key, ref] : evicted) {
    if (jobs_.size() >= s_.cfg.limits.writebacks) {  // the bound: this cohort stays, uncopied
      s_.counters.writebacks_full_total++;
      continue;
    }
    Job job;
    for (const CohortId& id : s_.local.exact_cohort({ref.put_id, ref.group})) {
      const auto* c = s_.local.cohort(id);
      if (!c || job_of_.count(id)) continue;  // gone, or on its way already
      bool live = true;
      for (const auto& k : *c) {
        auto it = s_.local.find(k);
        live = live && it != s_.local.end() && it->second.put_id == id.first && it->second.live;
      }
      if (!live) continue;  // not published yet, or leaving: nothing to copy
      job.cohorts.push_back(id);
      for (const auto& k : *c) {
        job.keys.push_back(k);
        job.versions.push_back(s_.local.at(k).ver);
      }
    }
    if (job.keys.empty()) continue;
    const uint64_t id = next_job_++;
    for (const auto& c : job.cohorts) job_of_[c] = id;
    job.spill = spill;
    if (spill) {
      s_.counters.spill_cohorts_total += job.cohorts.size();
      s_.counters.spill_keys_total += job.keys.size();
    }
    s_.counters.writeback_cohorts_total += job.cohorts.size();
    s_.counters.writeback_keys_total += job.keys.size();
    job.deadline = now + s_.cfg.writeback_timeout_ms;
    deadlines_.emplace(job.deadline, id);
    jobs_.emplace(id, std::move(job));
    fresh.push_back(id);
  }
  if (!fresh.empty()) send_batch(fresh, now, out);
}

void WriteBack::send_batch(const std::vector<uint64_t>& jobs, Millis now, Outbox& out) {
  wire::WriteBackT w;
  w.node_id = s_.cfg.node_id;
  w.generation = s_.generation;
  Batch batch;
  batch.expires = now + 2 * Millis(s_.cfg.master_rpc_timeout_ms);
  for (uint64_t id : jobs) {
    Job& job = jobs_.at(id);
    batch.jobs.emplace_back(id, job.keys.size());
    for (size_t i = 0; i < job.keys.size(); ++i) {
      const std::string* parent = s_.local.parent_of(job.keys[i]);
      w.items.push_back(std::make_unique<wire::WriteBackItemT>(
          wire::WriteBackItemT{{}, job.keys[i], job.versions[i].origin_node, job.versions[i].origin_generation,
                               job.versions[i].put_id, parent ? *parent : std::string(),
                               wire_depth(s_.local.depth_of(job.keys[i])),
                               /*declinable=*/job.through_put == 0 && !job.spill}));
    }
    // Asked again soon: a write-back is answered Queued until its copy lands, and the slots it
    // frees (demotion) wait for that answer.
    jobs_.schedule(id, now + std::min<Millis>(kBackedPollMs, s_.cfg.publish_retry_ms));
  }
  s_.counters.writeback_requests_total++;
  const uint64_t tok = s_.new_token(JobKind::kWriteBackBatch);
  batches_[tok] = std::move(batch);
  s_.to_master(tok, make_envelope(std::move(w)), out);
}

void WriteBack::write_through(uint64_t put_id, uint64_t session, std::vector<CohortId> cohorts,
                              std::vector<std::string> keys, std::vector<Version> versions, Millis now, Outbox& out) {
  if (keys.empty()) {  // every key was replaced here meanwhile: nothing of this put to copy
    s_.counters.write_through_backed_total++;
    through_done_.push_back({put_id, session, Status::ok()});
    return;
  }
  if (jobs_.size() >= s_.cfg.limits.writebacks) {
    s_.counters.writebacks_full_total++;
    s_.counters.write_through_failed_total++;
    through_done_.push_back({put_id, session, Status(Code::kTimeout, "write_through: " +
                                                                           std::to_string(jobs_.size()) +
                                                                           " write-backs in flight (the bound)")});
    return;
  }
  Job job;
  job.keys = std::move(keys);
  job.versions = std::move(versions);
  job.through_put = put_id;
  job.through_session = session;
  const uint64_t id = next_job_++;
  for (const auto& c : cohorts)
    if (!job_of_.count(c)) {  // a hot-tier write-back carrying it already copies it too
      job_of_[c] = id;
      job.cohorts.push_back(c);
    }
  s_.counters.writeback_keys_total += job.keys.size();
  job.deadline = now + s_.cfg.writeback_timeout_ms;
  deadlines_.emplace(job.deadline, id);
  jobs_.emplace(id, std::move(job));
  send_batch({id}, now, out);
}

std::vector<std::vector<WriteBack::CohortId>> WriteBack::on_batch_reply(uint64_t token, Envelope& reply) {
  std::vector<std::vector<CohortId>> backed;
  auto b = batches_.find(token);
  auto* wr = reply.body.AsWriteBackReply();
  if (b == batches_.end() || !wr) return backed;
  const auto jobs = std::move(b->second.jobs);
  batches_.erase(b);
  size_t total = 0;
  for (const auto& [id, n] : jobs) total += n;
  if (total != wr->status.size()) return backed;  // not this request's answer: its jobs ask again
  size_t at = 0;
  for (const auto& [id, n] : jobs) {
    // A job that ended since this request left skips its part.
    if (auto j = jobs_.find(id); j != jobs_.end()) {
      auto cohorts = j->second.cohorts;
      const bool through = j->second.through_put != 0, spill = j->second.spill;
      if (settle(id, wr->status.data() + at)) {
        if (through) {  // the put's copies here stay (L2) and are recoverable now
          for (const auto& c : cohorts) s_.local.mark_remote_complete(c);
        } else if (s_.cfg.writeback_demote || spill) {
          backed.push_back(std::move(cohorts));  // a demotion transaction takes it from here
        } else {  // inclusive: both copies stay, and capacity eviction takes these first (nothing lost)
          for (const auto& c : cohorts) s_.local.mark_remote_complete(c);
        }
      }
    }
    at += n;
  }
  return backed;
}

void WriteBack::cohort_evicted(CohortId cohort) {
  if (auto w = job_of_.find(cohort); w != job_of_.end())
    end(w->second, Status(Code::kKeyNotFound, "write_through: evicted here before a target-role owner held its copy"));
}

void WriteBack::end(uint64_t id, Status why) {
  auto j = jobs_.find(id);
  if (j == jobs_.end()) return;
  if (j->second.through_put) {
    (why.is_ok() ? s_.counters.write_through_backed_total : s_.counters.write_through_failed_total)++;
    through_done_.push_back({j->second.through_put, j->second.through_session, std::move(why)});
  }
  for (const auto& c : j->second.cohorts) {
    auto w = job_of_.find(c);
    if (w != job_of_.end() && w->second == id) job_of_.erase(w);
  }
  deadlines_.erase({j->second.deadline, id});
  jobs_.erase(j);
}

// One job's answer (its keys' statuses, in order).
bool WriteBack::settle(uint64_t id, const wire::WriteBackStatus* status) {
  Job& job = jobs_.at(id);
  size_t backed = 0;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    if (status[i] == wire::WriteBackStatus::Declined) {  // the target would evict it next: it stays ours
      s_.counters.writeback_declined_keys_total += job.keys.size();
      end(id, Status::ok());
      return false;
    }
    if (status[i] == wire::WriteBackStatus::Obsolete || status[i] == wire::WriteBackStatus::NoTarget) {
      s_.counters.writeback_abandoned_total++;  // the value moved on, or nowhere to copy it to
      const bool none = status[i] == wire::WriteBackStatus::NoTarget;
      end(id, Status(none ? Code::kNoSpace : Code::kKeyNotFound,
                     "write_through: key '" + job.keys[i] + "': " +
                         (none ? "no owner of a target role (master.replica_task_placement.remote_only_node_roles)"
                               : "replaced or removed before a target-role owner held its copy")));
      return false;
    }
    backed += status[i] == wire::WriteBackStatus::Backed;
  }
  if (backed < job.keys.size()) return false;  // tasks on their way: asked again at next_send
  s_.counters.writeback_backed_keys_total += job.keys.size();
  end(id, Status::ok());
  return true;
}

void WriteBack::retry(Millis now, Outbox& out) {
  // Deadline-ordered: the jobs whose re-send time or give-up time has come, in id order.
  std::vector<uint64_t> ids = jobs_.due(now);
  for (auto d = deadlines_.begin(); d != deadlines_.end() && d->first <= now; ++d) ids.push_back(d->second);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<uint64_t> expired, again;
  for (uint64_t id : ids) {
    Job& job = jobs_.at(id);
    if (now >= job.deadline) expired.push_back(id);
    else again.push_back(id);
  }
  if (!again.empty()) send_batch(again, now, out);
  // Batches expire in token order (each expires a fixed time after it left): no reply came, and
  // their jobs were (or will be) asked again.
  while (!batches_.empty() && now >= batches_.begin()->second.expires) batches_.erase(batches_.begin());
  for (uint64_t id : expired) {
    s_.counters.writeback_abandoned_total++;
    end(id, Status(Code::kTimeout, "write_through: no target-role owner held the copy within writeback_timeout_ms (" +
                                       std::to_string(s_.cfg.writeback_timeout_ms) + ")"));
  }
}

}  // namespace fluxon
