// GetLeases: prepared remote gets, their leases on their sources, and the ended ids (T1).
#include "fluxon/master/get_leases.hpp"

#include <algorithm>
#include <iterator>

namespace fluxon {

bool GetLeases::start(const GetKey& gk, Flight f) {
  if (gets_.size() >= bound_) {  // the bound: no new lease, a miss for now
    counters.refused_gets_total++;
    return false;
  }
  reads_[{gk.first, f.source_node}]++;
  gets_.emplace(gk, f);
  counters.get_started_total++;
  return true;
}

void GetLeases::end(std::map<GetKey, Flight>::iterator it, Millis now) {
  auto f = reads_.find({it->first.first, it->second.source_node});
  if (f != reads_.end() && --f->second == 0) reads_.erase(f);
  note_ended(it->first, it->second.get_id, now);
  gets_.erase(it);
}

bool GetLeases::end(const GetKey& gk, Millis now) {
  auto it = gets_.find(gk);
  if (it == gets_.end()) return false;
  end(it, now);
  return true;
}

void GetLeases::note_ended(const GetKey& gk, uint64_t get_id, Millis now) {
  const uint64_t* had = ended_gets_.find(gk);
  ended_gets_.set(gk, had ? std::max(*had, get_id) : get_id, now + ttl_ms_);
}

void GetLeases::forget_requester(uint32_t node, Millis now) {
  for (auto it = gets_.begin(); it != gets_.end();) {
    auto next = std::next(it);
    if (it->first.second == node) end(it, now);
    it = next;
  }
  ended_gets_.erase_if([node](const GetKey& k, uint64_t) { return k.second == node; });
}

void GetLeases::expire(Millis now) {
  ended_gets_.expire(now);
  for (auto it = gets_.begin(); it != gets_.end();) {
    auto next = std::next(it);
    if (now >= it->second.deadline) {
      counters.get_ttl_expired_total++;
      end(it, now);
    }
    it = next;
  }
}

std::string GetLeases::derived_bounds_violation() const {
  if (gets_.size() > bound_)
    return "gets: " + std::to_string(gets_.size()) + " over the bound " + std::to_string(bound_);
  uint64_t leases = 0;
  for (const auto& [k, n] : reads_) {
    if (n == 0) return "reads: an entry of count 0 for '" + k.first + "'";
    leases += n;
  }
  if (leases != gets_.size() || reads_.size() > gets_.size())
    return "reads: " + std::to_string(reads_.size()) + " entries counting " + std::to_string(leases) +
           " leases for " + std::to_string(gets_.size()) + " gets";
  return "";
}

}  // namespace fluxon
