// The slice of an owner's configuration its core uses: identity, slot pool, waits, eviction,
// write-back and the queues' bounds. No ports, hosts, threads or fault odds: those belong to the
// driver and the I/O around it (OwnerConfig in fluxon/runtime/config.hpp adds them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fluxon/runtime/reserve_pool.hpp"

namespace fluxon {

struct OwnerCoreConfig {
  uint32_t node_id = 1;
  std::string role = "sglang_owner";  // or remote_cache
  uint64_t grant_bytes = kDefaultGrantBytes;        // local_reserve_grant_bytes
  std::optional<ExpectedCapacity> expected_capacity;  // owner_local_reserve_expected_capacity
  uint32_t soft_wait_ms = 10;
  uint32_t hard_timeout_ms = 30000;
  uint32_t get_handle_ttl_ms = 60000;
  uint32_t publish_retry_ms = 500;   // PutDone re-sent with the same identity after this (T1)
  uint32_t master_rpc_timeout_ms = 5000;
  // Capacity eviction: when a claim finds no free slot, the coldest complete cohorts that no reader
  // holds are selected (bounded per round) and removed route first; their slots then serve the claim.
  bool eviction = true;
  uint64_t eviction_max_bytes_per_round = 256ull << 20;
  // The pressure step is the only caller of eviction: a round at most this often (each selects at
  // most eviction_max_bytes_per_round: what claims wait for and the watermark lacks, less the debt).
  uint32_t eviction_interval_ms = 200;
  bool eviction_tp_cohorts = true;  // evict the other TP ranks' copies of a group with it
  // eviction_order: prefix_depth (true) or tier (false, the default). prefix_depth: capacity
  // eviction (after remote-complete cohorts) and the hot tier's write-backs take what went stale
  // first - untouched while the owner admitted eviction_stale_turnover segments' worth of bytes -
  // then the deepest pages of their prefixes (content_depths; carried with write-backs and replica
  // tasks), least recently read first: every session keeps its prefix, which a restore can use,
  // instead of an LRU's whole histories of the sessions read last (DepthOrder).
  // eviction_stale_turnover: auto (0 here, the default) sets the horizon from the re-read intervals
  // the owner sees (DepthOrder::kAdaptive): no per-workload tuning; a number fixes it in segments.
  bool eviction_prefix_depth = false;
  double eviction_stale_turnover = 0;
  // Pressure: once no grant is left to carve, each tick keeps this share of a slot class's slots
  // free by evicting ahead of the claims (bounded per round, in-flight bytes counted), so that a
  // put does not wait for a route removal. 0: evict only when a claim finds no slot.
  double eviction_free_watermark = 0.02;
  // Dynamic mode (no expected capacity): a grant whose every slot stayed Free this long is given
  // back whole (its memory released to the system; a later claim carves it again). 0: never.
  // With an expected capacity the warm-up grants are the floor and the limit: none is shrunk (S5).
  uint32_t idle_grant_shrink_ms = 30000;
  // Owner-hot write-back (replica_writeback_hot_capacity_ratio; 0 = off): live entries also sit in
  // a hot W-TinyLFU tier of this share of the segment; a cohort it evicts gets a copy on a
  // target-role owner (a replica task), and with writeback_demote its copies here then go (single-
  // copy demotion: only while the remote copy of the same version stays). A write-back not done
  // within writeback_timeout_ms is given up (the entry stays; a later eviction may ask again).
  double hot_writeback_ratio = 0;
  // Spill (spill_free_ratio; 0 = off): a put that goes live while fewer than this share of its slot
  // class's slots are free or still to carve (of all the segment could hold) is spilled - written back to a
  // target-role owner at once and then demoted here (single-copy), so its primary ends on the CPU
  // owner and the local pool keeps what it held instead of evicting it. The put's future does not
  // wait for it; a spill that finds no target or times out leaves the put here, as any put.
  double spill_free_ratio = 0;
  bool writeback_demote = true;
  uint32_t writeback_timeout_ms = 60000;
  uint32_t get_start_wait_ms = 2000;    // get_start waits this long for the master on remote keys
  // A target owner's replica pipeline (E16bh): at most this many replica-task fetches in flight
  // across keys (1-64), each key's strictly one at a time (a flight per key).
  uint32_t replica_task_max_inflight = 64;
  // Set from the cluster config (not a key): the only owner never asks the master about a miss.
  bool alone_in_cluster = false;
  // Bounds of the owner's queues (not config keys: the defaults are the bounds; tests lower them).
  // Past a bound the owner refuses, in words and counted, instead of growing without end.
  struct Limits {
    size_t claim_waiters = 4096;       // put_starts waiting for slots: the next is refused (claim_turn)
    size_t publish_jobs = 16384;       // committed batches waiting for the master: put_start is refused
    size_t remove_jobs = 16384;        // route removals in flight (replaced versions, remove_prefix)
    size_t reclaims = 4096;            // reclaim transactions in flight: capacity eviction pauses
    size_t flights = 65536;            // remote-get flights: a new remote key is a miss
    size_t exists_questions = 4096;    // exists waiting for the master: answered with the local prefix
    size_t pending_gets = 4096;        // get_starts waiting for the master: the next is answered now
    size_t handles = 65536;            // get handles not consumed: get_start refuses (Timeout)
    size_t writebacks = 16384;         // write-back jobs in flight: hot-tier evictions are not copied
    size_t replica_retries = 4096;     // replica fetches waiting to be tried again: a failure is final
    size_t sessions = 4096;            // client sessions: a Hello past it is refused (NoSpace)
  } limits;
};

}  // namespace fluxon
