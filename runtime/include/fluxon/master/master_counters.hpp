// The master's counters, declared once, one table per component (see fluxon/core/counters.hpp):
// (field, Prometheus family, label "key=value" or "", help). Each component counts into its own
// table; MasterCounters, the Prometheus registration and the stats reply are made from their union.
#pragma once
#include "fluxon/core/counters.hpp"

// RouteRegistry (route_registry.hpp): publications, removals (a source removal that left another
// owner's copy serving the key, or the last copy), lookups, owners, tombstones, the KV-event log.
#define FLUXON_MASTER_ROUTES_COUNTERS(X) \
  X(put_done_total, "fluxon_master_put_done_total", "", "Put batches published (PutDone, each of a message's)") \
  X(put_done_messages_total, "fluxon_master_put_done_messages_total", "", "PutDone messages (an owner's coalesced batches come in one)") \
  X(put_done_duplicate_total, "fluxon_master_put_done_duplicate_total", "", "PutDone re-sent with an identity already live (T1)") \
  X(put_done_exists_total, "fluxon_master_put_done_exists_total", "", "PutDone items refused: another version holds the key") \
  X(put_done_stale_total, "fluxon_master_put_done_stale_total", "", "PutDone items from an old owner generation") \
  X(routes_published_total, "fluxon_master_routes_published_total", "", "Routes published") \
  X(routes_removed_total, "fluxon_master_routes_removed_total", "", "Routes removed") \
  X(replicas_published_total, "fluxon_master_replicas_published_total", "", "Replicas published (puts and remote gets)") \
  X(replicas_removed_total, "fluxon_master_replicas_removed_total", "", "Replicas removed") \
  X(remove_busy_total, "fluxon_master_remove_busy_total", "", "Route removals refused while a get read the replica") \
  X(removed_with_copies_left_total, "fluxon_master_removed_with_copies_left_total", "", "Source copies removed while another owner's copy still serves the key") \
  X(removed_last_copy_total, "fluxon_master_removed_last_copy_total", "", "Removals of a key's last copy (later reads miss)") \
  X(lookups_total, "fluxon_master_lookups_total", "", "Lookup requests") \
  X(lookup_keys_total, "fluxon_master_lookup_keys_total", "", "Keys looked up") \
  X(lookup_hits_total, "fluxon_master_lookup_hits_total", "", "Keys found by lookups") \
  X(owners_registered_total, "fluxon_master_owners_registered_total", "", "Owner registrations (restarts and reconnects included)") \
  X(kv_event_reads_total, "fluxon_master_kv_event_reads_total", "", "KV-event reads (KvEventsReq from routers through their owners)") \
  X(kv_event_reads_lost_total, "fluxon_master_kv_event_reads_lost_total", "", "KV-event reads whose cursor the log could not continue (another epoch, or events dropped): told lost") \
  X(dropped_tombstones_total, "fluxon_master_bound_drops_total", "container=tombstones", "Entries dropped at a container's bound, oldest first") \
  X(dropped_kv_events_total, "fluxon_master_bound_drops_total", "container=kv_events", "Entries dropped at a container's bound, oldest first")

// GetLeases (get_leases.hpp): prepared remote gets and the activity leases on their sources.
#define FLUXON_MASTER_GETS_COUNTERS(X) \
  X(get_start_total, "fluxon_master_get_start_total", "", "BatchGetStart requests") \
  X(get_start_keys_total, "fluxon_master_get_start_keys_total", "", "Keys asked by BatchGetStart") \
  X(get_started_total, "fluxon_master_get_started_total", "", "Remote gets started (a source replica fenced)") \
  X(get_miss_total, "fluxon_master_get_miss_total", "", "BatchGetStart keys without a route") \
  X(get_start_stale_total, "fluxon_master_get_start_stale_total", "", "BatchGetStart keys of a get that ended already (a late duplicate: T1)") \
  X(get_busy_total, "fluxon_master_get_busy_total", "", "BatchGetStart keys already inflight for the requester") \
  X(get_done_total, "fluxon_master_get_done_total", "", "Remote gets done") \
  X(get_done_stale_total, "fluxon_master_get_done_stale_total", "", "GetDone items refused: the version changed or went") \
  X(get_revoked_total, "fluxon_master_get_revoked_total", "", "Remote gets revoked") \
  X(get_ttl_expired_total, "fluxon_master_get_ttl_expired_total", "", "Remote gets expired by the inflight TTL") \
  X(refused_gets_total, "fluxon_master_bound_refusals_total", "container=gets", "New entries refused at a container's bound (a get answered Busy: the requester's miss for now)") \
  X(dropped_ended_gets_total, "fluxon_master_bound_drops_total", "container=ended_gets", "Entries dropped at a container's bound, oldest first")

