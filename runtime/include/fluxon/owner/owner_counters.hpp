// The owner's counters, declared once, one table per component: (field, Prometheus family, label
// "key=value" or "", help). OwnerCounters, the Prometheus registration, the stats reply and the
// clients' stats maps are made from these lists; a counter added here is counted, exported and
// documented at once.
#pragma once
#include "fluxon/core/counters.hpp"

// PutPath (put_path.hpp): claims, commits, publish jobs, resync.
#define FLUXON_OWNER_PUT_PATH_COUNTERS(X) \
  X(put_start_total, "fluxon_owner_put_start_total", "", "local_fast_put_start requests") \
  X(put_commit_total, "fluxon_owner_put_commit_total", "", "Put plans committed (local-read-ready)") \
  X(put_abort_total, "fluxon_owner_put_abort_total", "", "Put plans aborted") \
  X(put_live_total, "fluxon_owner_put_live_total", "", "Publish jobs that reached a terminal state") \
  X(put_keys_total, "fluxon_owner_put_keys_total", "", "Keys given a slot by put_start") \
  X(grants_shrunk_total, "fluxon_owner_grants_shrunk_total", "", "Idle grants given back whole (dynamic mode, idle_grant_shrink_ms)") \
  X(put_conflict_total, "fluxon_owner_put_conflict_total", "", "put_start refused by KeyConflict") \
  X(put_nospace_total, "fluxon_owner_put_nospace_total", "", "put_start refused by NoSpace") \
  X(reserve_waits_total, "fluxon_owner_reserve_waits_total", "", "Claims that had to wait for slots") \
  X(reserve_soft_wait_total, "fluxon_owner_reserve_soft_wait_total", "", "Claims waiting past the soft wait") \
  X(reserve_timeout_total, "fluxon_owner_reserve_timeout_total", "", "Claims failed by LocalReserveTimeout") \
  X(publish_retry_total, "fluxon_owner_publish_retry_total", "", "PutDone re-sent with the same identity (T1)") \
  X(publish_coalesced_total, "fluxon_owner_publish_coalesced_total", "",                                     \
    "Put batches whose PutDone waited for an earlier one's answer, to go with others in one message")        \
  X(publish_messages_shared_total, "fluxon_owner_publish_messages_shared_total", "",                         \
    "PutDone messages that carried more than one put batch")                                                  \
  X(publish_exists_total, "fluxon_owner_publish_refused_total", "", "Route items the master refused") \
  X(resync_routes_total, "fluxon_owner_resync_routes_total", "", "Live routes re-published after the master came back") \
  X(replica_keys_requested_total, "fluxon_owner_replica_keys_requested_total", "", "Put keys published with a replica task") \
  /* kv_score_pressure_budget (ReplicaBudget): what the budget did with the candidates */ \
  X(replica_budget_kept_keys_total, "fluxon_owner_replica_budget_keys_total", "decision=kept", "Candidate keys of budgeted puts by the owner's decision (kv_score_pressure_budget)") \
  X(replica_budget_cut_keys_total, "fluxon_owner_replica_budget_keys_total", "decision=cut", "Candidate keys of budgeted puts by the owner's decision (kv_score_pressure_budget)") \
  X(replica_budget_shared_keys_total, "fluxon_owner_replica_budget_shared_keys_total", "", "Of those, keys decided by an earlier put of their group (another TP rank)") \
  X(replica_budget_dropped_total, "fluxon_owner_replica_budget_dropped_total", "", "Group decisions dropped before every TP rank's put came (bound or age)")

// RouteRemoval (route_removal.hpp): route-first removals (S2).
#define FLUXON_OWNER_ROUTE_REMOVAL_COUNTERS(X) \
  X(route_remove_total, "fluxon_owner_route_remove_total", "", "Routes removed before their slot was freed") \
  X(remove_busy_total, "fluxon_owner_remove_busy_total", "", "Route removals deferred while a peer read the copy")

