#include "fluxon/client/client_core.hpp"

#include <algorithm>

namespace fluxon {

Status ClientCore::gate() const {
  if (owner_.generation != acked_generation_)
    return Status(Code::kGenerationMismatch, "owner restarted: generation " + std::to_string(acked_generation_) +
                                                 " -> " + std::to_string(owner_.generation) +
                                                 "; call wait_local_segments_ready() to map the new segment");
  return Status::ok();
}

Envelope ClientCore::addressed(Envelope req) const {
  req.session_id = owner_.session;
  req.generation = owner_.generation;
  return req;
}

// ---- puts ---------------------------------------------------------------------------------------

Result<Envelope> ClientCore::put_start(const std::vector<std::string>& keys, int64_t value_len,
                                       const PutOptionalArgs& opts) const {
  // Validation happens before any slot is reserved or any RPC is sent.
  Status s = validate_keys(keys);
  if (s.is_ok() && value_len <= 0) s = invalid_argument("value_len: must be > 0, got " + std::to_string(value_len));
  if (s.is_ok()) s = validate_group_lens(opts.atomic_group_lens, keys.size());
  if (s.is_ok()) s = validate_replica_mask(opts.make_replica_task_mask, opts.atomic_group_lens, keys.size());
  if (s.is_ok()) s = validate_parent_keys(opts.radix_parent_keys, keys);
  if (s.is_ok()) s = validate_content_depths(opts.content_depths, keys.size());
  if (s.is_ok())
    s = validate_replica_budget(opts.replica_budget, opts.make_replica_task, opts.write_through,
                                opts.atomic_group_lens, keys.size());
  if (!s.is_ok()) return s;
  wire::PutStartReqT req;
  req.keys = keys;
  req.value_len = uint64_t(value_len);
  req.reject_if_inflight_same_key = opts.reject_if_inflight_same_key;
  req.reject_if_exist_same_key = opts.reject_if_exist_same_key;
  req.write_through = opts.write_through;
  req.make_replica_task = opts.make_replica_task;
  if (opts.make_replica_task_mask) req.make_replica_task_mask = *opts.make_replica_task_mask;
  if (opts.atomic_group_lens) req.atomic_group_lens = *opts.atomic_group_lens;
  req.lease_id = opts.lease_id.value_or(0);
  if (opts.radix_parent_keys) req.radix_parent_keys = *opts.radix_parent_keys;
  else if (opts.content_depths) req.radix_parent_keys = parents_from_depths(keys, *opts.content_depths);
  if (opts.content_depths) req.content_depths = *opts.content_depths;
  if (const auto& b = opts.replica_budget) {
    req.replica_budget_pages = b->pages;
    req.replica_group_priorities = b->priorities;
    req.replica_group_ids = b->group_ids;
    req.replica_decision_shares = b->shares;
  }
  req.max_wait_ms = max_wait_ms_;
  return make_envelope(std::move(req));
}

Result<uint64_t> ClientCore::put_started(const Envelope& reply, size_t n, uint64_t value_len,
                                         std::vector<std::pair<uint64_t, uint64_t>>* touched) {
  auto* rep = reply.body.AsPutStartReply();
  if (!rep || rep->offsets.size() != n) return Status(Code::kInternal, "put_start: malformed reply from the owner");
  Plan p;
  p.is_put = true;
  p.put_id = rep->put_id;
  p.at = here();
  p.blob.reset(new uint64_t[2 + 2 * n]);
  p.blob[0] = kPlanMagic;
  p.blob[1] = n;
  std::fill_n(&p.blob[2 + n], n, value_len);
  for (size_t i = 0; i < n; ++i) {
    if (rep->offsets[i] + value_len > owner_.size)
      return Status(Code::kInternal, "put_start: owner offset outside the segment");
    p.blob[2 + i] = reinterpret_cast<uint64_t>(owner_.base + rep->offsets[i]);
    if (touched) touched->emplace_back(rep->offsets[i], value_len);
  }
  return register_plan(std::move(p));
}

uint64_t ClientCore::register_plan(Plan p) {
  const uint64_t ptr = reinterpret_cast<uint64_t>(p.blob.get());
  plans_.emplace(ptr, std::move(p));
  return ptr;
}

Result<ClientCore::Plan> ClientCore::take_plan(uint64_t plan_ptr, bool want_put, const char* op) {
  auto it = plans_.find(plan_ptr);
  if (it == plans_.end()) return invalid_argument(std::string(op) + ": unknown plan_ptr " + std::to_string(plan_ptr));
  if (it->second.is_put != want_put)
    return invalid_argument(std::string(op) + ": plan_ptr is a " + (it->second.is_put ? "put" : "read") + " plan");
  Plan p = std::move(it->second);
  plans_.erase(it);
  return p;
}

Result<Envelope> ClientCore::put_commit(const Plan& p, uint64_t future) {
  if (p.at.id != owner_.link)
    return Status(Code::kGenerationMismatch, "local_fast_put_commit: the plan belongs to an old owner generation");
  // Registered before the request: the PutLive note may overtake the reply.
  futures_[{p.at.id, p.put_id}] = future;
  return make_envelope(wire::PutCommitReqT{{}, p.put_id});
}

void ClientCore::commit_failed(const Plan& p) { futures_.erase({p.at.id, p.put_id}); }

Result<Envelope> ClientCore::put_abort(const Plan& p) const {
  if (p.at.id != owner_.link)
    return Status(Code::kGenerationMismatch, "put_abort: the plan belongs to an old owner generation");
  return make_envelope(wire::PutAbortReqT{{}, p.put_id});
}

// ---- gets ---------------------------------------------------------------------------------------

Result<Envelope> ClientCore::get_start(const std::vector<std::string>& keys, bool prefix_best_effort,
                                       const std::optional<std::vector<uint32_t>>& groups) const {
  Status s = validate_keys(keys);
  if (s.is_ok()) s = validate_group_lens(groups, keys.size());
  if (!s.is_ok()) return s;
  wire::GetStartReqT req;
  req.keys = keys;
  req.prefix_best_effort = prefix_best_effort;
  if (groups) req.atomic_group_lens = *groups;
  req.max_wait_ms = max_wait_ms_;
  return make_envelope(std::move(req));
}

Result<std::pair<uint64_t, GetStartResult>> ClientCore::get_started(const Envelope& reply, size_t n,
                                                                    const std::optional<std::vector<uint32_t>>& groups,
                                                                    Millis sent) {
  auto* rep = reply.body.AsGetStartReply();
  if (!rep) return Status(Code::kInternal, "get_start: malformed reply from the owner");
  Handle h;
  h.owner_handle = rep->handle_id;
  h.at = here();
  h.result.raw_prefix_hit_len = rep->raw_prefix_hit_len;
  h.result.transferable_len = rep->transferable_len;
  h.result.prefix_hit_groups = rep->prefix_hit_groups;
  if (rep->first_miss_index >= 0) h.result.first_miss_index = uint32_t(rep->first_miss_index);
  if (rep->first_miss_group_index >= 0) h.result.first_miss_group_index = uint32_t(rep->first_miss_group_index);
  h.result.all_hit = rep->transferable_len == n;
  h.offsets = rep->offsets;
  h.lens = rep->lens;
  h.holdings = rep->holding_ids;
  h.groups = groups;
  // The owner's TTL starts after the request left; ours is half of it, counted from before the
  // send, so a handle is never used after the owner may have released it.
  h.deadline = sent + Millis(owner_.handle_ttl_ms / 2);
  h.result.owner_rpc = rep->owner_rpc;  // the items come with get_transfer (remote keys in the prefix)
  h.result.local_keys = rep->local_keys;
  h.result.joined_keys = rep->joined_keys;
  h.result.leader_keys = rep->leader_keys;
  h.result.sources = rep->sources;
  if (!h.result.owner_rpc && (h.holdings.size() != h.result.transferable_len || h.offsets.size() != h.holdings.size()))
    return Status(Code::kInternal, "get_start: reply items do not match transferable_len");
  if (rep->owner_rpc && !h.holdings.empty())
    return Status(Code::kInternal, "get_start: an OwnerRpc reply carries no items");
  GetStartResult res = h.result;
  const uint64_t id = next_handle_++;
  handles_.emplace(id, std::move(h));
  return std::make_pair(id, res);
}

Result<ClientCore::Transfer> ClientCore::take_handle(uint64_t handle, std::optional<int64_t> consume_prefix_len) {
  auto it = handles_.find(handle);
  if (it == handles_.end()) return invalid_argument("get_transfer: unknown or consumed handle " + std::to_string(handle));
  const uint32_t tl = it->second.result.transferable_len;
  if (consume_prefix_len) {
    // A bad length leaves the handle usable.
    if (*consume_prefix_len <= 0) return invalid_argument("consume_prefix_len: must be > 0");
    if (*consume_prefix_len > int64_t(tl))
      return invalid_argument("consume_prefix_len: " + std::to_string(*consume_prefix_len) + " > transferable_len " +
                              std::to_string(tl));
    Status s = validate_consume_prefix(uint32_t(*consume_prefix_len), tl, it->second.groups);
    if (!s.is_ok()) return s;
  }
  Handle h = std::move(it->second);
  handles_.erase(it);
  Transfer t;
  t.owner_handle = h.owner_handle;
  t.at = h.at;
  t.transferable_len = tl;
  t.consume = consume_prefix_len ? uint32_t(*consume_prefix_len) : tl;
  t.owner_rpc = h.result.owner_rpc;
  t.offsets = std::move(h.offsets);
  t.lens = std::move(h.lens);
  t.holdings = std::move(h.holdings);
  t.deadline = h.deadline;
  return t;
}

Status ClientCore::begin_transfer(Transfer& t, Millis now) {
  if (t.at.id != owner_.link)
    return Status(Code::kGenerationMismatch, "get_transfer: the handle belongs to an old owner generation");
  if (now > t.deadline) {
    queue_ack(t.at, t.owner_handle, std::move(t.holdings), true);
    return Status(Code::kTimeout, "get_transfer: the handle outlived its TTL and was released");
  }
  if (t.transferable_len == 0) return Status(Code::kKeyNotFound, "get_transfer: nothing to transfer (first key missed)");
  // Remote keys: the owner answers once they are local (or fails them all), tail dropped there.
  if (t.owner_rpc)
    t.request = make_envelope(wire::GetTransferReqT{{}, t.owner_handle, t.consume, max_wait_ms_});
  return Status::ok();
}

Result<uint64_t> ClientCore::finish_transfer(Transfer& t, const Envelope* reply,
                                             std::vector<std::pair<uint64_t, uint64_t>>* touched) {
  const uint32_t consume = t.consume;
  if (t.owner_rpc) {
    auto* rep = reply ? reply->body.AsGetTransferReply() : nullptr;
    if (!rep || rep->offsets.size() != consume || rep->lens.size() != consume || rep->holding_ids.size() != consume)
      return Status(Code::kInternal, "get_transfer: malformed reply from the owner");
    t.offsets = rep->offsets;
    t.lens = rep->lens;
    t.holdings = rep->holding_ids;
  }
  Plan p;
  p.is_put = false;
  p.at = t.at;
  p.blob.reset(new uint64_t[2 + 2 * size_t(consume)]);
  p.blob[0] = kPlanMagic;
  p.blob[1] = consume;
  for (uint32_t i = 0; i < consume; ++i) {
    if (t.offsets[i] + t.lens[i] > owner_.size) {
      queue_ack(t.at, t.owner_handle, std::move(t.holdings), !t.owner_rpc);
      return Status(Code::kInternal, "get_transfer: holding outside the mapped segment");
    }
    p.blob[2 + i] = reinterpret_cast<uint64_t>(owner_.base + t.offsets[i]);
    p.blob[2 + consume + i] = t.lens[i];
    if (touched) touched->emplace_back(t.offsets[i], t.lens[i]);
  }
  std::vector<uint64_t> tail(t.holdings.begin() + consume, t.holdings.end());
  p.holdings.assign(t.holdings.begin(), t.holdings.begin() + consume);
  // Tail holdings go back at once (G5), in the batched acknowledgements. An OwnerRpc handle was
  // consumed by the owner with the reply (its tail released there).
  if (!t.owner_rpc) queue_ack(t.at, t.owner_handle, std::move(tail), true);
  return register_plan(std::move(p));
}

Status ClientCore::cancel(uint64_t handle) {
  auto it = handles_.find(handle);
  if (it == handles_.end())
    return invalid_argument("cancel_get_transfer: unknown or consumed handle " + std::to_string(handle));
  Handle h = std::move(it->second);
  handles_.erase(it);
  if (h.owner_handle != 0) queue_ack(h.at, h.owner_handle, std::move(h.holdings), true);
  return Status::ok();
}

void ClientCore::release_views(Plan&& p) {
  if (!p.holdings.empty()) queue_ack(p.at, 0, std::move(p.holdings), false);
}

// ---- questions ----------------------------------------------------------------------------------

Result<Envelope> ClientCore::exists(const std::vector<std::string>& keys,
                                    const std::optional<std::vector<uint32_t>>& groups, uint64_t expected_len,
                                    const std::string& key_prefix, const std::string& key_suffix) const {
  // A question that changes nothing: a repeated key is harmless. Framed keys (key_prefix/key_suffix)
  // may have empty middles; the owner checks the whole keys.
  const bool framed = !key_prefix.empty() || !key_suffix.empty();
  Status s = framed ? (keys.empty() ? invalid_argument("keys: empty batch") : Status::ok())
                    : validate_keys(keys, /*allow_repeats=*/true);
  if (s.is_ok()) s = validate_group_lens(groups, keys.size());
  if (!s.is_ok()) return s;
  wire::ExistsReqT req;
  req.keys = keys;
  req.key_prefix = key_prefix;
  req.key_suffix = key_suffix;
  if (groups) req.atomic_group_lens = *groups;
  req.expected_len = expected_len;
  req.max_wait_ms = max_wait_ms_;
  return make_envelope(std::move(req));
}

Result<ExistsResult> ClientCore::exists_answer(const Envelope& reply, size_t n) {
  auto* rep = reply.body.AsExistsReply();
  if (!rep || rep->prefix_len > n || rep->local_len > rep->prefix_len)
    return Status(Code::kInternal, "exists_prefix: malformed reply from the owner");
  return ExistsResult{rep->prefix_len, rep->local_len, rep->master_answered};
}

// ---- notes, acknowledgements, losses ------------------------------------------------------------

std::vector<std::pair<uint64_t, Status>> ClientCore::on_note(uint64_t link, const Envelope& note) {
  std::vector<std::pair<uint64_t, Status>> done;
  if (auto* live = note.body.AsPutLive()) {
    auto it = futures_.find({link, live->put_id});
    if (it == futures_.end()) return done;
    done.emplace_back(it->second, live->error ? from_wire(*live->error) : Status::ok());
    futures_.erase(it);
  }
  return done;
}

std::vector<std::pair<uint64_t, Status>> ClientCore::lose(uint64_t link, const Status& why) {
  std::vector<std::pair<uint64_t, Status>> done;
  for (auto it = futures_.lower_bound({link, 0}); it != futures_.end() && it->first.first == link;) {
    done.emplace_back(it->second, why);
    it = futures_.erase(it);
  }
  return done;
}

void ClientCore::queue_ack(const Link& at, uint64_t handle, std::vector<uint64_t> release, bool handle_done) {
  // One batch per connection (its session, its owner generation): a batch of another is sealed first.
  if (acks_at_.id != at.id && (!acks_.handles.empty() || !acks_.release.empty())) seal_acks();
  acks_at_ = at;
  if (handle_done) {
    auto hd = std::make_unique<wire::HandleDoneT>();
    hd->handle_id = handle;
    hd->release_holding_ids = std::move(release);
    acks_.handles.push_back(std::move(hd));
  } else {
    acks_.release.insert(acks_.release.end(), release.begin(), release.end());
  }
  if (acks_.handles.size() + acks_.release.size() >= kAckBatch) seal_acks();
}

void ClientCore::seal_acks() {
  if (acks_.handles.empty() && acks_.release.empty()) return;
  ready_.push_back(Acks{acks_at_, make_envelope(std::move(acks_), acks_at_.session, acks_at_.generation)});
  acks_ = wire::AckBatchT{};
}

std::vector<ClientCore::Acks> ClientCore::take_acks(bool flush) {
  if (flush) seal_acks();
  return std::exchange(ready_, {});
}

// ---- the registries -----------------------------------------------------------------------------

size_t ClientCore::put_plans() const {
  return size_t(std::count_if(plans_.begin(), plans_.end(), [](const auto& p) { return p.second.is_put; }));
}

bool ClientCore::references(uint64_t link) const {
  for (const auto& [_, p] : plans_)
    if (p.at.id == link) return true;
  for (const auto& [_, h] : handles_)
    if (h.at.id == link) return true;
  return false;
}

void ClientCore::clear() {
  plans_.clear();
  handles_.clear();
}

}  // namespace fluxon