// ReplicaPlacement (replica_placement.hpp): replica tasks, owner-hot write-backs, unbacked notices.
#define FLUXON_MASTER_PLACEMENT_COUNTERS(X) \
  X(replica_tasks_total, "fluxon_master_replica_tasks_total", "", "Replica tasks created by published puts") \
  X(replica_tasks_assigned_total, "fluxon_master_replica_tasks_assigned_total", "", "Replica tasks handed to a target owner") \
  X(replica_tasks_no_target_total, "fluxon_master_replica_tasks_no_target_total", "", "Replica tasks refused: no owner of a target role") \
  X(replica_tasks_obsolete_total, "fluxon_master_replica_tasks_obsolete_total", "", "Replica tasks dropped: version gone or already there") \
  X(replica_tasks_declined_total, "fluxon_master_replica_tasks_declined_total", "", "Replica tasks not handed: deeper than the polling target keeps (its next victim)") \
  X(replica_polls_total, "fluxon_master_replica_polls_total", "", "ReplicaPoll requests from target owners") \
  X(writeback_requests_total, "fluxon_master_writeback_requests_total", "", "WriteBack requests from owners (retries included)") \
  X(writeback_keys_total, "fluxon_master_writeback_keys_total", "", "Keys owners asked to write back") \
  X(writeback_tasks_total, "fluxon_master_writeback_tasks_total", "", "Replica tasks queued for write-backs") \
  X(writeback_backed_total, "fluxon_master_writeback_backed_total", "", "Write-back keys found held by a target-role owner") \
  X(writeback_obsolete_total, "fluxon_master_writeback_obsolete_total", "", "Write-back keys whose sender held no copy of that version") \
  X(writeback_no_target_total, "fluxon_master_writeback_no_target_total", "", "Write-back keys refused: no target-role owner") \
  X(writeback_declined_total, "fluxon_master_writeback_declined_total", "", "Owner-hot write-back keys declined: every target would take the copy as its next victim") \
  X(unbacked_noted_total, "fluxon_master_unbacked_noted_total", "", "Keys whose last target-role copy went while a source kept its copy: the source is told") \
  X(unbacked_dropped_total, "fluxon_master_unbacked_dropped_total", "", "Unbacked notices dropped at a node's bound (kUnbackedPerNode)") \
  X(dropped_replica_tasks_total, "fluxon_master_bound_drops_total", "container=replica_queue", "Entries dropped at a container's bound, oldest first") \
  X(dropped_writeback_tasks_total, "fluxon_master_bound_drops_total", "container=writeback_tasks", "Entries dropped at a container's bound, oldest first")