// Eviction (eviction.hpp, run by the router): capacity and pressure rounds (S1-S4).
#define FLUXON_OWNER_EVICTION_COUNTERS(X) \
  X(evicted_keys_total, "fluxon_owner_evicted_keys_total", "", "Keys evicted for capacity (whole cohorts)") \
  X(evicted_bytes_total, "fluxon_owner_evicted_bytes_total", "", "Slot bytes evicted for capacity") \
  X(eviction_recoverable_bytes_total, "fluxon_owner_eviction_recoverable_bytes_total", "", "Evicted bytes of remote-complete cohorts (a target owner's copy serves them)") \
  X(eviction_shortfall_bytes_total, "fluxon_owner_eviction_shortfall_bytes_total", "", "Evicted bytes whose write-back was still copying them (the lead window fell short, E16ba)") \
  X(eviction_rounds_total, "fluxon_owner_eviction_rounds_total", "", "Eviction rounds that selected victims") \
  X(pressure_evictions_total, "fluxon_owner_pressure_evictions_total", "", "Eviction rounds started ahead of claims to keep eviction_free_watermark of the slots free") \
  /* The master's T2 victims (Envelope.evict): taken = stale + taken already + busy + evicted + demoted here. */ \
  X(tier_victims_total, "fluxon_owner_tier_victims_total", "", "T2 victims the master handed to this owner (re-hands included)") \
  X(tier_victims_stale_total, "fluxon_owner_tier_victims_outcomes_total", "outcome=stale", "What each T2 victim became here") \
  X(tier_victims_taken_total, "fluxon_owner_tier_victims_outcomes_total", "outcome=taken", "What each T2 victim became here") \
  X(tier_victims_busy_total, "fluxon_owner_tier_victims_outcomes_total", "outcome=busy", "What each T2 victim became here") \
  X(tier_victims_evicted_total, "fluxon_owner_tier_victims_outcomes_total", "outcome=evicted", "What each T2 victim became here") \
  X(tier_victims_demoted_total, "fluxon_owner_tier_victims_outcomes_total", "outcome=demoted", "What each T2 victim became here")

