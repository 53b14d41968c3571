// OwnerCore: the owner's control logic as a plain state machine (STYLE.md), a router over its
// components. It takes client requests, client notes, master replies, data-plane completions and
// clock ticks, hands each to the component that owns it, and passes what one component's step
// means for another on to that one, in order. No I/O, no threads, no clock of its own: the CAF
// owner actor and the deterministic simulator drive it through the same OwnerDriver.
//
//   component        owns                                             file
//   LocalIndex       entries, cohorts, resident and hot tiers         local_index
//   Sessions         clients, their plans, handles and holdings       sessions
//   PutPath          plans, claim turn, publish jobs, resync          put_path
//   RouteRemoval     route-first removals of replaced versions (S2)   route_removal
//   Eviction         victim cohorts (S1, S3)                          eviction
//   Reclaim          each eviction's fenced transaction, the debt (S4) reclaim
//   GetFlights       get_start, flights, get jobs, handles (G1-G10)   get_flights, get_requests
//   ReplicaPuller    replica tasks (uses GetFlights)                  replica_puller
//   WriteBack        owner-hot write-back and demotion                writeback
//   Exists           exists_prefix questions                          exists
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fluxon/owner/eviction.hpp"
#include "fluxon/owner/exists.hpp"
#include "fluxon/owner/get_flights.hpp"
#include "fluxon/owner/owner_shared.hpp"
#include "fluxon/owner/put_path.hpp"
#include "fluxon/owner/reclaim.hpp"
#include "fluxon/owner/replica_puller.hpp"
#include "fluxon/owner/route_removal.hpp"
#include "fluxon/owner/writeback.hpp"

namespace fluxon {

class OwnerCore {
 public:
  OwnerCore(const OwnerCoreConfig& cfg, uint64_t generation, std::string segment_name, uint64_t segment_len);

  uint32_t node_id() const { return s_.cfg.node_id; }
  // The master took this owner's registration (since it last (re)started registering).
  bool registered() const { return registered_; }
  uint64_t generation() const { return s_.generation; }

  // Registers with the master (at start; on_master_reconnected does it again after reconnects).
  void start(Millis now, Outbox& out);

  void on_client_request(uint64_t token, Envelope& req, Millis now, Outbox& out);
  // A GetStartReq of `session` read in place (the hot path: OwnerDriver::on_client_bytes), served
  // exactly as on_client_request serves a decoded one.
  void on_get_start(uint64_t token, uint64_t session, uint64_t generation, const GetStartArgs& args, Millis now,
                    Outbox& out);
  void on_client_note(Envelope& note, Millis now, Outbox& out);
  void on_master_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out);
  // The request `token` failed in transport (timeout, disconnect): nothing is freed on a guess (T1);
  // the job is retried from tick() with the same identity.
  void on_master_failure(uint64_t token);
  // A master term learned outside a reply (etcd names a new leader): from now on replies of older
  // terms are refused. Never lowers it.
  void see_master_term(uint64_t term) { s_.master_term = std::max(s_.master_term, term); }
  uint64_t master_term() const { return s_.master_term; }
  void tick(Millis now, Outbox& out);
  void close_session(uint64_t session, Outbox& out);
  // The master is reachable again (reconnected; maybe restarted with no state): register, re-publish
  // every live route with its original identity (T1: a master that kept them answers Live), and
  // re-send the jobs in flight now.
  void on_master_reconnected(Millis now, Outbox& out);
  // G9: leaders of the get_starts handled since the last call go to the master in one BatchGetStart.
  // The driver calls it once no older request waits (and tick() does, as a floor).
  void flush_gets(Millis now, Outbox& out);
  bool gets_to_flush() const { return gets_.to_flush(); }
  // The data plane finished TransferBatch `id` (ok or not).
  void on_transfer_done(uint64_t id, const Status& result, Millis now, Outbox& out);
  // Peers read these offsets of the segment for their readers (the data plane logs them): each copy
  // there counts as read, as a local get would (its place in the eviction and write-back orders).
  // dropped_total: offsets the data plane's bounded log let go so far.
  void on_peer_reads(const std::vector<uint64_t>& offsets, uint64_t dropped_total = 0);
  // Where peers fetch this owner's bytes; sent with every registration.
  void set_data_address(std::string host, uint16_t port) { data_host_ = std::move(host), data_port_ = port; }

