#include "fluxon/runtime/frequency_sketch.hpp"

#include <algorithm>

namespace fluxon {

namespace {

constexpr uint64_t kSeeds[4] = {0x97cb3127a3f1d1c5ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull,
                                0x9e3779b97f4a7c15ull};
constexpr uint64_t kResetMask = 0x7777777777777777ull;  // clears each nibble's top bit after >> 1

uint64_t next_pow2(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

uint64_t mix(uint64_t h, uint64_t seed) {
  h = (h ^ seed) * 0xbf58476d1ce4e5b9ull;
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 29);
}

}  // namespace

FrequencySketch::FrequencySketch(uint64_t expected_entries) {
  const uint64_t width = next_pow2(std::max<uint64_t>(64, expected_entries));
  width_mask_ = width - 1;
  words_per_row_ = width / 16;
  table_.assign(4 * words_per_row_, 0);
  sample_size_ = 10 * width;
}

uint32_t FrequencySketch::index_of(uint64_t hash, int row) const {
  return static_cast<uint32_t>(mix(hash, kSeeds[row]) & width_mask_);
}

uint32_t FrequencySketch::frequency(uint64_t hash) const {
  uint32_t f = 15;
  for (int r = 0; r < 4; ++r) {
    const uint32_t i = index_of(hash, r);
    const uint64_t word = table_[r * words_per_row_ + (i >> 4)];
    f = std::min<uint32_t>(f, static_cast<uint32_t>((word >> ((i & 15) * 4)) & 0xf));
  }
  return f;
}

void FrequencySketch::increment(uint64_t hash) {
  // Conservative update: only the minimal counters grow, which tightens the estimate.
  uint32_t idx[4];
  uint32_t vals[4];
  uint32_t min = 15;
  for (int r = 0; r < 4; ++r) {
    idx[r] = index_of(hash, r);
    vals[r] = static_cast<uint32_t>((table_[r * words_per_row_ + (idx[r] >> 4)] >> ((idx[r] & 15) * 4)) & 0xf);
    min = std::min(min, vals[r]);
  }
  if (min == 15) return;
  for (int r = 0; r < 4; ++r) {
    if (vals[r] == min) table_[r * words_per_row_ + (idx[r] >> 4)] += uint64_t(1) << ((idx[r] & 15) * 4);
  }
  if (++additions_ >= sample_size_) reset();
}

void FrequencySketch::reset() {
  for (auto& w : table_) w = (w >> 1) & kResetMask;
  additions_ /= 2;
  resets_++;
}

}  // namespace fluxon
