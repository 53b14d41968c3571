// OwnerCore: the owner's whole control logic as a plain state machine (STYLE.md). It takes client
// requests, client notes, master replies and clock ticks, and emits replies, notes and master
// requests into an outbox. No I/O, no threads, no clock of its own: the CAF owner actor and the
// deterministic simulator drive the same code.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fluxon/core/eviction.hpp"
#include "fluxon/core/local_index.hpp"
#include "fluxon/core/master_core.hpp"
#include "fluxon/core/retry_table.hpp"
#include "fluxon/core/sessions.hpp"
#include "fluxon/core/owner_counters.hpp"
#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/config.hpp"
#include "fluxon/runtime/reserve_pool.hpp"
#include "fluxon/runtime/weighted_cache.hpp"

namespace fluxon {

// One data-plane fetch: byte ranges of one peer's segment, read into this owner's segment. The
// control plane is batched per leader batch (G8); the payload is batched per peer too.
struct TransferItem {
  uint64_t src_offset = 0, len = 0, dst_offset = 0;
};
struct TransferBatch {
  uint64_t id = 0;
  uint32_t source_node = 0;
  uint64_t source_generation = 0;
  std::string host;
  uint16_t port = 0;
  std::vector<TransferItem> items;
};

struct OwnerOut {
  enum class Kind : uint8_t {
    kReply,     // reply to client request `token` of `session`
    kNote,      // one-way note to `session`
    kMaster,    // request `token` to the master
    kTransfer,  // fetch `transfer` over the data plane, then call on_transfer_done(transfer.id)
  };
  Kind kind;
  uint64_t session = 0;
  uint64_t token = 0;
  Envelope env;
  TransferBatch transfer;
};
using Outbox = std::vector<OwnerOut>;

// Counters the owner exports (Prometheus and stats()): fluxon/core/owner_counters.hpp.

class OwnerCore {
 public:
  OwnerCore(OwnerConfig cfg, uint64_t generation, std::string segment_name, uint64_t segment_len);

  uint32_t node_id() const { return cfg_.node_id; }
  uint64_t generation() const { return generation_; }

  // Registers with the master (at start; on_master_reconnected does it again after reconnects).
  void start(Millis now, Outbox& out);

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
  // G9: leaders of the get_starts handled since the last call go to the master in one BatchGetStart.
  // The driver calls it once no older request waits (and tick() does, as a floor).
  void flush_gets(Millis now, Outbox& out);
  bool gets_to_flush() const { return !start_buffer_.keys.empty(); }
  // The data plane finished TransferBatch `id` (ok or not).
  void on_transfer_done(uint64_t id, const Status& result, Millis now, Outbox& out);
  // Where peers fetch this owner's bytes; sent with every registration.
  void set_data_address(std::string host, uint16_t port) { data_host_ = std::move(host), data_port_ = port; }

  wire::StatsReplyT stats() const;
  const OwnerCounters& counters() const { return counters_; }
  const ReservePool& pool() const { return pool_; }
  // (offset, len) of grants carved since the last call.
  std::vector<std::pair<uint64_t, uint64_t>> take_new_grant_ranges();
  // Local visibility of a key (tests): 0 = absent, 1 = pending local visible, 2 = route live.
  int local_state(const std::string& key) const;
  // Drop the route and local entry of key (eviction uses this path later): route first, then S2.
  void remove_key(const std::string& key, Millis now, Outbox& out);
  // Owner-hot write-back jobs not finished yet (a gauge), and the hot tier's bytes.
  size_t writebacks_pending() const { return writebacks_.size(); }
  uint64_t eviction_debt_bytes() const { return eviction_.debt_bytes(); }
  uint64_t hot_bytes() const { return local_.hot() ? local_.hot()->weighted_size() : 0; }
  bool in_hot_tier(const std::string& key) const { return local_.hot() && local_.hot()->contains(key); }

