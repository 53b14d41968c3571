// WriteBack: owner-hot write-back and single-copy demotion (the design's E16ap). Live entries
// also sit in a hot W-TinyLFU tier smaller than the segment; when it evicts a key, the key's exact
// cohort (A1: the atomic group, with the other TP ranks' groups) gets a copy on a target-role owner
// through the replica tasks the master queues (WriteBack, re-sent until a target holds every key),
// and, with writeback_demote, this owner's copies then go in one all-or-none Demote that the
// master grants only while the remote copy of the same version stays. Nothing here waits:
// capacity eviction may take the cohort first (S3), a lost reply is answered again (T1: WriteBack
// and Demote are idempotent), and a write-back that does not finish is given up, the entries
// staying.
//
// Demoted copies come back to the router (their routes are gone at the master). Bound:
// Limits::writebacks jobs in flight (past it a hot-tier eviction is not copied, counted).
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fluxon/core/owner_shared.hpp"
#include "fluxon/core/retry_table.hpp"

namespace fluxon {

class WriteBack {
 public:
  using CohortId = LocalIndex::CohortId;
  using Entry = LocalIndex::Entry;
  explicit WriteBack(OwnerShared& s) : s_(s) {}

  // Entries that went live enter the resident tier; with a hot tier they are admitted together
  // (A1: one reply's whole cohorts), and the cohorts it evicts are written back.
  void admit(const std::vector<LiveEntry>& live, Millis now, Outbox& out);
  // Capacity eviction took `cohort` first: its write-back has nothing left to copy or demote.
  void cohort_evicted(CohortId cohort);
  // Answers to this component's tokens. A Demote answer returns the copies it demoted: out of the
  // index, their slots still route_live here (the router gives the routes up).
  void on_batch_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out);
  std::vector<std::pair<std::string, Entry>> on_demote_reply(uint64_t token, Envelope& reply);
  void retry(Millis now, Outbox& out);
  bool owns_batch(uint64_t token) const { return batches_.count(token) != 0; }
  bool owns_demote(uint64_t token) const { return jobs_.id_of(token).has_value(); }
  size_t pending() const { return jobs_.size(); }

 private:
  struct Job {
    std::vector<CohortId> cohorts;
    std::vector<std::string> keys;
    std::vector<Version> versions;
    std::vector<uint64_t> put_ids;
    bool demoting = false;         // every key is backed: the Demote request is out
    Millis next_send = 0, deadline = 0;  // (Demote attempts: jobs_; WriteBack ones: batches_)
  };
  // The first phase of many jobs travels in one WriteBack (G8's batching for write-back): a batch
  // remembers its jobs in order, and its reply is split among those still waiting for it.
  struct Batch {
    std::vector<std::pair<uint64_t, size_t>> jobs;  // (job, its keys in the request)
    Millis expires = 0;  // no reply by then: forgotten (its jobs are sent again in a new batch)
  };
  void write_back(const std::vector<std::pair<std::string, LocalIndex::ResidentRef>>& evicted, Millis now,
                  Outbox& out);
  void send_batch(const std::vector<uint64_t>& jobs, Millis now, Outbox& out);
  void settle(uint64_t id, const wire::WriteBackStatus* status, Millis now, Outbox& out);
  void send_demote(uint64_t id, Job& job, Millis now, Outbox& out);
  void end(uint64_t id);

  OwnerShared& s_;
  RetryTable<Job> jobs_;
  std::map<CohortId, uint64_t> job_of_;  // cohort -> the job that carries it
  std::map<uint64_t, Batch> batches_;    // by master token
  std::set<std::pair<Millis, uint64_t>> deadlines_;  // (give-up time, job)
  uint64_t next_job_ = 1;
};

}  // namespace fluxon