// Reclaim (reclaim.hpp): every capacity eviction's transaction. S4 at rest: evicted bytes =
// committed + restored + obsolete bytes (pending_eviction_reclaim_bytes is the rest, in flight).
#define FLUXON_OWNER_RECLAIM_COUNTERS(X) \
  X(reclaim_started_total, "fluxon_owner_reclaim_transactions_total", "", "Reclaim transactions begun (one per selected exact cohort)") \
  X(reclaim_committed_keys_total, "fluxon_owner_reclaim_keys_total", "end=committed", "Selected keys by how their reclaim ended (S4)") \
  X(reclaim_restored_keys_total, "fluxon_owner_reclaim_keys_total", "end=restored", "Selected keys by how their reclaim ended (S4)") \
  X(reclaim_obsolete_keys_total, "fluxon_owner_reclaim_keys_total", "end=obsolete", "Selected keys by how their reclaim ended (S4)") \
  X(reclaim_committed_bytes_total, "fluxon_owner_reclaim_bytes_total", "end=committed", "Selected slot bytes by how their reclaim ended (S4)") \
  X(reclaim_restored_bytes_total, "fluxon_owner_reclaim_bytes_total", "end=restored", "Selected slot bytes by how their reclaim ended (S4)") \
  X(reclaim_obsolete_bytes_total, "fluxon_owner_reclaim_bytes_total", "end=obsolete", "Selected slot bytes by how their reclaim ended (S4)") \
  X(reclaim_released_keys_total, "fluxon_owner_reclaim_released_keys_total", "", "Slots released by prepared reclaims (route reference and resident holder in one pool update)") \
  X(reclaim_master_activity_total, "fluxon_owner_reclaim_deferred_total", "reason=master_activity", "Reclaim attempts deferred, by reason (attempts, not keys)") \
  X(reclaim_master_partial_total, "fluxon_owner_reclaim_deferred_total", "reason=master_partial", "Reclaim attempts deferred, by reason (attempts, not keys)") \
  X(reclaim_master_closure_total, "fluxon_owner_reclaim_deferred_total", "reason=master_closure", "Reclaim attempts deferred, by reason (attempts, not keys)") \
  X(reclaim_master_other_total, "fluxon_owner_reclaim_deferred_total", "reason=master_other_reclaim", "Reclaim attempts deferred, by reason (attempts, not keys)") \
  X(reclaim_owner_holder_total, "fluxon_owner_reclaim_deferred_total", "reason=owner_holder", "Reclaim attempts deferred, by reason (attempts, not keys)") \
  X(reclaim_owner_write_total, "fluxon_owner_reclaim_deferred_total", "reason=owner_write", "Reclaim attempts deferred, by reason (attempts, not keys)") \
  X(reclaim_route_changed_total, "fluxon_owner_reclaim_route_changed_total", "", "Reclaims the master found stale (the route or the generation moved on)") \
  X(reclaim_retry_queued_total, "fluxon_owner_reclaim_retries_total", "outcome=queued", "Reclaim back-offs, and transactions that committed after one") \
  X(reclaim_retry_completed_total, "fluxon_owner_reclaim_retries_total", "outcome=completed", "Reclaim back-offs, and transactions that committed after one") \
  X(reclaim_restored_total, "fluxon_owner_reclaim_retries_total", "outcome=restored", "Reclaim back-offs, and transactions that committed after one") \
  X(reclaim_resent_total, "fluxon_owner_reclaim_resent_total", "", "Reclaim requests re-sent with the same epoch (T1)")

// GetFlights (get_flights.hpp): get_start, flights, master jobs, the data plane (P2, G1-G10).
#define FLUXON_OWNER_GET_FLIGHTS_COUNTERS(X) \
  X(get_start_total, "fluxon_owner_get_start_total", "", "get_start requests") \
  X(get_keys_total, "fluxon_owner_get_keys_total", "", "Keys asked by get_start") \
  X(get_hit_keys_total, "fluxon_owner_get_hit_keys_total", "", "Keys inside transferable_len") \
  X(get_tail_released_total, "fluxon_owner_get_tail_released_total", "", "Tail holdings released by partial get_transfer or cancel") \
  X(handle_ttl_expired_total, "fluxon_owner_handle_ttl_expired_total", "", "Get handles released by TTL") \
  X(get_local_keys_total, "fluxon_owner_get_prefix_keys_total", "source=local", "Keys inside transferable_len by source (P2)") \
  X(get_joined_keys_total, "fluxon_owner_get_prefix_keys_total", "source=inflight_join", "Keys inside transferable_len by source (P2)") \
  X(get_leader_keys_total, "fluxon_owner_get_prefix_keys_total", "source=leader", "Keys inside transferable_len by source (P2)") \
  X(get_required_keys_total, "fluxon_owner_get_required_keys_total", "", "Keys asked by get_start (required batch)") \
  X(get_flights_started_total, "fluxon_owner_get_leaders_total", "", "Flights started by this owner (leader keys)") \
  X(get_joins_total, "fluxon_owner_get_joins_total", "", "Keys that joined another batch's flight (GetStart/DMA saved)") \
  X(get_master_batches_total, "fluxon_owner_get_master_batches_total", "", "BatchGetStart requests (one per leader batch)") \
  X(get_master_retry_total, "fluxon_owner_get_master_retry_total", "", "Get jobs re-sent with the same identity (T1)") \
  X(get_suffix_released_total, "fluxon_owner_get_suffix_released_total", "", "Pins, waiters and leaders released past transferable_len") \
  X(get_remote_miss_total, "fluxon_owner_get_remote_miss_total", "", "Leader keys the master had no route for") \
  X(get_flights_ready_total, "fluxon_owner_get_flights_ready_total", "", "Flights that made a local replica") \
  X(get_flights_failed_total, "fluxon_owner_get_flights_failed_total", "", "Flights that ended without a replica") \
  X(get_revoked_total, "fluxon_owner_get_revoked_total", "", "Remote gets revoked") \
  X(get_done_stale_total, "fluxon_owner_get_done_stale_total", "", "GetDone refused: the value changed while fetched") \
  X(get_transfer_failed_total, "fluxon_owner_get_transfer_failed_total", "", "get_transfer calls failed by a remote key") \
  X(transfer_batches_total, "fluxon_owner_transfer_batches_total", "", "Data-plane fetch batches (one per peer per round)") \
  X(transfer_keys_total, "fluxon_owner_transfer_keys_total", "", "Values fetched over the data plane") \
  X(transfer_bytes_total, "fluxon_owner_transfer_bytes_total", "", "Bytes fetched over the data plane") \
  X(transfer_failures_total, "fluxon_owner_transfer_failures_total", "", "Fetch batches that failed") \
  X(get_wait_timeouts_total, "fluxon_owner_get_wait_timeouts_total", "", "get_start decided without the master's answer") \
  X(get_alone_misses_total, "fluxon_owner_get_alone_misses_total", "", "Misses answered without the master (no other owner)") \
  X(get_leader_requests_total, "fluxon_owner_get_leader_requests_total", "", "get_starts with leaders (G9: BatchGetStarts, _get_master_batches_total, are fewer when they overlap)")