 private:
  using Entry = LocalIndex::Entry;
  using ResidentRef = LocalIndex::ResidentRef;
  using CohortId = LocalIndex::CohortId;
  struct PutPlan {
    uint64_t session = 0;
    std::vector<std::string> keys;
    std::vector<SlotRef> slots;
    uint64_t value_len = 0;
    std::vector<uint32_t> group_lens;
    std::vector<bool> replica;  // per key: !write_through && make_replica_task && mask[i]
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
    std::vector<Version> origins;  // resync of fetched replicas: each item's version (else this put)
    std::vector<bool> replica;     // first publication: the items that get a replica task
    Millis next_send = 0;
    bool resync = false;           // re-publishes live routes after the master came back
  };
  struct RemoveJob {            // route-first release of superseded or removed entries
    std::vector<std::string> keys;
    std::vector<Version> versions;
    std::vector<SlotRef> slots;
    std::vector<uint64_t> instances;  // the copies' local identities (Entry::put_id)
    Millis next_send = 0;
  };
  // Per-key shared get (G6, G7): one flight per key materialises it from a remote owner; every
  // request that needs the key while it flies joins it and sees the same terminal state and slot.
  enum class Phase : uint8_t { kStarting, kStarted, kFinishing, kReady, kFailed };
  struct Flight {
    std::string key;
    Phase phase = Phase::kStarting;
    uint32_t interest = 0;      // indices of pending gets and handles that retain the key
    bool wanted = false;        // a decided request retains it: the transfer may start
    bool pinned = false;        // Ready: the flight holds a holder on the slot while interest > 0
    uint64_t batch = 0;         // local identity of the leader batch (the entry's put_id)
    uint32_t group = 0;
    uint32_t source_node = 0;
    uint64_t source_generation = 0, src_offset = 0, len = 0;
    Version ver;
    std::string host;
    uint16_t port = 0;
    std::optional<SlotRef> slot;
    Millis since = 0;           // Started at (bounds the wait for a slot)
    std::string error;          // Failed: why
  };
  struct GetJob {               // BatchGetStart / BatchGetDone / BatchGetRevoke, retried as is (T1)
    enum class Kind : uint8_t { kStart, kDone, kRevoke } kind;
    std::vector<uint64_t> get_ids;  // flight ids = get ids
    std::vector<std::string> keys;
    std::vector<uint64_t> offsets;  // kDone: the target slots
    Millis next_send = 0;
  };
  // A get_start item: a local pin, a flight interest, or a miss.
  struct GetItem {
    enum class Kind : uint8_t { kLocal, kFlight, kMiss } kind = Kind::kMiss;
    uint64_t id = 0;            // holding id or flight id
    uint64_t len = 0;           // kLocal
    bool leader = false;        // kFlight: this request created the flight
  };
  struct PendingGet {           // a get_start waiting for its flights to leave Starting
    uint64_t token, session;
    std::optional<std::vector<uint32_t>> groups;
    bool best_effort = true;
    std::vector<GetItem> items;
    Millis deadline;
  };
  struct Handle {
    uint64_t session;
    std::vector<uint64_t> holdings;  // inline: exported with the reply; owner_rpc: kept per index (0: flight)
    Millis deadline;
    bool owner_rpc = false;
    std::vector<uint64_t> flights;   // owner_rpc: per index, the flight it retains (0: local)
    std::vector<uint64_t> lens;      // owner_rpc: per index (local items)
    std::optional<std::vector<uint32_t>> groups;
    uint32_t transferable_len = 0;
    uint64_t waiting_token = 0;      // get_transfer parked until its flights are terminal
    Millis transfer_deadline = 0;
  };
  using Session = Sessions::Session;

