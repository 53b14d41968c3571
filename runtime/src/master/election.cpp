#include "fluxon/master/election.hpp"

#include <algorithm>

namespace fluxon {

ElectionCore::ElectionCore(Options o) : opts_(std::move(o)) {
  opts_.ttl_ms = std::max<ElectionMillis>(opts_.ttl_ms, 10);
  opts_.poll_ms = std::max<ElectionMillis>(opts_.poll_ms, 1);
}

ElectionCore::Action ElectionCore::next(ElectionMillis now) {
  switch (role_) {
    case Role::kStopped:
      if (lease_ != 0) return {Do::kResign, lease_, 0};
      return {Do::kWait, 0, now + opts_.poll_ms};
    case Role::kLeader:
      if (now >= valid_until_) {  // E1: not renewed in time (etcd unreachable, or this process paused)
        step_down();
        return next(now);
      }
      if (now >= next_renew_) return {Do::kKeepAlive, lease_, 0};
      return {Do::kWait, 0, std::min(next_renew_, valid_until_)};
    case Role::kStandby:
      if (now >= next_poll_) return {Do::kReadLeader, 0, 0};
      return {Do::kWait, 0, next_poll_};
    case Role::kCandidate:
      if (now < next_poll_) return {Do::kWait, 0, next_poll_};
      // A lease with most of its life left is reused; else a fresh one (the old one expires alone).
      if (lease_ == 0 || lease_until_ - now < opts_.ttl_ms / 2) return {Do::kGrant, 0, 0};
      return {Do::kCampaign, lease_, 0};
  }
  return {Do::kWait, 0, now + opts_.poll_ms};
}

void ElectionCore::granted(int64_t lease, ElectionMillis sent) {
  lease_ = lease;  // stopped meanwhile: next() revokes it at once
  lease_until_ = sent + opts_.ttl_ms - margin();
}

void ElectionCore::campaigned(bool won, const LeaderRecord& holder, ElectionMillis sent) {
  if (role_ == Role::kStopped) return;
  leader_ = holder;
  term_ = holder.term;
  if (won) {
    role_ = Role::kLeader;
    won_++;
    // The lease was granted (or last renewed) before this campaign: serving lasts as long as it.
    valid_until_ = lease_until_;
    next_renew_ = sent + opts_.ttl_ms / 3;
    return;
  }
  role_ = Role::kStandby;
  next_poll_ = sent + opts_.poll_ms;
}

void ElectionCore::kept_alive(bool alive, ElectionMillis sent) {
  if (role_ != Role::kLeader) return;
  if (!alive) {  // etcd says the lease is gone: so is the key, and another master may lead already
    step_down();
    return;
  }
  lease_until_ = valid_until_ = std::max(valid_until_, sent + opts_.ttl_ms - margin());
  next_renew_ = sent + opts_.ttl_ms / 3;
}

void ElectionCore::read_leader(const std::optional<LeaderRecord>& holder, ElectionMillis now) {
  if (role_ != Role::kStandby) return;
  if (!holder) {  // nobody leads: campaign now
    role_ = Role::kCandidate;
    next_poll_ = now;
    return;
  }
  leader_ = holder;
  term_ = std::max(term_, holder->term);
  next_poll_ = now + opts_.poll_ms;
}

void ElectionCore::leader_changed(ElectionMillis now) {
  if (role_ == Role::kStandby) next_poll_ = std::min(next_poll_, now);
}

void ElectionCore::resigned() {
  lease_ = 0;
  if (role_ == Role::kLeader) step_down();
}

void ElectionCore::failed(ElectionMillis now) {
  const ElectionMillis retry = std::max<ElectionMillis>(opts_.ttl_ms / 10, 10);
  switch (role_) {
    case Role::kLeader: next_renew_ = now + retry; break;  // serving ends at valid_until_ unless renewed
    case Role::kStopped: lease_ = 0; break;                // a resign that fails: the lease expires alone
    // A candidate tries again soon (etcd may still be electing its own leader); a standby reads
    // again at its poll (its watch, when it has one, wakes it sooner).
    case Role::kCandidate: next_poll_ = now + retry; break;
    default: next_poll_ = now + std::max(retry, opts_.poll_ms); break;
  }
}

void ElectionCore::stop() {
  if (role_ == Role::kLeader) step_downs_++;
  role_ = Role::kStopped;
  valid_until_ = 0;
}

void ElectionCore::step_down() {
  role_ = Role::kCandidate;
  step_downs_++;
  valid_until_ = 0;
  lease_ = 0;  // the key went with the lease, or will: a new campaign takes a new lease
  next_poll_ = 0;
}

}  // namespace fluxon