// ReplicaPuller (replica_puller.hpp): replica tasks.
#define FLUXON_OWNER_REPLICA_PULLER_COUNTERS(X) \
  X(replica_tasks_received_total, "fluxon_owner_replica_tasks_received_total", "", "Replica tasks this owner pulled from the master") \
  X(replica_tasks_skipped_total, "fluxon_owner_replica_tasks_skipped_total", "", "Replica tasks for keys already here or on their way") \
  X(replica_done_total, "fluxon_owner_replica_done_total", "", "Replicas this owner made (fetched and published)") \
  X(replica_failed_total, "fluxon_owner_replica_failed_total", "", "Replica tasks whose fetch failed on every attempt (a later miss, nothing more)") \
  X(replica_retries_total, "fluxon_owner_replica_retries_total", "", "Replica fetches tried again after a failure (3 attempts in all)")

// WriteBack (writeback.hpp): owner-hot write-back and single-copy demotion.
#define FLUXON_OWNER_WRITE_BACK_COUNTERS(X) \
  X(hot_evicted_keys_total, "fluxon_owner_hot_evicted_keys_total", "", "Keys the owner-hot tier evicted (write-back candidates)") \
  X(writeback_cohorts_total, "fluxon_owner_writeback_cohorts_total", "", "Exact cohorts written back to a target-role owner") \
  X(spill_cohorts_total, "fluxon_owner_spill_cohorts_total", "", "Exact cohorts of puts that went live under pressure, spilled: written back, then demoted (spill_free_ratio)") \
  X(spill_keys_total, "fluxon_owner_spill_keys_total", "", "Keys of those") \
  X(writeback_keys_total, "fluxon_owner_writeback_keys_total", "", "Keys of the cohorts written back") \
  X(writeback_backed_keys_total, "fluxon_owner_writeback_backed_keys_total", "", "Written-back keys a target-role owner holds now") \
  X(writeback_abandoned_total, "fluxon_owner_writeback_abandoned_total", "", "Write-backs given up (no target, the value moved on, or no copy in time): the entries stay") \
  X(writeback_declined_keys_total, "fluxon_owner_writeback_declined_keys_total", "", "Write-back keys the master declined (every target would evict the copy next): they stay here, this owner's own") \
  X(writeback_requests_total, "fluxon_owner_writeback_requests_total", "", "WriteBack requests sent (retries included)") \
  /* write_through puts: published, then their futures wait for a target-role owner's copy */ \
  X(write_through_puts_total, "fluxon_owner_write_through_puts_total", "", "write_through puts published (waiting for their remote copy)") \
  X(write_through_backed_total, "fluxon_owner_write_through_backed_total", "", "write_through puts whose every key a target-role owner holds: the future completed") \
  X(write_through_failed_total, "fluxon_owner_write_through_failed_total", "", "write_through puts whose remote copy failed (no target, replaced, evicted, too slow): the future failed") \
  /* Single-copy demotion: a reclaim transaction with demote set, per backed job; its members are */ \
  /* demoted (committed), kept (no target copy any more), given up (bounded retries) or obsolete. */ \
  X(demote_started_keys_total, "fluxon_owner_demote_started_keys_total", "", "Keys handed to demotion transactions") \
  X(demoted_cohorts_total, "fluxon_owner_demoted_cohorts_total", "", "Cohorts demoted: their copies here dropped, the remote copy serves") \
  X(demoted_keys_total, "fluxon_owner_demoted_keys_total", "", "Keys demoted") \
  X(demoted_bytes_total, "fluxon_owner_demoted_bytes_total", "", "Slot bytes freed by demotion") \
  X(demote_kept_total, "fluxon_owner_demote_kept_total", "", "Demotions refused (the remote copy went first): copies kept") \
  X(reclaim_kept_last_copy_total, "fluxon_owner_reclaim_kept_last_copy_total", "", "Evictions refused by the master (Kept): a T2 victim chosen as a duplicate had become the last copy") \
  X(demote_kept_keys_total, "fluxon_owner_demote_kept_keys_total", "", "Keys a demotion kept here: no target copy, or retries ran out") \
  X(demote_obsolete_keys_total, "fluxon_owner_demote_obsolete_keys_total", "", "Keys that left a demotion replaced or removed meanwhile") \
  X(unbacked_keys_total, "fluxon_owner_unbacked_keys_total", "", "Remote-complete keys whose target copy went (the master said): their cohort is this owner's own again, back in the hot tier")