  void dispatch_client(uint64_t token, Envelope& req, Millis now, Outbox& out);
  void reply(OwnerOut::Kind k, uint64_t session, uint64_t token, Envelope env, Outbox& out);
  void reply_error(uint64_t session, uint64_t token, const Status& s, Outbox& out);
  // Returns true when the request was answered (success or error), false when it must wait.
  bool try_put_start(uint64_t token, uint64_t session, wire::PutStartReqT& req, Outbox& out);
  void put_commit(uint64_t token, uint64_t session, uint64_t put_id, Millis now, Outbox& out);
  void put_abort(uint64_t token, uint64_t session, uint64_t put_id, Outbox& out);
  void get_start(uint64_t token, uint64_t session, wire::GetStartReqT& req, Millis now, Outbox& out);
  // Questions that change nothing (owner_query.cpp).
  struct ExistsJob {
    uint64_t session = 0, token = 0;
    std::optional<std::vector<uint32_t>> groups;
    uint32_t n = 0;                  // keys asked
    uint64_t expected_len = 0;
    uint32_t local = 0;              // leading keys found in the local index
    std::vector<std::string> rest;   // asked of the master
    Millis deadline = 0;
  };
  void exists(uint64_t token, uint64_t session, wire::ExistsReqT& req, Millis now, Outbox& out);
  void answer_exists(const ExistsJob& job, uint32_t remote, bool master_answered, Outbox& out);
  void on_exists_reply(uint64_t token, Envelope& reply, Outbox& out);
  // Answers, with their local prefix, the questions past their deadline (a failed master request
  // sets it to 0).
  void expire_exists(Millis now, Outbox& out);
  void remove_prefix(uint64_t token, uint64_t session, const wire::RemovePrefixReqT& req, Millis now, Outbox& out);
  std::map<uint64_t, ExistsJob> exists_jobs_;  // by master token
  // Remote gets (owner_get.cpp).
  void decide_get(PendingGet& pg, Millis now, Outbox& out);
  void serve_pending_gets(Millis now, Outbox& out, bool expire);
  bool waits_for_master(const PendingGet& pg) const;  // a flight of pg has not left Starting
  void get_transfer(uint64_t token, uint64_t session, const wire::GetTransferReqT& req, Millis now, Outbox& out);
  void serve_transfers(Millis now, Outbox& out);
  bool try_finish_transfer(uint64_t handle_id, Millis now, Outbox& out);
  void release_item(const GetItem& item, Millis now, Outbox& out);
  void drop_interest(uint64_t flight_id, Millis now, Outbox& out);
  void fail_flight(uint64_t flight_id, std::string why, bool revoke, Millis now, Outbox& out);
  void erase_flight_if_done(uint64_t flight_id);
  // Removes key's marker only if it is this flight's (a newer flight of the key keeps its own).
  void clear_marker(const std::string& key, uint64_t flight_id);
  void launch_transfers(Millis now, Outbox& out);
  void send_get_job(uint64_t job_id, GetJob& job, Millis now, Outbox& out);
  uint64_t queue_get_job(GetJob job, Millis now, Outbox& out);
  void on_get_job_reply(uint64_t job_id, Envelope& reply, Millis now, Outbox& out);
  // Releases everything an undelivered handle retains (cancel, TTL, session close).
  void release_handle(uint64_t handle_id, Millis now, Outbox& out);
  void release_holding(uint64_t holding_id, uint64_t session);
  void drop_handle(uint64_t handle_id);
  void send_publish(uint64_t put_id, PublishJob& job, Millis now, Outbox& out);
  void send_remove(uint64_t job_id, RemoveJob& job, Millis now, Outbox& out);
  void supersede(const std::string& key, Entry old, Millis now, Outbox& out);
  void queue_remove(std::vector<std::string> keys, std::vector<Version> versions, std::vector<SlotRef> slots,
                    std::vector<uint64_t> instances, Millis now, Outbox& out);
  void serve_waiters(Outbox& out);
  // Capacity eviction (S1, S3, S4): select cold unheld cohorts worth `bytes`, preferring slots of
  // `slot_size`, and remove them route first; bytes already on their way count (selection debt).
  void evict_for(uint64_t slot_size, uint64_t bytes, Millis now, Outbox& out);
  // Pressure (from tick): keep eviction_free_watermark of each class's slots free ahead of claims.
  void keep_free(Millis now, Outbox& out);
  void evict_cohort(CohortId cohort, Millis now, Outbox& out);
  void evict_one_cohort(CohortId cohort, Millis now, Outbox& out);
  // A slot left its route: if eviction chose it, its bytes are no longer a debt.
  void settle_evicting(SlotRef slot);
  void settle_resync(uint64_t put_id, PublishJob& job, const wire::PutDoneReplyT& reply, Millis now, Outbox& out);