// ReclaimRegistry (reclaim_registry.hpp): fenced source reclaims, each answer by kind and reason,
// and single-copy demotions (the design's names: attempts are Fences, cohorts those committed, each
// an exact cohort set, and the value bytes whose source copies they dropped).
#define FLUXON_MASTER_RECLAIMS_COUNTERS(X) \
  X(reclaim_requests_total, "fluxon_master_reclaim_requests_total", "", "Reclaim requests (Fence, Commit, Abort; retries included)") \
  X(reclaim_fenced_total, "fluxon_master_reclaim_answers_total", "result=fenced", "Reclaim answers by result") \
  X(reclaim_in_progress_total, "fluxon_master_reclaim_answers_total", "result=already_in_progress", "Reclaim answers by result") \
  X(reclaim_completed_total, "fluxon_master_reclaim_answers_total", "result=completed", "Reclaim answers by result") \
  X(reclaim_stale_total, "fluxon_master_reclaim_answers_total", "result=stale", "Reclaim answers by result") \
  X(reclaim_aborted_total, "fluxon_master_reclaim_answers_total", "result=aborted", "Reclaim answers by result") \
  X(reclaim_replays_total, "fluxon_master_reclaim_answers_total", "result=replayed", "Reclaim answers by result") \
  X(reclaim_busy_activity_total, "fluxon_master_reclaim_busy_total", "reason=activity", "Reclaim fences refused for now, by reason") \
  X(reclaim_busy_partial_total, "fluxon_master_reclaim_busy_total", "reason=partial", "Reclaim fences refused for now, by reason") \
  X(reclaim_busy_closure_total, "fluxon_master_reclaim_busy_total", "reason=closure", "Reclaim fences refused for now, by reason") \
  X(reclaim_busy_other_total, "fluxon_master_reclaim_busy_total", "reason=other_reclaim", "Reclaim fences refused for now, by reason") \
  X(reclaim_replicas_removed_total, "fluxon_master_reclaim_replicas_removed_total", "", "Source replicas removed by committed reclaims") \
  X(reclaim_commit_unfenced_total, "fluxon_master_reclaim_commit_unfenced_total", "", "Commits of no known transaction that still found members (removed: a released backing never rolls back)") \
  X(reclaim_refused_gets_total, "fluxon_master_reclaim_refused_total", "lease=get", "New leases refused while a reclaim fenced the key") \
  X(reclaim_refused_puts_total, "fluxon_master_reclaim_refused_total", "lease=put", "New leases refused while a reclaim fenced the key") \
  X(demoted_keys_total, "fluxon_master_demoted_keys_total", "", "Source copies dropped by single-copy demotion") \
  X(demote_kept_total, "fluxon_master_demote_kept_total", "", "Demotion fences refused: a key had no target copy of its version") \
  X(demote_relied_busy_total, "fluxon_master_demote_relied_busy_total", "", "Reclaims and removals of a target copy deferred: a demotion relied on it") \
  X(owner_hot_demotion_attempts, "fluxon_master_owner_hot_demotion_attempts_total", "", "Demotion fences asked (owner_hot_demotion_attempts)") \
  X(owner_hot_demotion_cohorts, "fluxon_master_owner_hot_demotion_cohorts_total", "", "Demotions committed, each an exact cohort set (owner_hot_demotion_cohorts)") \
  X(owner_hot_demotion_selected_bytes, "fluxon_master_owner_hot_demotion_selected_bytes_total", "", "Value bytes whose source copies demotion dropped (owner_hot_demotion_selected_bytes)") \
  X(dropped_ended_reclaims_total, "fluxon_master_bound_drops_total", "container=ended_reclaims", "Entries dropped at a container's bound, oldest first")

// RouteTiers (route_tiers.hpp): T1 evictions and what became of each (the design's
// writeback_tier1_triggered = stale + backed + no target + queued), promotions by gets, T2
// selections (selected = ended + restored + victims now) and the E16ba completion fence.
#define FLUXON_MASTER_TIERS_COUNTERS(X) \
  X(tier1_triggered_total, "fluxon_master_writeback_tier1_triggered_total", "", "Routes T1 evicted (writeback_tier1_triggered)") \
  X(tier1_stale_total, "fluxon_master_writeback_tier1_outcomes_total", "outcome=stale", "What each T1 eviction became") \
  X(tier1_backed_total, "fluxon_master_writeback_tier1_outcomes_total", "outcome=backed", "What each T1 eviction became") \
  X(tier1_no_target_total, "fluxon_master_writeback_tier1_outcomes_total", "outcome=no_target", "What each T1 eviction became") \
  X(tier1_queued_total, "fluxon_master_writeback_tier1_outcomes_total", "outcome=queued", "What each T1 eviction became") \
  X(tier1_promotions_total, "fluxon_master_tier1_promotions_total", "", "Routes a get brought back into T1") \
  X(tier2_selected_total, "fluxon_master_tier2_selected_total", "", "Routes T2 selected over its capacity") \
  X(tier2_selected_bytes_total, "fluxon_master_tier2_selected_bytes_total", "", "Slot bytes T2 selected") \
  X(tier2_recoverable_total, "fluxon_master_tier2_recoverable_total", "", "T2 victims selected with a target-role copy of their version (handed to demote)") \
  X(tier2_fenced_total, "fluxon_master_tier2_fenced_total", "", "T2 victims held by the completion fence for their write-back (E16ba)") \
  X(tier2_fence_backed_total, "fluxon_master_tier2_fence_backed_total", "", "Fenced T2 victims whose write-back completed in time (handed to demote)") \
  X(tier2_shortfall_total, "fluxon_master_tier2_shortfall_total", "", "Fenced T2 victims handed without a copy: the fence's bound passed") \
  X(tier2_shortfall_bytes_total, "fluxon_master_tier2_shortfall_bytes_total", "", "Slot bytes of those (the lead window's shortfall)") \
  X(tier2_handed_total, "fluxon_master_tier2_handed_total", "", "T2 victims handed to their owner (re-hands included)") \
  X(tier2_ended_total, "fluxon_master_tier2_ended_total", "", "T2 victims whose replica went (reclaimed, demoted, replaced, or its node restarted)") \
  X(tier2_restored_total, "fluxon_master_tier2_restored_total", "", "T2 victims back in T2: their owner kept them (held, busy) past the hand-off bound, or a duplicate victim became a last copy") \
  X(tier2_duplicate_kept_total, "fluxon_master_tier2_duplicate_kept_total", "", "Reclaims of a target-role node's T2 victims chosen as duplicates, refused (Kept) because the other copy went meanwhile")