// Exists (exists.hpp): exists_prefix questions.
#define FLUXON_OWNER_EXISTS_COUNTERS(X) \
  X(exists_total, "fluxon_owner_exists_total", "", "exists_prefix questions") \
  X(exists_master_total, "fluxon_owner_exists_master_total", "", "exists_prefix questions that asked the master for the rest") \
  X(exists_master_unanswered_total, "fluxon_owner_exists_master_unanswered_total", "", "exists_prefix questions answered with the local prefix: the master did not answer in time") \
  X(exists_len_mismatch_total, "fluxon_owner_exists_len_mismatch_total", "", "exists_prefix keys found with another length than expected (a miss)")

// The router (owner_core.hpp): requests it refuses or forwards itself.
#define FLUXON_OWNER_ROUTER_COUNTERS(X) \
  X(peer_read_keys_total, "fluxon_owner_peer_read_keys_total", "", "Copies here that peers read for their readers (the data plane's log): read again in the eviction order") \
  X(peer_reads_dropped_total, "fluxon_owner_peer_reads_dropped_total", "", "Peer reads the data plane's log let go between two ticks (its bound, 65,536)") \
  X(master_failures_total, "fluxon_owner_master_failures_total", "", "Master requests lost in transport (re-sent later)") \
  X(errors_total, "fluxon_owner_errors_total", "", "Requests answered with an error") \
  X(malformed_total, "fluxon_owner_malformed_total", "", "Malformed or unexpected messages rejected") \
  X(generation_mismatch_total, "fluxon_owner_generation_mismatch_total", "", "Requests for another owner generation") \
  X(stale_term_replies_total, "fluxon_owner_stale_term_replies_total", "",                                  \
    "Master replies refused: their term is older than the newest this owner has seen (a deposed leader)") \
  X(removed_by_prefix_total, "fluxon_owner_removed_by_prefix_total", "", "Values removed by remove_prefix (SGLang clear())")

