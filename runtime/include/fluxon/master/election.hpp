// ElectionCore: one master's campaign for its cluster's leadership through an etcd lease. Plain
// state: no clock, no socket, no thread. A driver (fluxon/runtime/campaign.hpp) asks next(now),
// performs the action against etcd and feeds the answer back.
//
// The safety rule (E1): a leader serves only while the lease that holds its key is certainly alive
// at etcd. A lease granted or renewed by a request *sent* at t lives at etcd until at least t + ttl
// (etcd starts the TTL when the request arrives, which is later), so serving(now) is
// now < sent + ttl - margin, counted from the last renewal that etcd confirmed. A standby can win only
// once that lease is gone at etcd, so two masters never serve at once on one host's clock (and with
// clocks that drift less than the margin, across hosts). A leader that is paused (SIGSTOP) past its
// lease finds serving() false the moment it runs again, before it looks at a request.
//
// The term (E2) is the etcd revision at which the leadership key was created: every election
// creates it anew, so terms only grow, and every owner fences replies of a term older than the
// newest it has seen.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace fluxon {

using ElectionMillis = int64_t;

struct LeaderRecord {
  std::string address;  // "host:port" of the leader's master endpoint
  uint64_t term = 0;    // the key's create revision
};

class ElectionCore {
 public:
  struct Options {
    ElectionMillis ttl_ms = 1000;   // the lease's TTL (etcd grants whole seconds: a multiple of 1000)
    ElectionMillis poll_ms = 100;   // a standby reads the leadership key this often
    std::string address;            // what this master writes as the leader's address
  };
  enum class Role : uint8_t { kCandidate, kLeader, kStandby, kStopped };
  enum class Do : uint8_t { kWait, kGrant, kCampaign, kKeepAlive, kReadLeader, kResign };
  struct Action {
    Do what = Do::kWait;
    int64_t lease = 0;         // kCampaign, kKeepAlive, kResign: the lease to use
    ElectionMillis until = 0;  // kWait: nothing to do before this
  };

  explicit ElectionCore(Options o);

  // What to do at `now`.
  Action next(ElectionMillis now);
  // The answers to the action sent at `sent`.
  void granted(int64_t lease, ElectionMillis sent);
  void campaigned(bool won, const LeaderRecord& holder, ElectionMillis sent);
  void kept_alive(bool alive, ElectionMillis sent);
  void read_leader(const std::optional<LeaderRecord>& holder, ElectionMillis now);
  void resigned();
  // A watch saw the leadership key change (deleted, or created anew): a standby reads it at once
  // instead of at its next poll (a deleted key: it campaigns right after).
  void leader_changed(ElectionMillis now);
  // etcd did not answer (unreachable, timeout, an error reply): the action is retried later.
  void failed(ElectionMillis now);
  // Stop campaigning; a leader resigns first (its key and lease go at once: no TTL to wait out).
  void stop();

  // E1: this master may answer as the leader now.
  bool serving(ElectionMillis now) const { return role_ == Role::kLeader && now < valid_until_; }
  Role role() const { return role_; }
  bool stopped() const { return role_ == Role::kStopped && lease_ == 0; }
  // The leader's term: this master's while it leads, the one it last saw lead otherwise.
  uint64_t term() const { return term_; }
  const std::optional<LeaderRecord>& leader() const { return leader_; }
  ElectionMillis valid_until() const { return valid_until_; }
  uint64_t elections_won() const { return won_; }
  uint64_t step_downs() const { return step_downs_; }

 private:
  void step_down();
  ElectionMillis margin() const { return opts_.ttl_ms / 10; }

  Options opts_;
  Role role_ = Role::kCandidate;
  int64_t lease_ = 0;
  ElectionMillis lease_until_ = 0;      // the lease certainly lives until then (sent + ttl - margin)
  ElectionMillis valid_until_ = 0;      // leader: serving() holds until then
  ElectionMillis next_renew_ = 0;       // leader: the next keepalive
  ElectionMillis next_poll_ = 0;        // standby: the next read of the key; candidate: the next try
  std::optional<LeaderRecord> leader_;
  uint64_t term_ = 0;
  uint64_t won_ = 0, step_downs_ = 0;
};

}  // namespace fluxon