// The router (master_core.hpp): requests no component takes.
#define FLUXON_MASTER_ROUTER_COUNTERS(X) \
  X(owner_reports_total, "fluxon_master_owner_reports_total", "", "Owner reports taken (the status page's owner rows, once a second each)") \
  X(errors_total, "fluxon_master_errors_total", "", "Requests answered with an error") \
  X(malformed_total, "fluxon_master_malformed_total", "", "Malformed or unexpected messages rejected")

// A bounded container's drops at its bound (the oldest first) are counted in the table of the
// component that declares the container, beside its bound (fluxon_master_bound_drops_total).
// The master's table: its components' tables, in this order.
#define FLUXON_MASTER_COUNTERS(X) \
  FLUXON_MASTER_ROUTES_COUNTERS(X) \
  FLUXON_MASTER_GETS_COUNTERS(X) \
  FLUXON_MASTER_PLACEMENT_COUNTERS(X) \
  FLUXON_MASTER_RECLAIMS_COUNTERS(X) \
  FLUXON_MASTER_TIERS_COUNTERS(X) \
  FLUXON_MASTER_ROUTER_COUNTERS(X)

// The master's gauges: (field, stats name, Prometheus family, label, help).
#define FLUXON_MASTER_GAUGES(X) \
  X(routes, "routes", "fluxon_master_routes", "", "Live routes in the global route table") \
  X(owners, "owners", "fluxon_master_owners", "", "Registered owners") \
  X(replicas, "replicas", "fluxon_master_replicas", "", "Replicas behind the live routes") \
  X(inflight_gets, "inflight_gets", "fluxon_master_inflight_gets", "", "Prepared remote gets (started, not done or revoked)") \
  X(replica_tasks_queued, "replica_tasks_queued", "fluxon_master_replica_tasks_queued", "", "Replica tasks waiting for a target owner") \
  X(reclaims, "reclaims", "fluxon_master_reclaims", "", "Reclaim transactions fenced, not committed or aborted yet") \
  X(reclaim_fences, "reclaim_fences", "fluxon_master_reclaim_fences", "", "Source replicas fenced by reclaims in progress") \
  X(tier2_bytes, "tier2_bytes", "fluxon_master_tier_bytes", "tier=t2", "Slot bytes in the master's route tiers, over all nodes") \
  X(tier1_bytes, "tier1_bytes", "fluxon_master_tier_bytes", "tier=t1", "Slot bytes in the master's route tiers, over all nodes") \
  X(tier2_victim_bytes, "tier2_victim_bytes", "fluxon_master_tier2_victim_bytes", "", "Slot bytes T2 selected whose replicas have not gone yet") \
  X(tier2_victims, "tier2_victims", "fluxon_master_tier2_victims", "", "T2 victims whose replicas have not gone yet") \
  X(kv_events, "kv_events", "fluxon_master_kv_events", "", "Route-change events the KV-event log holds (bound: kv_event_log_capacity)") \
  X(kv_event_seq, "kv_event_seq", "fluxon_master_kv_event_seq", "", "The sequence number of the newest KV event")

namespace fluxon {

FLUXON_COUNTER_STRUCT(MasterRoutesCounters, FLUXON_MASTER_ROUTES_COUNTERS)
FLUXON_COUNTER_STRUCT(MasterGetsCounters, FLUXON_MASTER_GETS_COUNTERS)
FLUXON_COUNTER_STRUCT(MasterPlacementCounters, FLUXON_MASTER_PLACEMENT_COUNTERS)
FLUXON_COUNTER_STRUCT(MasterReclaimsCounters, FLUXON_MASTER_RECLAIMS_COUNTERS)
FLUXON_COUNTER_STRUCT(MasterTiersCounters, FLUXON_MASTER_TIERS_COUNTERS)
FLUXON_COUNTER_STRUCT(MasterRouterCounters, FLUXON_MASTER_ROUTER_COUNTERS)
FLUXON_COUNTER_STRUCT(MasterCounters, FLUXON_MASTER_COUNTERS)
FLUXON_GAUGE_STRUCT(MasterStats, FLUXON_MASTER_GAUGES)

}  // namespace fluxon