// Bounds reached (OwnerCoreConfig::Limits), each declared where its queue is: what was refused instead of queued.
#define FLUXON_OWNER_BOUND_COUNTERS(X) \
  X(claim_queue_full_total, "fluxon_owner_bound_refusals_total", "queue=claim_waiters", "Requests refused at a queue's bound") \
  X(publish_backlog_full_total, "fluxon_owner_bound_refusals_total", "queue=publish_jobs", "Requests refused at a queue's bound") \
  X(eviction_paused_total, "fluxon_owner_bound_refusals_total", "queue=reclaims", "Requests refused at a queue's bound") \
  X(remove_jobs_full_total, "fluxon_owner_bound_refusals_total", "queue=remove_jobs", "Requests refused at a queue's bound") \
  X(flights_full_total, "fluxon_owner_bound_refusals_total", "queue=flights", "Requests refused at a queue's bound") \
  X(exists_full_total, "fluxon_owner_bound_refusals_total", "queue=exists_questions", "Requests refused at a queue's bound") \
  X(pending_gets_full_total, "fluxon_owner_bound_refusals_total", "queue=pending_gets", "Requests refused at a queue's bound") \
  X(handles_full_total, "fluxon_owner_bound_refusals_total", "queue=handles", "Requests refused at a queue's bound") \
  X(writebacks_full_total, "fluxon_owner_bound_refusals_total", "queue=writebacks", "Requests refused at a queue's bound") \
  X(replica_retries_full_total, "fluxon_owner_bound_refusals_total", "queue=replica_retries", "Requests refused at a queue's bound") \
  X(sessions_full_total, "fluxon_owner_bound_refusals_total", "queue=sessions", "Requests refused at a queue's bound")

// The owner's table: its components' tables, in this order.
#define FLUXON_OWNER_COUNTERS(X) \
  FLUXON_OWNER_PUT_PATH_COUNTERS(X) \
  FLUXON_OWNER_ROUTE_REMOVAL_COUNTERS(X) \
  FLUXON_OWNER_EVICTION_COUNTERS(X) \
  FLUXON_OWNER_RECLAIM_COUNTERS(X) \
  FLUXON_OWNER_GET_FLIGHTS_COUNTERS(X) \
  FLUXON_OWNER_REPLICA_PULLER_COUNTERS(X) \
  FLUXON_OWNER_WRITE_BACK_COUNTERS(X) \
  FLUXON_OWNER_EXISTS_COUNTERS(X) \
  FLUXON_OWNER_ROUTER_COUNTERS(X) \
  FLUXON_OWNER_BOUND_COUNTERS(X)

