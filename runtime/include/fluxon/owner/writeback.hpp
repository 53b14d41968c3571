// WriteBack: owner-hot write-back and single-copy demotion (the design's E16ap). Live entries
// also sit in a hot W-TinyLFU tier smaller than the segment; when it evicts a key, the key's exact
// cohort (A1: the atomic group, with the other TP ranks' groups) gets a copy on a target-role owner
// through the replica tasks the master queues (WriteBack, re-sent until a target holds every key),
// and, with writeback_demote, the backed cohorts are handed back (on_batch_reply) for one fenced
// reclaim transaction with demote set (Reclaim), which the master fences only while the remote copy
// of the same version stays. Nothing here waits: capacity eviction may take the cohort first (S3),
// a lost reply is answered again (T1: WriteBack is idempotent), and a write-back that does not
// finish is given up, the entries staying.
//
// Bound: Limits::writebacks jobs in flight (past it a hot-tier eviction is not copied, counted).
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fluxon/owner/owner_shared.hpp"
#include "fluxon/core/retry_table.hpp"

namespace fluxon {

class WriteBack {
 public:
  using CohortId = LocalIndex::CohortId;
  using Entry = LocalIndex::Entry;
  explicit WriteBack(OwnerShared& s) : s_(s) {}
  // A job is asked about again this often (or publish_retry_ms, if less) until every key is backed.
  static constexpr Millis kBackedPollMs = 100;

  // Entries that went live enter the resident tier; with a hot tier they are admitted together
  // (A1: one reply's whole cohorts), and the cohorts it evicts are written back.
  // puts: these are a put's (spill applies to them: a fetched copy is never spilled).
  void admit(const std::vector<LiveEntry>& live, Millis now, Outbox& out, bool puts = false);
  // A write_through put went live: the same WriteBack, re-sent until a target-role owner holds
  // every key (inclusive: the copies here stay, marked remote-complete); then, or once it cannot
  // be, the put's future completes (take_write_through_done).
  void write_through(uint64_t put_id, uint64_t session, std::vector<CohortId> cohorts, std::vector<std::string> keys,
                     std::vector<Version> versions, Millis now, Outbox& out);
  struct WriteThroughDone {
    uint64_t put_id = 0, session = 0;
    Status status;
  };
  std::vector<WriteThroughDone> take_write_through_done() { return std::exchange(through_done_, {}); }
  // The master's unbacked notice: these keys' last target-role copy went. A remote-complete cohort
  // among them is this owner's own again (the mark withdrawn) and rejoins the hot tier, to be
  // written back again in its turn.
  void unbacked(const std::vector<std::string>& keys, Millis now, Outbox& out);
  // Capacity eviction took `cohort` first: its write-back has nothing left to copy or demote.
  void cohort_evicted(CohortId cohort);

  // The answer to a WriteBack: with writeback_demote, the exact cohort sets now backed on a target
  // (each job's: one demotion transaction each); their jobs have ended.
  std::vector<std::vector<CohortId>> on_batch_reply(uint64_t token, Envelope& reply);
  void retry(Millis now, Outbox& out);
  bool owns_batch(uint64_t token) const { return batches_.count(token) != 0; }
  // A write-back copies this cohort now (capacity eviction takes it last: the copy would be lost).
  bool writing_back(CohortId cohort) const { return job_of_.count(cohort) != 0; }
  size_t pending() const { return jobs_.size(); }

 private:
  struct Job {
    std::vector<CohortId> cohorts;
    std::vector<std::string> keys;
    std::vector<Version> versions;
    Millis next_send = 0, deadline = 0;
    uint64_t through_put = 0, through_session = 0;  // a write_through put's job (0: a hot-tier write-back)
    bool spill = false;  // a spilled put's: demoted once backed, whatever writeback_demote says
  };
  // The first phase of many jobs travels in one WriteBack (G8's batching for write-back): a batch
  // remembers its jobs in order, and its reply is split among those still waiting for it.
  struct Batch {
    std::vector<std::pair<uint64_t, size_t>> jobs;  // (job, its keys in the request)
    Millis expires = 0;  // no reply by then: forgotten (its jobs are sent again in a new batch)
  };
  // Live entries join the hot tier; what it lets go (its share, the depth order) is written back.
  void enter_hot(const std::vector<LiveEntry>& live, Millis now, Outbox& out);
  void write_back(const std::vector<std::pair<std::string, LocalIndex::ResidentRef>>& evicted, Millis now,
                  Outbox& out, bool spill = false);
  // Spill: fewer than spill_free_ratio of this slot class's slots are free or still to carve.
  bool pressured(uint64_t slot_size) const;
  void send_batch(const std::vector<uint64_t>& jobs, Millis now, Outbox& out);
  // One job's statuses: true when every key is backed (the job has ended).
  bool settle(uint64_t id, const wire::WriteBackStatus* status);
  // The job ends; a write_through job's put learns `why` (ok: every key is backed).
  void end(uint64_t id, Status why = Status(Code::kInternal, "write-back ended"));

  OwnerShared& s_;
  RetryTable<Job> jobs_;
  std::map<CohortId, uint64_t> job_of_;  // cohort -> the job that carries it
  std::map<uint64_t, Batch> batches_;    // by master token
  std::set<std::pair<Millis, uint64_t>> deadlines_;  // (give-up time, job)
  uint64_t next_job_ = 1;
  std::vector<WriteThroughDone> through_done_;
};

}  // namespace fluxon
