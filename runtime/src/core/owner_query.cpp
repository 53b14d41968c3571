// OwnerCore's questions that change nothing: exists (how long is the existing prefix, local index
// first, then the master's routes) and remove_prefix (a deployment's values leave this owner).
// Neither claims a slot nor starts a fetch.
#include <algorithm>

#include "fluxon/core/owner_core.hpp"
#include "fluxon/runtime/batch.hpp"

namespace fluxon {

void OwnerCore::exists(uint64_t token, uint64_t session, wire::ExistsReqT& req, Millis now, Outbox& out) {
  std::optional<std::vector<uint32_t>> groups;
  if (!req.atomic_group_lens.empty()) groups = req.atomic_group_lens;
  if (!req.key_prefix.empty() || !req.key_suffix.empty())
    for (auto& k : req.keys) k = req.key_prefix + k + req.key_suffix;
  Status st = validate_keys(req.keys, /*allow_repeats=*/true);  // a question: a repeated key is harmless
  if (st.is_ok()) st = validate_group_lens(groups, req.keys.size());
  if (!st.is_ok()) return reply_error(session, token, st, out);
  counters_.exists_total++;
  const uint32_t n = uint32_t(req.keys.size());
  uint32_t local = 0;
  bool mismatch = false;  // the first key not found here is here with another length: the prefix ends
  for (; local < n; ++local) {
    auto it = local_.find(req.keys[local]);
    if (it == local_.end()) break;
    if (req.expected_len && it->second.len != req.expected_len) {
      counters_.exists_len_mismatch_total++;
      mismatch = true;
      break;
    }
  }
  ExistsJob job{session, token, std::move(groups), n, req.expected_len, local, {}, 0};
  if (local == n || mismatch || alone()) return answer_exists(job, 0, false, out);
  if (exists_jobs_.size() >= cfg_.limits.exists_questions) {  // the bound: what is known here
    counters_.exists_full_total++;
    return answer_exists(job, 0, false, out);
  }
  // The rest is asked of the master in one Lookup (nothing there is pinned or fetched).
  counters_.exists_master_total++;
  job.rest.assign(std::make_move_iterator(req.keys.begin() + local), std::make_move_iterator(req.keys.end()));
  const Millis wait = req.max_wait_ms ? std::min<Millis>(req.max_wait_ms, cfg_.master_rpc_timeout_ms)
                                      : Millis(cfg_.master_rpc_timeout_ms);
  job.deadline = now + wait;
  const uint64_t tok = new_token(JobKind::kExists);
  wire::LookupT lk;
  lk.keys = job.rest;
  exists_jobs_.emplace(tok, std::move(job));
  out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, tok, make_envelope(std::move(lk))});
}

void OwnerCore::answer_exists(const ExistsJob& job, uint32_t remote, bool master_answered, Outbox& out) {
  wire::ExistsReplyT r;
  std::vector<bool> hits(job.n, false);
  std::fill_n(hits.begin(), job.local + remote, true);
  r.prefix_len = compute_prefix(hits, job.groups, true).transferable_len;
  r.local_len = std::min(r.prefix_len, job.local);
  r.master_answered = master_answered;
  reply(OwnerOut::Kind::kReply, job.session, job.token, make_envelope(std::move(r)), out);
}

void OwnerCore::on_exists_reply(uint64_t token, Envelope& reply_env, Outbox& out) {
  auto it = exists_jobs_.find(token);
  if (it == exists_jobs_.end()) return;
  const ExistsJob& job = it->second;
  uint32_t remote = 0;
  bool answered = false;
  if (auto* rep = reply_env.body.AsLookupReply(); rep && rep->routes.size() == job.rest.size()) {
    answered = true;
    for (const auto& r : rep->routes) {
      if (!r || !r->found) break;
      if (job.expected_len && r->len != job.expected_len) {
        counters_.exists_len_mismatch_total++;
        break;
      }
      remote++;
    }
  } else {
    counters_.exists_master_unanswered_total++;
  }
  answer_exists(job, remote, answered, out);
  exists_jobs_.erase(it);
}

void OwnerCore::expire_exists(Millis now, Outbox& out) {
  for (auto it = exists_jobs_.begin(); it != exists_jobs_.end();) {
    if (now < it->second.deadline) {
      ++it;
      continue;
    }
    // The master did not answer in time: the local prefix is what is known to exist.
    counters_.exists_master_unanswered_total++;
    answer_exists(it->second, 0, false, out);
    it = exists_jobs_.erase(it);
  }
}

void OwnerCore::remove_prefix(uint64_t token, uint64_t session, const wire::RemovePrefixReqT& req, Millis now,
                              Outbox& out) {
  if (req.prefix.empty())
    return reply_error(session, token, invalid_argument("prefix: must not be empty (it would remove every value)"),
                       out);
  std::vector<std::string> keys;
  for (const auto& [k, e] : local_.entries())
    if (k.size() >= req.prefix.size() && k.compare(0, req.prefix.size(), req.prefix) == 0) keys.push_back(k);
  // Route first, then the slot once its last holder is gone (S2): the path of every removal.
  for (const auto& k : keys) remove_key(k, now, out);
  counters_.removed_by_prefix_total += keys.size();
  wire::RemovePrefixReplyT r;
  r.removed = keys.size();
  reply(OwnerOut::Kind::kReply, session, token, make_envelope(std::move(r)), out);
}

}  // namespace fluxon