  OwnerStats stats() const;
  wire::StatsReplyT stats_reply() const;  // the gauges, then the counters
  const OwnerCounters& counters() const { return s_.counters; }
  const ReservePool& pool() const { return s_.pool; }
  // (offset, len) of grants carved since the last call.
  std::vector<std::pair<uint64_t, uint64_t>> take_new_grant_ranges();
  // (offset, len) of grants given back since the last call: the ports release their memory.
  std::vector<std::pair<uint64_t, uint64_t>> take_released_grant_ranges() { return std::exchange(released_, {}); }
  // The ports faulted `bytes` of the ranges handed out in (in the order handed out): warm-up
  // progress. Ready once the expected-capacity grants carved at start are all faulted in.
  void on_populated(uint64_t bytes) { populated_bytes_ += bytes; }
  uint64_t warmup_bytes() const { return warmup_bytes_; }
  bool ready() const { return populated_bytes_ >= warmup_bytes_; }
  // Local visibility of a key (tests): 0 = absent, 1 = pending local visible, 2 = route live.
  int local_state(const std::string& key) const;
  // Whether key's exact cohort is remote-complete here (tests): a target holds a copy of all of it.
  bool remote_complete(const std::string& key) const;
  // Drop the route and local entry of key: route first, then S2.
  void remove_key(const std::string& key, Millis now, Outbox& out);
  static constexpr size_t kRemoveBatch = 1024;  // routes per RemoveRoutes job of remove_prefix
  // Owner-hot write-back jobs not finished yet (a gauge), and the hot tier's bytes.
  size_t writebacks_pending() const { return writeback_.pending(); }
  uint64_t eviction_debt_bytes() const { return reclaim_.debt_bytes(); }
  size_t reclaims_in_flight() const { return reclaim_.size(); }
  size_t removals_in_flight() const { return removal_.size(); }  // RemoveRoutes jobs unanswered
  uint64_t hot_bytes() const { return s_.local.hot() ? s_.local.hot()->weighted_size() : 0; }
  bool in_hot_tier(const std::string& key) const { return s_.local.hot() && s_.local.hot()->contains(key); }
  // The page before key in its prefix chain here ("": none known).
  std::string prefix_parent(const std::string& key) const {
    const std::string* p = s_.local.parent_of(key);
    return p ? *p : std::string();
  }
  // key's depth in its prefix here (LocalIndex::kNoDepth: not known).
  uint32_t prefix_depth(const std::string& key) const { return s_.local.depth_of(key); }

 private:
  using Entry = LocalIndex::Entry;
  void dispatch_client(uint64_t token, Envelope& req, Millis now, Outbox& out);
  // The request's identity: its generation is this owner's (or 0) and its session is open; else
  // the error reply is out and false.
  bool admits(uint64_t token, uint64_t session, uint64_t generation, Outbox& out);
  void get_start(uint64_t token, uint64_t session, const GetStartArgs& args, Millis now, Outbox& out);
  void remove_prefix(uint64_t token, uint64_t session, const wire::RemovePrefixReqT& req, Millis now, Outbox& out);
  Envelope register_request() const;
  bool known_token(uint64_t token) const;

  // The hand-offs between components.
  void commit(uint64_t token, uint64_t session, uint64_t put_id, Millis now, Outbox& out);
  void serve_waiters(Outbox& out);
  void write_through_done(Outbox& out);
  void serve_waiters_if_freed(Outbox& out);
  void went_live(PutPath::Settled& settled, Millis now, Outbox& out);
  // key leaves the index: its route's removal (to queue) when the master knows it.
  std::optional<Removal> take_key(const std::string& key);
  void launch_transfers(Millis now, Outbox& out);
  void on_get_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out);
  // Capacity eviction (S1, S3, S4): claims and fetches say what room they need (want_room); the
  // pressure step, from tick only, selects cold unheld cohorts worth that and the free watermark's
  // deficit less the selection debt, and hands each exact cohort to a reclaim transaction.
  void want_room(RoomNeeded room);
  void pressure(Millis now, Outbox& out);
  void evict_cohort(LocalIndex::CohortId cohort, Millis now, Outbox& out);
  // The master's T2 victims (on any of its replies): each the exact version here, not held, goes
  // through the same fenced reclaim (demote: as a single-copy demotion).
  void take_tier_victims(const Envelope& reply, Millis now, Outbox& out);
  // With tiers at the master (its registration reply says how often), the owner asks for its victims.
  void tier_poll(Millis now, Outbox& out);
  uint32_t tier_poll_ms_ = 0;
  uint64_t tier_poll_token_ = 0;  // in flight (re-sent after publish_retry_ms), 0: none
  Millis tier_poll_sent_ = 0;
  // The live members of these cohorts that no transaction owns, taken out of the resident tier.
  std::vector<Reclaim::Member> take_cohorts(const std::vector<LocalIndex::CohortId>& ids);
  Reclaim::BusyCheck reclaim_busy();

  OwnerShared s_;
  std::string segment_name_;
  uint64_t segment_len_;
  PutPath put_;
  RouteRemoval removal_;
  Eviction eviction_;
  Reclaim reclaim_;
  std::map<uint64_t, uint64_t> room_;  // slot class -> bytes claims and fetches wait for (since the last round)
  Millis next_pressure_ = 0;
  GetFlights gets_;
  ReplicaPuller replicas_;
  WriteBack writeback_;
  Exists exists_;
  // Client requests forwarded to the master (MasterStatsReq, KvEventsReq): master token -> (session,
  // client token). Bound: derived - an entry leaves with the master's answer or its failure (the
  // master link's request timeout), so at most what the clients asked within that timeout.
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> proxied_;
  uint64_t register_token_ = 0;  // registration not answered yet: re-sent from tick()
  bool registered_ = false;      // the master answered this owner's last registration
  Millis register_sent_ = 0;
  std::string data_host_;
  uint16_t data_port_ = 0;
  Millis now_ = 0;  // the clock of the current call (set by every entry point that is given one)
  void shrink_idle_grants(Millis now);
  std::map<uint32_t, Millis> idle_since_;  // idle grant -> when it was first seen idle
  Millis next_shrink_check_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> released_;
  uint64_t warmup_bytes_ = 0;     // the grants carved at start (expected capacity), in bytes
  uint64_t populated_bytes_ = 0;  // bytes the ports faulted in so far
  uint64_t handed_bytes_ = 0;     // bytes of new grants handed to the ports to fault in
  std::vector<std::string_view> key_views_;  // a decoded GetStartReq's keys, as GetStartArgs takes them
};

}  // namespace fluxon
