// PutPath: put_start to PutLive. Claims slots for a batch's keys (FIFO claim turn behind earlier
// waiters, soft wait noted, hard timeout named by stage), holds the plan and its keys' inflight
// markers, commits the plan local-read-ready at once (V1), and owns the batch's publish job until
// every item is terminal (A2), re-sent with the same identity until the master answers (T1). After
// a master restart it re-publishes every live route under its original identity (resync).
//
// Bounds: Limits::claim_waiters (a put_start past it is refused, stage claim_turn) and
// Limits::publish_jobs (a put_start is refused while that many batches wait for the master).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fluxon/owner/owner_shared.hpp"
#include "fluxon/owner/replica_budget.hpp"
#include "fluxon/core/retry_table.hpp"

namespace fluxon {

class PutPath {
 public:
  using Entry = LocalIndex::Entry;
  // What a publish answer means elsewhere: routes to remove (one job), entries that went live,
  // slots no route references any more.
  // A write-through put whose routes went live: its future completes once a target-role owner
  // holds every key (WriteBack), not now.
  struct WriteThrough {
    uint64_t put_id = 0, session = 0;
    std::vector<LocalIndex::CohortId> cohorts;
    std::vector<std::string> keys;
    std::vector<Version> versions;
  };
  struct Settled {
    Removals removals;
    std::vector<LiveEntry> live;
    std::vector<SlotRef> unrouted;
    std::optional<WriteThrough> write_through;
  };

  explicit PutPath(OwnerShared& s) : s_(s) {}

  // put_start: answered now, or queued in the claim turn; room to make when the pool had no slot.
  // `fetching(key)`: a remote get is bringing key here (reject_if_inflight_same_key).
  std::optional<RoomNeeded> start(uint64_t token, uint64_t session, Envelope& req, Millis now, Outbox& out,
                                  const std::function<bool(const std::string&)>& fetching);
  // Serves the claim turn while slots are free; room to make for the head when they ran out.
  std::optional<RoomNeeded> serve_waiters(Outbox& out, const std::function<bool(const std::string&)>& fetching);
  // The head waiter's need (tick keeps eviction going for it), if any waits.
  std::optional<RoomNeeded> head_need() const;
  // Soft waits noted, hard timeouts answered.
  void expire_waiters(Millis now, Outbox& out);
  // The eviction pressure the replica budget follows, in [0, 1].
  double replica_pressure() const { return budget_.pressure(); }

  // put_commit: the plan's slots are local-read-ready (V1) and its entries in the index. Returns
  // the routes of the entries it replaced that must go (one RemoveRoutes job); publish() then sends the
  // batch's PutDone. 0 when the plan is unknown (answered with the error).
  struct Committed {
    uint64_t put_id = 0;
    Removals removals;
  };
  Committed commit(uint64_t token, uint64_t session, uint64_t put_id, Millis now, Outbox& out);
  void publish(uint64_t put_id, Millis now, Outbox& out);
  void abort(uint64_t token, uint64_t session, uint64_t put_id, Outbox& out);

  // A newer local version (or a removal) replaced `old`: its route must go first (the Removal),
  // or its publish job settles it when the master answers (nothing now).
  std::optional<Removal> supersede(const std::string& key, const Entry& old);
  // A re-publication of put_id's routes is in flight.
  bool resyncing(uint64_t put_id) const;
  bool in_flight(const std::string& key) const { return inflight_.count(key) != 0; }

  // One Settled per job the answer settles (a message may carry several, PutDone.more).
  std::vector<Settled> on_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out);
  // A publish request failed (timeout, link down): it no longer counts as on its way.
  void master_failed(uint64_t token) { flights_.erase(token); }
  // Publication is coalesced: at most kWindow PutDone messages of first publications are on their
  // way; batches committed meanwhile wait (each under its own retry timer, so none waits longer
  // than a retry would) and go out together, one message, when an answer comes back. A lone put
  // goes at once; a stream of puts costs the master one message per round trip, not one per put.
  static constexpr size_t kWindow = 2, kMessageJobs = 64, kMessageKeys = 4096;
  // The master came back: every live route again with its identity, then the jobs in flight.
  void resync(Millis now, Outbox& out);
  void retry_due(Millis now, Outbox& out);
  void close_session(const Sessions::Session& s, uint64_t session);
  bool owns(uint64_t token) const { return publish_.id_of(token).has_value(); }

