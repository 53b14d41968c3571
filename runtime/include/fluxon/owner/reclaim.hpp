// Reclaim: the owner's side of fenced source reclaim (the design's BatchEvictOwnerSource). Every
// capacity eviction is one transaction over an exact cohort, owned here from selection until its
// slots are Free, the cohort is obsolete, or it is restored to the resident tier (S4): its bytes are
// the selection debt until then.
//
//   kFencing     Fence(epoch) sent; the entries stay visible and readable.
//   (answer)     Fenced: Prepare — every member still this copy, no holder, no put, fetch or
//                re-publication of its key here. Then the entries leave the index and each slot is
//                released in one pool update (route reference and resident holder: Committed -> Free),
//                and Commit(epoch) goes. Busy: Abort(epoch).
//   kCommitting  slots released; waits for the master to remove the exact replicas and the fences.
//   kAborting    waits for the fences to go, then backs off.
//   kWaiting     bounded exponential back-off, then Fence again under a new epoch (an epoch is one
//                attempt: a late duplicate of an ended one gets its ending answer again at the
//                master and installs nothing). After
//                kMaxAttempts the cohort goes back to the resident tier (restored).
//
// Single-copy demotion (E16ap) is the same transaction with `demote`: the write-back found the
// cohort backed on a target-role owner; the master fences it only while that copy stays (Kept
// otherwise: the cohort goes back to the resident tier). Demotions are not selection debt; their
// members end demoted, kept or obsolete (the demote_* counters reconcile them).
//
// Every request is re-sent with the same epoch until answered (T1). Declared bound:
// OwnerCoreConfig::Limits::reclaims (capacity eviction pauses there).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fluxon/owner/owner_shared.hpp"
#include "fluxon/core/retry_table.hpp"

namespace fluxon {

class Reclaim {
 public:
  using Entry = LocalIndex::Entry;
  struct Member {
    std::string key;
    Entry e;
    uint64_t bytes = 0;  // its slot's size (set by begin)
  };
  // Why the owner cannot release this member now (a put, a fetch or a re-publication of its key
  // here), or null. Holders are checked here.
  using BusyCheck = std::function<const char*(const std::string& key, const Entry& e)>;
  enum class Phase : uint8_t { kFencing, kCommitting, kAborting, kWaiting };
  static constexpr uint32_t kMaxAttempts = 8;
  static constexpr Millis kBackoffMs = 25, kMaxBackoffMs = 1000;

  explicit Reclaim(OwnerShared& s) : s_(s) {}

  // A selected exact cohort (its entries have left the resident tier): one transaction, Fence now.
  // demote: a single-copy demotion of a backed cohort rather than a capacity eviction.
  void begin(std::vector<Member> members, Millis now, Outbox& out, bool demote = false);
  void on_reply(uint64_t token, Envelope& reply, Millis now, Outbox& out, const BusyCheck& busy);
  // Unanswered requests again (same epoch); backed-off transactions fence again (new epoch).
  void retry_due(Millis now, Outbox& out);
  void resend_all(Millis now, Outbox& out);  // the master came back
  bool owns(uint64_t token) const { return txns_.id_of(token).has_value(); }
  size_t size() const { return txns_.size(); }
  bool full() const { return txns_.size() >= s_.cfg.limits.reclaims; }
  uint64_t debt_bytes() const { return debt_bytes_; }  // selected bytes not settled yet (S4)
  // A cohort a transaction owns now (selection never takes it twice).
  bool owns_cohort(LocalIndex::CohortId c) const { return cohorts_.count(c) != 0; }

 private:
  struct Txn {
    std::vector<Member> members;
    uint64_t epoch = 0;
    Phase phase = Phase::kFencing;
    uint32_t attempts = 0;
    Millis next_send = 0;
    std::vector<LocalIndex::CohortId> cohorts;  // the cohorts it owns
    bool demote = false;
  };
  void send(uint64_t id, Txn& t, Millis now, Outbox& out);
  // The master fenced the members (or holds no replica of them: `fenced` false): release or abort.
  void prepare(uint64_t id, Txn& t, bool fenced, Millis now, Outbox& out, const BusyCheck& busy);
  void back_off(uint64_t id, Txn& t, Millis now);
  // Members that are no longer the copy selected (replaced, removed) leave the transaction: their
  // slots are the business of whatever replaced them.
  void drop_obsolete(Txn& t);
  void committed(Txn& t);  // every member's slot is Free and its replica gone
  // How a member's transaction ends for it (kKept: a demotion the master refused).
  enum class End { kCommitted, kRestored, kObsolete, kKept };
  void settle(const Txn& t, const Member& m, End how);
  // The transaction ends unreleased: members still this copy go back to the resident tier (ending
  // `current_ends`), the others end obsolete.
  void restore(Txn& t, End current_ends);
  bool is_current(const Member& m) const;
  void finish(typename RetryTable<Txn>::iterator it);  // the transaction ends: its cohorts are free again

  OwnerShared& s_;
  RetryTable<Txn> txns_;
  uint64_t next_id_ = 1;
  uint64_t debt_bytes_ = 0;
  std::map<LocalIndex::CohortId, uint64_t> cohorts_;  // cohort -> the transaction owning it
};

}  // namespace fluxon
