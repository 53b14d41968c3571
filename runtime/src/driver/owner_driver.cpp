#include "fluxon/driver/owner_driver.hpp"

namespace fluxon {

void OwnerDriver::master_up(Millis now, bool reconnected) {
  master_up_ = true;
  if (reconnected) core_.on_master_reconnected(now, out_);
  else core_.start(now, out_);
  drain();
}

uint64_t OwnerDriver::begin_request(uint64_t session) {
  const uint64_t token = next_token_++;
  waiting_.emplace(token, session);
  return token;
}

Status OwnerDriver::on_client_bytes(const uint8_t* data, size_t len, Millis now,
                                    const std::function<void(uint64_t)>& admitted) {
  auto checked = verify_envelope(data, len);
  if (!checked.ok()) return checked.status();
  const wire::Envelope* env = *checked;
  const uint64_t token = begin_request(env->session_id());
  admitted(token);
  if (const wire::GetStartReq* g = env->body_as_GetStartReq()) {
    key_views_.clear();
    if (g->keys())
      for (const flatbuffers::String* k : *g->keys()) key_views_.emplace_back(k->data(), k->size());
    std::span<const uint32_t> groups;
    if (g->atomic_group_lens()) groups = {g->atomic_group_lens()->data(), g->atomic_group_lens()->size()};
    core_.on_get_start(token, env->session_id(), env->generation(),
                       GetStartArgs{key_views_, groups, g->prefix_best_effort(), g->max_wait_ms()}, now, out_);
    after_request();
    return Status::ok();
  }
  std::unique_ptr<Envelope> req(env->UnPack());
  on_client_request(token, *req, now);
  return Status::ok();
}

void OwnerDriver::on_client_request(uint64_t token, Envelope& req, Millis now) {
  core_.on_client_request(token, req, now, out_);
  after_request();
}

void OwnerDriver::after_request() {
  drain();
  if (core_.gets_to_flush() && !flush_queued_) {
    // G9: the leaders of every get_start already queued join this BatchGetStart; the flush queues
    // behind them and adds no wait of its own.
    flush_queued_ = true;
    ports_.flush_soon();
  }
}

void OwnerDriver::on_client_note(Envelope& note, Millis now) {
  core_.on_client_note(note, now, out_);
  drain();
}

std::vector<uint64_t> OwnerDriver::close_session(uint64_t session, Millis now) {
  std::vector<uint64_t> dropped;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->second == session) {
      dropped.push_back(it->first);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  core_.close_session(session, out_);
  drain();
  return dropped;
}

void OwnerDriver::master_replied(uint64_t token, SharedBytes bytes) {
  const auto c = faults_.link(FaultPoints::k_master_reply);
  for (int i = 0; i < c.n; ++i) ports_.master_reply_later(token, bytes, c.delay[i]);
}

void OwnerDriver::on_master_reply(uint64_t token, const Bytes& bytes, Millis now) {
  auto env = decode(bytes);
  if (!env.ok()) return core_.on_master_failure(token);
  core_.on_master_reply(token, **env, now, out_);
  drain();
}

void OwnerDriver::on_transfer_done(uint64_t id, const Status& result, Millis now) {
  core_.on_transfer_done(id, result, now, out_);
  drain();
}

void OwnerDriver::flush(Millis now) {
  flush_queued_ = false;
  core_.flush_gets(now, out_);
  drain();
}

void OwnerDriver::tick(Millis now) {
  core_.tick(now, out_);
  drain();
}

void OwnerDriver::remove_key(const std::string& key, Millis now) {
  core_.remove_key(key, now, out_);
  drain();
}

void OwnerDriver::drain() {
  for (auto [offset, len] : core_.take_new_grant_ranges()) ports_.populate(offset, len);
  for (auto [offset, len] : core_.take_released_grant_ranges()) ports_.release(offset, len);
  // Effects may call back into the driver (a port that delivers at once): take the outbox first.
  Outbox out;
  out.swap(out_);
  for (auto& o : out) {
    switch (o.kind) {
      case OwnerOut::Kind::kReply: {
        auto it = waiting_.find(o.token);
        if (it == waiting_.end()) break;  // its session went meanwhile
        waiting_.erase(it);
        ports_.reply(o.token, o.env);
        break;
      }
      case OwnerOut::Kind::kNote:
        ports_.note(o.session, o.env);
        break;
      case OwnerOut::Kind::kMaster: {
        // Encoded once: every copy carries the same bytes. Lost while the link is down: the core
        // re-sends with the same identity once it is back (T1).
        if (!master_up_) break;
        auto bytes = std::make_shared<const Bytes>(encode(o.env));
        const auto c = faults_.link(FaultPoints::k_master_request);
        for (int i = 0; i < c.n; ++i) ports_.to_master(o.token, bytes, c.delay[i]);
        break;
      }
      case OwnerOut::Kind::kTransfer: {
        const auto f = faults_.fetch();
        ports_.fetch(std::move(o.transfer), f.fail, f.delay);
        break;
      }
    }
  }
}

}  // namespace fluxon
