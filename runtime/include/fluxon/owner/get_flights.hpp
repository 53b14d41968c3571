// GetFlights: the owner's read path. get_start splits a batch per key into local pins, joins of a
// flight in the air and flights it leads (G1-G4); one flight per key materialises a remote key
// here and every request that needs it meanwhile shares its terminal state and its one slot (G6,
// G7); the leaders of concurrent batches go to the master in one BatchGetStart (G8, G9) and the
// payload in one batch per peer; the prefix is decided with the tail released at once (G5); a
// handle keeps the prefix until get_transfer or its TTL.
//
// The core runs on one thread: each key is linearised by it, no lock spans a batch, nothing waits
// inside a call (G3, G10). A flight's marker is installed before its BatchGetStart leaves, so an
// overlapping batch joins it instead of starting its own fetch (G2).
//
// What it needs of others comes back as values: room to make for fetched values (before the
// payload goes), routes to remove and entries gone live (GetDone's answer). Bounds: Limits::flights
// (a new remote key is a miss), Limits::pending_gets (decided now, without the master's answer),
// Limits::handles (get_start refused).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <span>
#include <string_view>
#include <vector>

#include "fluxon/owner/owner_shared.hpp"
#include "fluxon/core/retry_table.hpp"

namespace fluxon {

// A get_start's arguments read in place: from the verified message itself (the daemon's and the
// simulation's path: OwnerDriver::on_client_bytes) or from a decoded one.
struct GetStartArgs {
  std::span<const std::string_view> keys;
  std::span<const uint32_t> group_lens;  // atomic_group_lens; empty: every key its own group
  bool prefix_best_effort = true;
  uint32_t max_wait_ms = 0;
};

class GetFlights {
 public:
  enum class Phase : uint8_t { kStarting, kStarted, kFinishing, kReady, kFailed };
  // Fetches claimed this round, and the room that the others wait for.
  struct TransferRound {
    std::vector<RoomNeeded> room;
    std::vector<TransferBatch> batches;
  };
  // What a master answer means elsewhere.
  struct JobSettled {
    bool started = false;                // a BatchGetStart answer: pending gets may be decided now
    bool done = false;                   // a BatchGetDone answer: parked get_transfers may finish
    std::vector<Removals> removals;      // fetched copies a local put replaced meanwhile (one job each)
    std::vector<LiveEntry> live;         // fetched copies now live here
  };

  explicit GetFlights(OwnerShared& s) : s_(s) {}

  // ---- requests (get_requests.cpp) ----
  // true: flights want their payload now (launch a transfer round).
  bool get_start(uint64_t token, uint64_t session, const GetStartArgs& req, Millis now, Outbox& out);
  // Decides the get_starts whose flights left Starting (or, expire, are past their deadline).
  // true: some were decided (launch a transfer round).
  bool serve_pending(Millis now, Outbox& out, bool expire);
  void get_transfer(uint64_t token, uint64_t session, const wire::GetTransferReqT& req, Millis now, Outbox& out);
  void serve_transfers(Millis now, Outbox& out);
  void on_ack(const wire::AckBatchT& ack, uint64_t session, Millis now, Outbox& out);
  void expire_handles(Millis now, Outbox& out);
  void close_session(const Sessions::Session& s, uint64_t session, Millis now, Outbox& out);

  // ---- flights (get_flights.cpp) ----
  // G9: the leaders buffered since the last call, in one BatchGetStart.
  void flush(Millis now, Outbox& out);
  bool to_flush() const { return !start_buffer_.keys.empty(); }
  TransferRound prepare_transfers(Millis now, Outbox& out);
  void send_transfers(TransferRound& round, Outbox& out);
  void on_transfer_done(uint64_t id, const Status& result, Millis now, Outbox& out);
  JobSettled on_job_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out);
  void retry_due(Millis now, Outbox& out);
  void resend_all(Millis now, Outbox& out);
  bool owns(uint64_t token) const { return jobs_.id_of(token).has_value(); }
  bool fetching(const std::string& key) const { return flight_of_.count(key) != 0; }

  // Flights started for others (replica tasks): wanted at once, each key its own cohort, the
  // interest held by the caller until drop_interest(); parents[i] ("": none) is the page before
  // keys[i] in its prefix: the fetched copy joins that chain, at depths[i] (kNoDepth: not known).
  // Returns the flight ids.
  std::vector<uint64_t> start_held(const std::vector<std::string>& keys, const std::vector<std::string>& parents,
                                   const std::vector<uint32_t>& depths, Millis now, Outbox& out);
  // A flight's phase; kFailed once it is gone.
  Phase phase(uint64_t flight_id) const;
  void drop_interest(uint64_t flight_id, Millis now, Outbox& out);

  void fill_stats(OwnerStats& r) const;

