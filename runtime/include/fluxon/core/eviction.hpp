// Eviction: which cohorts capacity pressure takes (S1, S3, S4), and the selection debt — the bytes
// chosen whose route removal is still on its way. It selects and keeps accounts; it calls nobody:
// the owner removes what it returns, route first (S2), and settles each slot when the master no
// longer routes to it.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fluxon/core/local_index.hpp"
#include "fluxon/runtime/reserve_pool.hpp"

namespace fluxon {

class Eviction {
 public:
  struct Config {
    bool enabled = true;
    uint64_t max_bytes_per_round = 256ull << 20;
    double free_watermark = 0;  // with no grant left to carve, keep this share of each class free
  };
  explicit Eviction(Config cfg) : cfg_(cfg) {}

  // Cold, live, unheld entries worth `bytes` less the debt (slots of `slot_size` first, then any
  // class), at most max_bytes_per_round; the cohorts they belong to, in selection order. The
  // selected entries leave the resident tier. Empty when nothing is needed or nothing can go.
  std::vector<LocalIndex::CohortId> select(LocalIndex& index, const ReservePool& pool, uint64_t slot_size,
                                           uint64_t bytes);
  // The free-slot watermark's deficits: (slot class, bytes) to evict ahead of claims.
  std::vector<std::pair<uint64_t, uint64_t>> deficits(const ReservePool& pool) const;

  // A chosen slot's bytes are a debt until settle() (its route is gone); settle() says whether it was.
  void chose(SlotRef slot, uint64_t bytes);
  bool settle(SlotRef slot);
  uint64_t debt_bytes() const { return debt_bytes_; }

 private:
  Config cfg_;
  std::unordered_map<uint64_t, uint64_t> debt_;  // packed slot -> bytes selected for eviction
  uint64_t debt_bytes_ = 0;
};

}  // namespace fluxon
