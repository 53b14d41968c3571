// Eviction: which cohorts capacity pressure takes (S1, S3, S4). It selects; it calls nobody: each
// cohort it returns becomes one reclaim transaction (reclaim.hpp), whose bytes are the selection
// debt until it ends — a round selects what is needed less that debt.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fluxon/owner/local_index.hpp"
#include "fluxon/runtime/reserve_pool.hpp"

namespace fluxon {

class Eviction {
 public:
  struct Config {
    bool enabled = true;
    uint64_t max_bytes_per_round = 256ull << 20;
    double free_watermark = 0;  // with no grant left to carve, keep this share of each class free
    // The recoverable-first pass (remote-complete cohorts) judges at most this many entries of each
    // resident-tier shard per round, from the cold end; the later passes follow.
    // Unbounded, a round cost a walk of every entry per pass (0.25 s at 250,000 entries).
    uint64_t scan_limit = 16384;
  };
  explicit Eviction(Config cfg) : cfg_(cfg) {}

  // What the owner says of a cohort: a transaction owns it (never selected), or a write-back is
  // copying it (pinned: selected only when nothing else can go).
  struct Marks {
    std::function<bool(LocalIndex::CohortId)> taken;
    std::function<bool(LocalIndex::CohortId)> pinned;
    // Pages a put on its way continues (PutPath::continued): never a leaf (null: none).
    const std::unordered_set<std::string>* continued = nullptr;
  };
  // Cold, live, unheld entries worth `bytes` less `debt` (slots of `slot_size` first, then any
  // class), at most max_bytes_per_round, never of a taken cohort; the cohorts they belong to, in
  // selection order. Recoverable first: remote-complete cohorts (their copy on a target owner
  // serves the next hit); then, with prefix chains, leaves; then the tier's order; pinned last.
  // The selected entries leave the resident tier. Empty when nothing is needed or nothing can go.
  // `drain`: a grant being drained for this class (ReservePool::drain_for): the other classes'
  // entries come from that grant only, so it empties whole instead of slots freed here and there.
  std::vector<LocalIndex::CohortId> select(LocalIndex& index, const ReservePool& pool, uint64_t slot_size,
                                           uint64_t bytes, uint64_t debt, const Marks& marks,
                                           std::optional<uint32_t> drain = std::nullopt);
  // The free-slot watermark's deficits, (slot class, bytes) to evict ahead of claims: per class, the
  // watermark's share of its slots plus what claims took since the last call (the rate the next
  // round, an eviction interval away, must stay ahead of), less the free slots.
  std::vector<std::pair<uint64_t, uint64_t>> deficits(const ReservePool& pool);

 private:
  Config cfg_;
  std::map<uint64_t, uint64_t> claimed_seen_;  // slot class -> pool.claimed() at the last look
};

}  // namespace fluxon
