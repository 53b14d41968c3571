// Count-min sketch of 4-bit counters with periodic aging: the frequency estimator of W-TinyLFU
// (Einziger, Friedman, Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", 2017).
// Depth 4, laid out in 64-byte blocks: the four counters of a key sit in one cache line, so an
// access costs one memory miss. Counters are updated with atomic CAS (readers record accesses
// concurrently under a shared lock). After `sample_size` increments every counter is halved, so
// old popularity fades.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>

namespace fluxon {

class FrequencySketch {
 public:
  // Sized for about `expected_entries` distinct keys (at least 64).
  explicit FrequencySketch(uint64_t expected_entries);

  // Frequency estimate in [0, 15].
  uint32_t frequency(uint64_t hash) const;
  // Counts one access; ages the sketch when the sample is full. Thread-safe.
  void increment(uint64_t hash);
  uint64_t sample_size() const { return sample_size_; }
  uint64_t resets() const { return resets_.load(std::memory_order_relaxed); }

 private:
  void reset();
  static uint64_t spread_of(uint64_t h) {
    h *= 0x31848bab9e3779b9ull;
    return h ^ (h >> 28);
  }
  uint64_t block_of(uint64_t hash) const { return (spread_of(hash) >> 32) & (blocks_ - 1); }

  std::unique_ptr<std::atomic<uint64_t>[]> table_;
  uint64_t blocks_ = 0;  // power of two; 8 words (64 bytes) each
  uint64_t sample_size_ = 0;
  std::atomic<uint64_t> additions_{0};
  std::atomic<uint64_t> resets_{0};
  std::atomic<bool> resetting_{false};
};

}  // namespace fluxon
