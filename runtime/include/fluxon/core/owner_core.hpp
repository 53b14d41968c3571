// OwnerCore: the owner's whole control logic as a plain state machine (STYLE.md). It takes client
// requests, client notes, master replies and clock ticks, and emits replies, notes and master
// requests into an outbox. No I/O, no threads, no clock of its own: the CAF owner actor and the
// deterministic simulator drive the same code.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/config.hpp"
#include "fluxon/runtime/reserve_pool.hpp"
#include "fluxon/runtime/weighted_cache.hpp"

namespace fluxon {

using Millis = int64_t;

struct OwnerOut {
  enum class Kind : uint8_t {
    kReply,   // reply to client request `token` of `session`
    kNote,    // one-way note to `session`
    kMaster,  // request `token` to the master
  };
  Kind kind;
  uint64_t session = 0;
  uint64_t token = 0;
  Envelope env;
};
using Outbox = std::vector<OwnerOut>;

// Counters the owner exports (Prometheus and stats()).
struct OwnerCounters {
  uint64_t put_start_total = 0, put_commit_total = 0, put_abort_total = 0, put_live_total = 0;
  uint64_t put_keys_total = 0, put_conflict_total = 0, put_nospace_total = 0;
  uint64_t reserve_waits_total = 0, reserve_soft_wait_total = 0, reserve_timeout_total = 0;
  uint64_t get_start_total = 0, get_keys_total = 0, get_hit_keys_total = 0;
  uint64_t get_tail_released_total = 0, handle_ttl_expired_total = 0, handle_cancel_total = 0;
  uint64_t publish_retry_total = 0, publish_exists_total = 0, route_remove_total = 0, master_failures_total = 0;
  uint64_t resync_routes_total = 0, evicted_keys_total = 0, evicted_bytes_total = 0, eviction_rounds_total = 0;
  uint64_t errors_total = 0, malformed_total = 0, generation_mismatch_total = 0;
};

class OwnerCore {
 public:
  OwnerCore(OwnerConfig cfg, uint64_t generation, std::string segment_name, uint64_t segment_len);

  uint32_t node_id() const { return cfg_.node_id; }
  uint64_t generation() const { return generation_; }

  // A registration request for the master; the actor sends it at start and after reconnects.
  Envelope register_request() const;

  void on_client_request(uint64_t token, Envelope& req, Millis now, Outbox& out);
  void on_client_note(Envelope& note, Millis now, Outbox& out);
  void on_master_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out);
  // The request `token` failed in transport (timeout, disconnect): nothing is freed on a guess (T1);
  // the job is retried from tick() with the same identity.
  void on_master_failure(uint64_t token);
  void tick(Millis now, Outbox& out);
  void close_session(uint64_t session, Outbox& out);
  // The master is reachable again (reconnected; maybe restarted with no state): register, re-publish
  // every live route with its original identity (T1: a master that kept them answers Live), and
  // re-send the jobs in flight now.
  void on_master_reconnected(Millis now, Outbox& out);

  wire::StatsReplyT stats() const;
  const OwnerCounters& counters() const { return counters_; }
  const ReservePool& pool() const { return pool_; }
  // (offset, len) of grants carved since the last call.
  std::vector<std::pair<uint64_t, uint64_t>> take_new_grant_ranges();
  // Local visibility of a key (tests): 0 = absent, 1 = pending local visible, 2 = route live.
  int local_state(const std::string& key) const;
  // Drop the route and local entry of key (eviction uses this path later): route first, then S2.
  void remove_key(const std::string& key, Millis now, Outbox& out);

 private:
  struct Entry {                // local visible index
    uint64_t put_id = 0;
    SlotRef slot;
    uint64_t len = 0;
    bool live = false;          // Committed(route_live)
    uint32_t group = 0;         // atomic group inside its put batch: (put_id, group) is the cohort
  };
  struct ResidentRef {          // resident index value: the entry's identity
    uint64_t put_id = 0;
    uint32_t group = 0;
  };
  using CohortId = std::pair<uint64_t, uint32_t>;
  struct PutPlan {
    uint64_t session = 0;
    std::vector<std::string> keys;
    std::vector<SlotRef> slots;
    uint64_t value_len = 0;
    std::vector<uint32_t> group_lens;
    bool committed = false;
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
    std::vector<uint64_t> tokens;  // every attempt's token; any reply settles the job
    Millis next_send = 0;
    bool resync = false;           // re-publishes live routes after the master came back
  };
  struct RemoveJob {            // route-first release of superseded or removed entries
    std::vector<std::string> keys;
    std::vector<uint64_t> put_ids;
    std::vector<SlotRef> slots;
    std::vector<uint64_t> tokens;
    Millis next_send = 0;
  };
  struct Handle {
    uint64_t session;
    std::vector<uint64_t> holdings;
    Millis deadline;
  };
  struct Holding { SlotRef slot; uint64_t session; };
  struct Session {
    std::unordered_set<uint64_t> plans, handles, holdings;
  };

