#include "fluxon/owner/exists.hpp"

#include <algorithm>

#include "fluxon/runtime/batch.hpp"

namespace fluxon {

void Exists::ask(uint64_t token, uint64_t session, wire::ExistsReqT& req, Millis now, Outbox& out) {
  std::optional<std::vector<uint32_t>> groups;
  if (!req.atomic_group_lens.empty()) groups = req.atomic_group_lens;
  if (!req.key_prefix.empty() || !req.key_suffix.empty())
    for (auto& k : req.keys) k = req.key_prefix + k + req.key_suffix;
  Status st = validate_keys(req.keys, /*allow_repeats=*/true);  // a question: a repeated key is harmless
  if (st.is_ok()) st = validate_group_lens(groups, req.keys.size());
  if (!st.is_ok()) return s_.reply_error(session, token, st, out);
  s_.counters.exists_total++;
  const uint32_t n = uint32_t(req.keys.size());
  uint32_t local = 0;
  bool mismatch = false;  // the first key not found here is here with another length: the prefix ends
  // Every key's entry at once: the batch pays the index's memory misses once, not once per key.
  lookup_.resize(n);
  lookup_hashes_.resize(n);
  s_.local.find_many(req.keys, n, lookup_.data(), lookup_hashes_.data());
  for (; local < n; ++local) {
    const LocalIndex::Node* it = lookup_[local];
    if (!it) break;
    if (req.expected_len && it->second.len != req.expected_len) {
      s_.counters.exists_len_mismatch_total++;
      mismatch = true;
      break;
    }
  }
  Job job{session, token, std::move(groups), n, req.expected_len, local, {}, 0};
  if (local == n || mismatch || s_.alone()) return answer(job, 0, false, out);
  if (jobs_.size() >= s_.cfg.limits.exists_questions) {  // the bound: what is known here
    s_.counters.exists_full_total++;
    return answer(job, 0, false, out);
  }
  // The rest is asked of the master in one Lookup (nothing there is pinned or fetched).
  s_.counters.exists_master_total++;
  job.rest.assign(std::make_move_iterator(req.keys.begin() + local), std::make_move_iterator(req.keys.end()));
  const Millis wait = req.max_wait_ms ? std::min<Millis>(req.max_wait_ms, s_.cfg.master_rpc_timeout_ms)
                                      : Millis(s_.cfg.master_rpc_timeout_ms);
  job.deadline = now + wait;
  const uint64_t tok = s_.new_token(JobKind::kExists);
  wire::LookupT lk;
  lk.keys = job.rest;
  deadlines_.emplace(job.deadline, tok);
  jobs_.emplace(tok, std::move(job));
  s_.to_master(tok, make_envelope(std::move(lk)), out);
}

void Exists::answer(const Job& job, uint32_t remote, bool master_answered, Outbox& out) {
  wire::ExistsReplyT r;
  std::vector<bool> hits(job.n, false);
  std::fill_n(hits.begin(), job.local + remote, true);
  r.prefix_len = compute_prefix(hits, job.groups, true).transferable_len;
  r.local_len = std::min(r.prefix_len, job.local);
  r.master_answered = master_answered;
  s_.reply(job.session, job.token, make_envelope(std::move(r)), out);
}

void Exists::erase(std::map<uint64_t, Job>::iterator it) {
  deadlines_.erase({it->second.deadline, it->first});
  jobs_.erase(it);
}

void Exists::on_reply(uint64_t token, Envelope& reply, Outbox& out) {
  auto it = jobs_.find(token);
  if (it == jobs_.end()) return;
  const Job& job = it->second;
  uint32_t remote = 0;
  bool answered = false;
  if (auto* rep = reply.body.AsLookupReply(); rep && rep->routes.size() == job.rest.size()) {
    answered = true;
    for (const auto& r : rep->routes) {
      if (!r || !r->found) break;
      if (job.expected_len && r->len != job.expected_len) {
        s_.counters.exists_len_mismatch_total++;
        break;
      }
      remote++;
    }
  } else {
    s_.counters.exists_master_unanswered_total++;
  }
  answer(job, remote, answered, out);
  erase(it);
}

void Exists::master_failed(uint64_t token) {
  auto it = jobs_.find(token);
  if (it == jobs_.end()) return;
  deadlines_.erase({it->second.deadline, token});
  it->second.deadline = 0;
  deadlines_.emplace(0, token);
}

void Exists::expire(Millis now, Outbox& out) {
  // Deadline-ordered; answered in token order, as they were asked.
  std::vector<uint64_t> due;
  for (auto d = deadlines_.begin(); d != deadlines_.end() && d->first <= now; ++d) due.push_back(d->second);
  std::sort(due.begin(), due.end());
  for (uint64_t tok : due) {
    auto it = jobs_.find(tok);
    // The master did not answer in time: the local prefix is what is known to exist.
    s_.counters.exists_master_unanswered_total++;
    answer(it->second, 0, false, out);
    erase(it);
  }
}

}  // namespace fluxon