  OwnerConfig cfg_;
  uint64_t generation_;
  std::string segment_name_;
  uint64_t segment_len_;
  ReservePool pool_;
  OwnerCounters counters_;

  LocalIndex local_;  // entries, cohorts, resident and hot tiers
  Eviction eviction_;  // victim selection and the selection debt (S4)
  std::unordered_map<std::string, uint64_t> inflight_;   // key -> put_id of the open plan
  std::unordered_map<uint64_t, PutPlan> plans_;
  std::deque<Waiter> waiters_;                           // FIFO claim turn
  RetryTable<PublishJob> publish_;                       // put_id -> job
  RetryTable<RemoveJob> removes_;
  // A master request's token says which kind of job it belongs to (its low 4 bits); the reply goes
  // to that kind's handler, which finds the job by the token in its own table.
  enum class JobKind : uint8_t { kPublish, kRemove, kGet, kReplicaPoll, kRegister, kProxy, kDemote, kWriteBackBatch, kExists };
  uint64_t new_token(JobKind k) { return (next_master_token_++ << 4) | uint64_t(k); }
  static JobKind kind_of(uint64_t token) { return JobKind(token & 0xF); }
  bool known_token(uint64_t token) const;
  void on_publish_reply(uint64_t put_id, Envelope& reply, Millis now, Outbox& out);
  void on_remove_reply(uint64_t job_id, Envelope& reply, Millis now, Outbox& out);
  // Client requests forwarded to the master (MasterStatsReq): master token -> (session, client token).
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> proxied_;
  Envelope register_request() const;
  bool replica_target_ = false;  // the master hands this owner replica tasks (its role is a target)
  uint64_t register_token_ = 0;  // registration not answered yet: re-sent from tick()
  Millis register_sent_ = 0;
  std::unordered_map<std::string, uint64_t> flight_of_;  // key -> its flight while not terminal
  std::map<uint64_t, Flight> flights_;                   // flight id (= get id) -> flight
  RetryTable<GetJob> get_jobs_;
  GetJob start_buffer_{GetJob::Kind::kStart, {}, {}, {}, 0};  // leaders not yet sent (G9)
  std::map<uint64_t, PendingGet> pending_gets_;
  std::unordered_set<uint64_t> waiting_handles_;         // handles with a parked get_transfer
  std::map<uint64_t, std::vector<uint64_t>> transfers_;  // transfer batch -> flights
  std::string data_host_;
  uint16_t data_port_ = 0;
  // The only owner of its cluster (known from the cluster config, never stale): a key missing here
  // is missing everywhere, so get_start does not ask the master about it.
  bool alone() const { return cfg_.alone_in_cluster; }
  // Replica tasks this owner pulls from the master (owners of a target role get some) and runs as
  // flights of their own; the flight's interest is held until it is terminal.
  std::unordered_map<uint64_t, std::string> replica_flights_;  // flight -> key
  // A replica whose fetch failed is tried again (kReplicaAttempts in all, backing off): the master
  // handed the task over once; only this owner can still make the copy.
  static constexpr uint32_t kReplicaAttempts = 3;
  std::unordered_map<std::string, uint32_t> replica_attempts_;       // key -> failed attempts so far
  std::deque<std::pair<Millis, std::string>> replica_retry_;         // (when, key)
  void start_replica_flights(const std::vector<std::string>& keys, Millis now, Outbox& out);
  uint64_t replica_poll_id_ = 0;      // the poll in flight (0: none); re-sent under the same id (T1)
  uint32_t replica_poll_max_ = 0;
  std::vector<uint64_t> replica_poll_tokens_;
  Millis next_replica_poll_ = 0, replica_poll_sent_ = 0;
  void send_replica_poll(Millis now, Outbox& out);
  void poll_replica_tasks(Millis now, Outbox& out);
  void on_replica_tasks(const wire::ReplicaPollReplyT& rep, Millis now, Outbox& out);
  void settle_replica_flights(Millis now, Outbox& out);
  // Owner-hot write-back (owner_writeback.cpp). Live entries also sit in the hot tier (capacity
  // enforced: hot_writeback_ratio of the segment); each key it evicts starts a job for its exact
  // cohort (the atomic group, with the other TP ranks' groups): WriteBack, re-sent until a
  // target-role owner holds every key of it, then (writeback_demote) one Demote for all of them.
  struct WriteBackJob {
    std::vector<CohortId> cohorts;
    std::vector<std::string> keys;
    std::vector<Version> versions;
    std::vector<uint64_t> put_ids;
    bool demoting = false;         // every key is backed: the Demote request is out
    Millis next_send = 0, deadline = 0;  // (Demote attempts: writebacks_; WriteBack ones: writeback_batches_)
  };
  RetryTable<WriteBackJob> writebacks_;
  std::map<CohortId, uint64_t> writeback_of_;  // cohort -> the job that carries it
  uint64_t next_writeback_ = 1;
  // The first phase of many jobs travels in one WriteBack (G8's batching for write-back): a batch
  // remembers its jobs in order, and its reply is split among those still waiting for it.
  struct WriteBackBatch {
    std::vector<std::pair<uint64_t, size_t>> jobs;  // (job, its keys in the request)
    Millis expires = 0;  // no reply by then: forgotten (its jobs are sent again in a new batch)
  };
  std::map<uint64_t, WriteBackBatch> writeback_batches_;  // by master token
  void send_writeback_batch(const std::vector<uint64_t>& jobs, Millis now, Outbox& out);
  void on_writeback_batch_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out);
  void settle_writeback(uint64_t id, const wire::WriteBackStatus* status, Millis now, Outbox& out);
  // A live entry enters the resident index at once and is queued for the hot tier; admit_hot then
  // admits what went live in one reply together and writes back what the hot tier evicts.
  struct HotItem {
    std::string key;
    ResidentRef ref;
    uint64_t weight;
  };
  using HotBatch = std::vector<HotItem>;
  void index_live(const std::string& key, ResidentRef ref, uint64_t weight, HotBatch& hot);
  void admit_hot(const HotBatch& batch, Millis now, Outbox& out);
  void write_back(const std::vector<std::pair<std::string, ResidentRef>>& evicted, Millis now, Outbox& out);
  void send_demote(uint64_t id, WriteBackJob& job, Millis now, Outbox& out);
  void on_demote_reply(uint64_t id, Envelope& reply, Millis now, Outbox& out);
  void end_writeback(uint64_t id);
  void retry_writebacks(Millis now, Outbox& out);
  std::unordered_map<uint64_t, Handle> handles_;
  std::set<std::pair<Millis, uint64_t>> handle_ttl_;  // (deadline, handle): the TTL without a scan
  Sessions sessions_;  // clients, their plans, handles and holdings

  uint64_t next_put_id_ = 1, next_handle_ = 1;
  uint64_t next_master_token_ = 1, next_remove_job_ = 1, next_get_job_ = 1, next_flight_ = 1;
  uint64_t next_pending_get_ = 1, next_transfer_ = 1;
  uint64_t live_routes_ = 0;
  Millis now_ = 0;  // the clock of the current call (set by every entry point that is given one)
};

}  // namespace fluxon
