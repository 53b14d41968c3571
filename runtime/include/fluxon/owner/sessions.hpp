// Sessions: the clients attached to an owner and what each holds — its open put plans, its get
// handles and its holdings (a reader's reference on a slot, exported with a non-zero id unique per
// export). A session that closes gives everything back: the owner releases its plans and handles,
// and its holdings go here. Identity beats flags: a holding is released only by its own session.
#pragma once
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "fluxon/runtime/flat_map.hpp"
#include "fluxon/runtime/reserve_pool.hpp"

namespace fluxon {

class Sessions {
 public:
  struct Session {
    std::unordered_set<uint64_t> plans, handles;
  };
  struct Holding {
    SlotRef slot;
    uint64_t session = 0;
  };

  uint64_t open() {
    const uint64_t id = next_session_++;
    sessions_[id];
    return id;
  }
  bool contains(uint64_t session) const { return sessions_.count(session) != 0; }
  size_t size() const { return sessions_.size(); }
  // The session's records (made on first use, as a request of a live session may be the first).
  Session& of(uint64_t session) { return sessions_[session]; }
  void forget_handle(uint64_t session, uint64_t handle) {
    if (auto s = sessions_.find(session); s != sessions_.end()) s->second.handles.erase(handle);
  }
  // The session leaves: what it held, for the owner to release (plans, handles), then
  // release_holdings() for the holdings still exported.
  std::optional<Session> close(uint64_t session);
  // Releases every holding of `session` (a scan: sessions end rarely, reads hold and release by the
  // million); returns how many.
  size_t release_holdings(ReservePool& pool, uint64_t session);

  // A reader's reference on `slot` for `session`: one more holder on the slot (S2).
  uint64_t hold(ReservePool& pool, SlotRef slot, uint64_t session);
  // Releases holding `id` if it is `session`'s.
  void release(ReservePool& pool, uint64_t id, uint64_t session);
  const Holding* holding(uint64_t id) const { return holdings_.find(id); }
  size_t holders() const { return holdings_.size(); }

 private:
  std::unordered_map<uint64_t, Session> sessions_;
  // Inline entries: a read's hold and release allocate nothing.
  FlatMap<uint64_t, Holding, MixHash> holdings_;
  uint64_t next_session_ = 1, next_holding_ = 1;
};

}  // namespace fluxon