  size_t plans() const { return plans_.size(); }
  // The pages that waiting claims and open plans name as parents (radix_parent_keys): their
  // children are on their way, so capacity eviction must not take them as leaves (it would orphan
  // the pages being written).
  std::unordered_set<std::string> continued() const;
  size_t publish_jobs() const { return publish_.size(); }

 private:
  struct Plan {
    uint64_t session = 0;
    std::vector<std::string> keys;
    std::vector<SlotRef> slots;
    uint64_t value_len = 0;
    std::vector<uint32_t> group_lens;
    std::vector<bool> replica;  // per key: !write_through && make_replica_task && mask[i]
    std::vector<std::string> parents;  // per key ("": a root), or empty: radix_parent_keys
    std::vector<uint32_t> depths;      // per key, or empty: content_depths
    bool write_through = false;        // the future waits for the remote copy (a target-role owner)
  };
  struct Waiter {
    uint64_t token, session;
    std::unique_ptr<Envelope> req;
    Millis since;
    bool soft_noted = false;
  };
  struct PublishJob {           // A2: owns one put batch until every item is terminal
    uint64_t session = 0;
    std::vector<std::string> keys;
    std::vector<SlotRef> slots;
    std::vector<bool> superseded;  // a newer local version replaced the item before it went live
    std::vector<uint64_t> offsets, lens;
    std::vector<uint32_t> group_lens;
    std::vector<uint32_t> groups;  // each item's atomic group (its cohort at the master)
    std::vector<Version> origins;  // resync of fetched replicas: each item's version (else this put)
    std::vector<bool> replica;     // first publication: the items that get a replica task
    Millis next_send = 0;
    bool resync = false;           // re-publishes live routes after the master came back
    bool write_through = false;    // the future completes when a target-role owner holds every key
  };
  // Returns true when the request was answered (success or error), false when it must wait.
  bool try_start(uint64_t token, uint64_t session, wire::PutStartReqT& req, Outbox& out,
                 const std::function<bool(const std::string&)>& fetching, std::optional<RoomNeeded>& need);
  // The jobs' PutDone in one message (the first, `more` the rest), one token for all; `first`: a
  // first publication, which holds the window until answered (re-sends do not).
  void send(const std::vector<uint64_t>& ids, bool first, Millis now, Outbox& out);
  std::unique_ptr<wire::PutDoneT> put_done_of(uint64_t put_id, const PublishJob& job) const;
  void flush_ready(Millis now, Outbox& out);
  // One job's answer; false when it settles nothing (unknown, another message's, malformed).
  bool settle(uint64_t token, const wire::PutDoneReplyT* pr, Settled& settled, Outbox& out);
  void settle_resync(uint64_t put_id, PublishJob& job, const wire::PutDoneReplyT& reply, Settled& settled);
  void drop_plan(uint64_t put_id);
  // kv_score_pressure_budget: the plan's replica candidates cut to the budget (ReplicaBudget).
  void apply_replica_budget(const ReplicaBudgetArgs& budget, const std::vector<uint32_t>& group_lens,
                            std::vector<bool>& replica);

  OwnerShared& s_;
  std::unordered_map<std::string, uint64_t> inflight_;  // key -> put_id of the open plan
  std::unordered_map<uint64_t, Plan> plans_;
  std::deque<Waiter> waiters_;                          // FIFO claim turn
  RetryTable<PublishJob> publish_;                      // put_id -> job
  std::vector<uint64_t> ready_;                         // committed, waiting for the window (put_ids)
  std::map<uint64_t, Millis> flights_;                  // first-publication messages on their way: token -> sent
  ReplicaBudget budget_;                                // kv_score_pressure_budget's decisions
};

}  // namespace fluxon
