// RouteRemoval: routes leave the master before their slots leave the owner (S2). Each job is one
// RemoveRoutes request, re-sent with the same items until the master answers (T1); an item a
// remote reader still fences (activity fence) is asked again later, the rest give their slots'
// routes up. Declared bound: OwnerCoreConfig::Limits::remove_jobs (capacity eviction pauses there).
#pragma once
#include <cstdint>
#include <vector>

#include "fluxon/owner/owner_shared.hpp"
#include "fluxon/core/retry_table.hpp"

namespace fluxon {

class RouteRemoval {
 public:
  explicit RouteRemoval(OwnerShared& s) : s_(s) {}

  // One RemoveRoutes job for these items, sent now.
  void queue(Removals items, Millis now, Outbox& out);
  // An answer to one of this component's tokens: the slots no master route references any more.
  std::vector<SlotRef> on_reply(uint64_t token, Envelope& reply, Millis now);
  void retry_due(Millis now, Outbox& out);
  void resend_all(Millis now, Outbox& out);  // the master came back
  bool owns(uint64_t token) const { return jobs_.id_of(token).has_value(); }
  size_t size() const { return jobs_.size(); }
  bool full() const { return jobs_.size() >= s_.cfg.limits.remove_jobs; }

 private:
  struct Job {
    Removals items;
    Millis next_send = 0;
  };
  void send(uint64_t id, Job& job, Millis now, Outbox& out);

  OwnerShared& s_;
  RetryTable<Job> jobs_;
  uint64_t next_job_ = 1;
};

}  // namespace fluxon