 private:
  struct Flight {
    std::string key;
    Phase phase = Phase::kStarting;
    uint32_t interest = 0;      // indices of pending gets and handles that retain the key
    bool wanted = false;        // a decided request retains it: the transfer may start
    bool pinned = false;        // Ready: the flight holds a holder on the slot while interest > 0
    uint64_t batch = 0;         // local identity of the leader batch (the entry's put_id)
    uint32_t group = 0;
    std::string parent;         // the key before it in the leader's prefix read ("": none known)
    uint32_t depth = LocalIndex::kNoDepth;  // its depth in that prefix (a replica task's; else not known)
    bool held = false;          // started for others (start_held: a replica task), not for a reader
    uint32_t source_node = 0;
    uint64_t source_generation = 0, src_offset = 0, len = 0;
    Version ver;
    std::string host;
    uint16_t port = 0;
    std::string grant;          // the master's grant to read the source's range (with the key)
    std::optional<SlotRef> slot;
    Millis since = 0;           // Started at (bounds the wait for a slot)
    std::string error;          // Failed: why
  };
  struct Job {                  // BatchGetStart / BatchGetDone / BatchGetRevoke, retried as is (T1)
    enum class Kind : uint8_t { kStart, kDone, kRevoke } kind;
    std::vector<uint64_t> get_ids;  // flight ids = get ids
    std::vector<std::string> keys;
    std::vector<uint64_t> offsets;  // kDone: the target slots
    Millis next_send = 0;
    std::vector<uint64_t> slot_sizes;  // kDone: their sizes (the backing identity the master keeps)
  };
  // A get_start item: a local pin, a flight interest, or a miss.
  struct Item {
    enum class Kind : uint8_t { kLocal, kFlight, kMiss } kind = Kind::kMiss;
    uint64_t id = 0;            // holding id or flight id
    uint64_t len = 0;           // kLocal
    bool leader = false;        // kFlight: this request created the flight
  };
  struct PendingGet {           // a get_start waiting for its flights to leave Starting
    uint64_t token, session;
    std::optional<std::vector<uint32_t>> groups;
    bool best_effort = true;
    std::vector<Item> items;
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

  void decide(PendingGet& pg, Millis now, Outbox& out);
  bool waits_for_master(const PendingGet& pg) const;  // a flight of pg has not left Starting
  bool try_finish_transfer(uint64_t handle_id, Millis now, Outbox& out);
  void release_item(const Item& item, Millis now, Outbox& out);
  // Releases everything an undelivered handle retains (cancel, TTL, session close).
  void release_handle(uint64_t handle_id, Millis now, Outbox& out);
  void drop_handle(uint64_t handle_id);
  uint64_t new_flight(const std::string& key, uint64_t batch, uint32_t group, bool wanted);
  void fail_flight(uint64_t flight_id, std::string why, bool revoke, Millis now, Outbox& out);
  void erase_flight_if_done(uint64_t flight_id);
  // Removes key's marker only if it is this flight's (a newer flight of the key keeps its own).
  void clear_marker(const std::string& key, uint64_t flight_id);
  // A decided request retains the flight: it may fetch once Started.
  void want(uint64_t flight_id) {
    Flight& f = flights_.at(flight_id);
    f.wanted = true;
    if (f.phase == Phase::kStarted) fetchable_.insert(flight_id);
  }
  void queue_job(Job job, Millis now, Outbox& out);
  void send_job(uint64_t job_id, Job& job, Millis now, Outbox& out);

  OwnerShared& s_;
  // key -> its flight while not terminal
  std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>> flight_of_;
  // get_start's scratch (kept: no allocation per call): each key's entry and hash.
  std::vector<const LocalIndex::Node*> lookup_;
  std::vector<uint64_t> lookup_hashes_;
  std::vector<const std::string*> touched_;  // the live hits' keys, touched once the batch is split
  std::vector<uint64_t> touched_hashes_;
  std::map<uint64_t, Flight> flights_;                   // flight id (= get id) -> flight
  std::set<uint64_t> fetchable_;                         // Started and wanted: a transfer may start
  RetryTable<Job> jobs_;
  Job start_buffer_{Job::Kind::kStart, {}, {}, {}, 0};  // leaders not yet sent (G9)
  std::map<uint64_t, PendingGet> pending_gets_;
  std::set<std::pair<Millis, uint64_t>> pending_deadlines_;  // (deadline, pending get)
  std::unordered_map<uint64_t, Handle> handles_;
  std::set<std::pair<Millis, uint64_t>> handle_ttl_;     // (deadline, handle): the TTL without a scan
  std::unordered_set<uint64_t> waiting_handles_;         // handles with a parked get_transfer
  std::map<uint64_t, std::vector<uint64_t>> transfers_;  // transfer batch -> flights
  uint64_t next_handle_ = 1, next_job_ = 1, next_flight_ = 1, next_pending_get_ = 1, next_transfer_ = 1;
};

}  // namespace fluxon