// The owner's gauges: (field, stats name, Prometheus family, label, help).
#define FLUXON_OWNER_GAUGES(X) \
  X(slots_free, "slots_free", "fluxon_owner_slots", "state=free", "Local reserve slots by state") \
  X(slots_prepared, "slots_prepared", "fluxon_owner_slots", "state=prepared", "Local reserve slots by state") \
  X(slots_pending_local_visible, "slots_pending_local_visible", "fluxon_owner_slots", "state=pending_local_visible", "Local reserve slots by state") \
  X(slots_pending, "slots_pending", "fluxon_owner_slots", "state=pending", "Local reserve slots by state") \
  X(slots_committed, "slots_committed", "fluxon_owner_slots", "state=committed", "Local reserve slots by state") \
  X(grants, "grants", "fluxon_owner_grants", "", "Grants serving a slot class") \
  X(warmup_bytes, "warmup_bytes", "fluxon_owner_warmup_bytes", "", "Bytes of the expected-capacity grants carved at start (0: dynamic mode)") \
  X(warmed_bytes, "warmed_bytes", "fluxon_owner_warmed_bytes", "", "Of warmup_bytes, faulted in so far: the owner is ready when they are equal") \
  X(populate_backlog_bytes, "populate_backlog_bytes", "fluxon_owner_populate_backlog_bytes", "", "Bytes of grants carved and not yet faulted in (the populator's work left)") \
  X(active_put_plans, "owner_active_put_plans", "fluxon_owner_active_put_plans", "", "Put plans not yet committed or aborted") \
  X(active_get_handles, "owner_active_get_handles", "fluxon_owner_active_get_handles", "", "Get handles not yet consumed") \
  X(holders, "holders", "fluxon_owner_holders", "", "Exported holdings") \
  X(routes, "routes", "fluxon_owner_routes", "", "Live master routes to this owner's slots") \
  X(sessions, "owner_sessions", "fluxon_owner_sessions", "", "Connected client sessions") \
  X(publish_jobs, "publish_jobs", "fluxon_owner_publish_jobs", "", "Publish and route-removal jobs in flight") \
  X(writeback_jobs, "writeback_jobs", "fluxon_owner_writeback_jobs", "", "Owner-hot write-backs in flight") \
  X(hot_bytes, "hot_bytes", "fluxon_owner_hot_bytes", "", "Bytes in the owner-hot tier") \
  X(resident_bytes, "resident_bytes", "fluxon_owner_resident_bytes", "", "Slot bytes of the values this owner holds (its resident tier)") \
  X(eviction_stale_bytes, "eviction_stale_bytes", "fluxon_owner_eviction_stale_bytes", "", "eviction_order prefix_depth: the stale horizon now, bytes admitted after which an unread page goes first (auto: from the re-read intervals; 0: none)") \
  X(replica_budget_pressure_permille, "replica_budget_pressure_permille", "fluxon_owner_replica_budget_pressure_ratio", "", "Eviction pressure the replica budget follows: evicted per admitted slot, recent, in [0, 1] (stats: x1000)") \
  X(pending_eviction_reclaim_bytes, "pending_eviction_reclaim_bytes", "fluxon_owner_pending_eviction_reclaim_bytes", "", "Selection debt: bytes selected for eviction whose reclaim has not ended (0 at rest)") \
  X(reclaims, "reclaims", "fluxon_owner_reclaims", "", "Reclaim transactions in flight") \
  X(replica_flights, "replica_flights", "fluxon_owner_replica_flights", "", "Replica-task fetches in flight (at most replica_task_max_inflight)") \
  X(replica_retries_waiting, "replica_retries_waiting", "fluxon_owner_replica_retries_waiting", "", "Replica-task fetches that failed, waiting to be tried again") \
  /* remote gets: per-key flights by phase (G7), get jobs with the master in flight */ \
  X(flights_starting, "flights_starting", "fluxon_owner_get_flights", "phase=starting", "Per-key remote get flights by phase (G7)") \
  X(flights_started, "flights_started", "fluxon_owner_get_flights", "phase=started", "Per-key remote get flights by phase (G7)") \
  X(flights_finishing, "flights_finishing", "fluxon_owner_get_flights", "phase=finishing", "Per-key remote get flights by phase (G7)") \
  X(flights_revoking, "flights_revoking", "fluxon_owner_get_flights", "phase=revoking", "Per-key remote get flights by phase (G7)") \
  X(get_jobs, "get_jobs", "fluxon_owner_get_jobs", "", "BatchGetStart/Done/Revoke jobs awaiting the master") \
  X(pending_gets, "pending_gets", "fluxon_owner_pending_gets", "", "get_start requests waiting for the master")

namespace fluxon {

FLUXON_COUNTER_STRUCT(OwnerCounters, FLUXON_OWNER_COUNTERS)
FLUXON_GAUGE_STRUCT(OwnerStats, FLUXON_OWNER_GAUGES)

}  // namespace fluxon
