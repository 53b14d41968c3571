// Count-min sketch of 4-bit counters with periodic aging: the frequency estimator of W-TinyLFU
// (Einziger, Friedman, Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", 2017).
// Depth 4; each row is a power-of-two array of 4-bit counters packed 16 to a uint64. After
// `sample_size` increments every counter is halved, so old popularity fades.
#pragma once
#include <cstdint>
#include <vector>

namespace fluxon {

class FrequencySketch {
 public:
  // Sized for about `expected_entries` distinct keys (at least 64).
  explicit FrequencySketch(uint64_t expected_entries);

  // Frequency estimate in [0, 15].
  uint32_t frequency(uint64_t hash) const;
  // Counts one access; ages the sketch when the sample is full.
  void increment(uint64_t hash);
  uint64_t sample_size() const { return sample_size_; }
  uint64_t resets() const { return resets_; }

 private:
  uint32_t index_of(uint64_t hash, int row) const;
  void reset();

  std::vector<uint64_t> table_;  // 4 rows of (width / 16) words each
  uint64_t width_mask_ = 0;      // counters per row - 1
  uint64_t words_per_row_ = 0;
  uint64_t sample_size_ = 0;
  uint64_t additions_ = 0;
  uint64_t resets_ = 0;
};

}  // namespace fluxon
