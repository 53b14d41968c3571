// ReplicaPuller: replica tasks. The master queues a task for every published key a put asked a
// replica of; owners of a target role (remote_cache by default) pull them (ReplicaPoll, re-sent
// under the same poll id until answered: T1) and fetch the keys like any remote get — a flight
// per key through GetFlights, one BatchGetStart, one payload batch per source, one BatchGetDone
// that publishes the copy. A failed fetch is tried again (kAttempts in all, backing off); a
// replica that never comes costs later hits only (S3: the source's eviction never waits for it).
//
// Uses GetFlights (a component below it); nothing uses it. Bounds: replica_task_max_inflight
// flights at most in flight across keys (a key's tasks strictly one after another: one flight per
// key), Limits::replica_retries fetches waiting for another attempt (past it a failure is final).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fluxon/owner/get_flights.hpp"
#include "fluxon/owner/owner_shared.hpp"

namespace fluxon {

class ReplicaPuller {
 public:
  static constexpr Millis kIdlePollMs = 100;  // between polls that found nothing
  static constexpr uint32_t kAttempts = 3;

  ReplicaPuller(OwnerShared& s, GetFlights& gets) : s_(s), gets_(gets) {}

  // `putting(key)`: a local put holds key's plan (the task is skipped: the value is coming).
  void poll(Millis now, Outbox& out, const std::function<bool(const std::string&)>& putting);
  // false: not the poll in flight's answer (a late duplicate), nothing done.
  bool on_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out,
                const std::function<bool(const std::string&)>& putting);
  // Flights that ended: counted, retried or given up; their interest dropped.
  void settle(Millis now, Outbox& out);
  bool owns(uint64_t token) const;
  // What a poll says of this target's admission: with the prefix-depth order and no room left, the
  // deepest depth it keeps (a deeper copy would be its next victim); -1: it admits any.
  int32_t keep_depth() const;
  size_t in_flight() const { return flights_.size(); }
  size_t retries_waiting() const { return retry_.size(); }  // failed fetches waiting to be tried again

 private:
  void send_poll(Millis now, Outbox& out);
  // A task: the key, the page before it in its prefix ("": none) — the copy joins that chain —
  // and its depth there (LocalIndex::kNoDepth: not known).
  struct Task {
    std::string key, parent;
    uint32_t depth = LocalIndex::kNoDepth;
  };
  void start(std::vector<Task> tasks, Millis now, Outbox& out, const std::function<bool(const std::string&)>& putting);

  OwnerShared& s_;
  GetFlights& gets_;
  std::unordered_map<uint64_t, Task> flights_;               // flight -> its task
  std::unordered_map<std::string, uint32_t> attempts_;       // key -> failed attempts so far
  std::deque<std::pair<Millis, Task>> retry_;                // (when, task)
  uint64_t poll_id_ = 0;      // the poll in flight (0: none); re-sent under the same id (T1)
  uint32_t poll_max_ = 0;
  std::vector<uint64_t> poll_tokens_;
  Millis next_poll_ = 0, poll_sent_ = 0;
};

}  // namespace fluxon
