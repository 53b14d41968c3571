#include "fluxon/core/sessions.hpp"

namespace fluxon {

std::optional<Sessions::Session> Sessions::close(uint64_t session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return std::nullopt;
  Session s = std::move(it->second);
  sessions_.erase(it);
  return s;
}

void Sessions::release_holdings(ReservePool& pool, const Session& s) {
  for (uint64_t hid : s.holdings) {
    auto h = holdings_.find(hid);
    if (h == holdings_.end()) continue;
    pool.release_holder(h->second.slot);
    holdings_.erase(h);
  }
}

uint64_t Sessions::hold(ReservePool& pool, SlotRef slot, uint64_t session) {
  const uint64_t id = next_holding_++;  // non-zero, unique per export
  pool.add_holder(slot);
  holdings_.emplace(id, Holding{slot, session});
  sessions_[session].holdings.insert(id);
  return id;
}

void Sessions::release(ReservePool& pool, uint64_t id, uint64_t session) {
  auto it = holdings_.find(id);
  if (it == holdings_.end() || it->second.session != session) return;  // identity beats flags
  pool.release_holder(it->second.slot);
  if (auto s = sessions_.find(session); s != sessions_.end()) s->second.holdings.erase(id);
  holdings_.erase(it);
}

}  // namespace fluxon