  void dispatch_client(uint64_t token, Envelope& req, Millis now, Outbox& out);
  void reply(OwnerOut::Kind k, uint64_t session, uint64_t token, Envelope env, Outbox& out);
  void reply_error(uint64_t session, uint64_t token, const Status& s, Outbox& out);
  // Returns true when the request was answered (success or error), false when it must wait.
  bool try_put_start(uint64_t token, uint64_t session, wire::PutStartReqT& req, Outbox& out);
  void put_commit(uint64_t token, uint64_t session, uint64_t put_id, Millis now, Outbox& out);
  void put_abort(uint64_t token, uint64_t session, uint64_t put_id, Outbox& out);
  void get_start(uint64_t token, uint64_t session, wire::GetStartReqT& req, Millis now, Outbox& out);
  void release_holding(uint64_t holding_id, uint64_t session);
  void drop_handle(uint64_t handle_id);
  void send_publish(uint64_t put_id, PublishJob& job, Millis now, Outbox& out);
  void send_remove(uint64_t job_id, RemoveJob& job, Millis now, Outbox& out);
  void supersede(const std::string& key, Entry old, Millis now, Outbox& out);
  void queue_remove(std::vector<std::string> keys, std::vector<uint64_t> put_ids,
                    std::vector<SlotRef> slots, Millis now, Outbox& out);
  void serve_waiters(Outbox& out);
  // Capacity eviction (S1, S3, S4): select cold unheld cohorts worth `bytes`, preferring slots of
  // `slot_size`, and remove them route first; bytes already on their way count (selection debt).
  void evict_for(uint64_t slot_size, uint64_t bytes, Millis now, Outbox& out);
  void evict_cohort(CohortId cohort, Millis now, Outbox& out);
  void evict_one_cohort(CohortId cohort, Millis now, Outbox& out);
  // Every way out of the local index goes through here: resident index and cohort bookkeeping.
  void erase_entry(std::unordered_map<std::string, Entry>::iterator it);
  // A slot left its route: if eviction chose it, its bytes are no longer a debt.
  void settle_evicting(SlotRef slot);
  void settle_resync(uint64_t put_id, PublishJob& job, const wire::PutDoneReplyT& reply, Millis now, Outbox& out);

  OwnerConfig cfg_;
  uint64_t generation_;
  std::string segment_name_;
  uint64_t segment_len_;
  ReservePool pool_;
  OwnerCounters counters_;

  std::unordered_map<std::string, Entry> index_;
  // Live entries, weighted by slot size, ordered by W-TinyLFU: eviction's candidate order. Unbounded
  // (capacity is the segment's; only evict_some_if removes), no listener thread (the core owns none).
  WeightedCache<std::string, ResidentRef> resident_;
  std::map<CohortId, std::vector<std::string>> cohorts_;
  std::unordered_map<uint64_t, uint64_t> evicting_slots_;  // packed slot -> bytes selected for eviction
  uint64_t evicting_bytes_ = 0;
  std::unordered_map<std::string, uint64_t> inflight_;   // key -> put_id of the open plan
  std::unordered_map<uint64_t, PutPlan> plans_;
  std::deque<Waiter> waiters_;                           // FIFO claim turn
  std::map<uint64_t, PublishJob> publish_;               // put_id -> job
  std::map<uint64_t, RemoveJob> removes_;
  std::unordered_map<uint64_t, std::pair<bool, uint64_t>> master_tokens_;  // token -> (is_publish, id)
  std::unordered_map<uint64_t, Handle> handles_;
  std::unordered_map<uint64_t, Holding> holdings_;
  std::unordered_map<uint64_t, Session> sessions_;

  uint64_t next_put_id_ = 1, next_handle_ = 1, next_holding_ = 1, next_session_ = 1;
  uint64_t next_master_token_ = 1, next_remove_job_ = 1;
  uint64_t live_routes_ = 0;
  Millis now_ = 0;  // the clock of the current call (set by every entry point that is given one)
};

}  // namespace fluxon
