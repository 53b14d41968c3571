#include "fluxon/owner/sessions.hpp"

#include <vector>

namespace fluxon {

std::optional<Sessions::Session> Sessions::close(uint64_t session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return std::nullopt;
  Session s = std::move(it->second);
  sessions_.erase(it);
  return s;
}

size_t Sessions::release_holdings(ReservePool& pool, uint64_t session) {
  std::vector<uint64_t> ids;
  holdings_.for_each([&](uint64_t id, const Holding& h) {
    if (h.session == session) ids.push_back(id);
  });
  for (uint64_t id : ids) {
    pool.release_holder(holdings_.find(id)->slot);
    holdings_.erase(id);
  }
  return ids.size();
}

uint64_t Sessions::hold(ReservePool& pool, SlotRef slot, uint64_t session) {
  const uint64_t id = next_holding_++;  // non-zero, unique per export
  pool.add_holder(slot);
  holdings_.try_emplace(id, Holding{slot, session});
  return id;
}

void Sessions::release(ReservePool& pool, uint64_t id, uint64_t session) {
  const Holding* h = holdings_.find(id);
  if (h == nullptr || h->session != session) return;  // identity beats flags
  pool.release_holder(h->slot);
  holdings_.erase(id);
}

}  // namespace fluxon
