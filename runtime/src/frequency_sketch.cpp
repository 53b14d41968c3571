#include "fluxon/runtime/frequency_sketch.hpp"

#include <algorithm>

namespace fluxon {

namespace {

constexpr uint64_t kResetMask = 0x7777777777777777ull;  // clears each nibble's top bit after >> 1

uint64_t next_pow2(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Row r of a key: word (2r + one bit of the hash) of its block, nibble from 4 more bits.
struct Slot {
  uint32_t word;
  uint32_t shift;
};
inline Slot slot_of(uint64_t block, uint64_t spread, int r) {
  const uint64_t bits = spread >> (r * 8);
  return {uint32_t(block * 8 + r * 2 + (bits & 1)), uint32_t(((bits >> 1) & 15) * 4)};
}

}  // namespace

FrequencySketch::FrequencySketch(uint64_t expected_entries) {
  const uint64_t counters = next_pow2(std::max<uint64_t>(64, expected_entries));
  blocks_ = std::max<uint64_t>(1, counters / 32);  // 4 rows x 16 nibbles x 8 words / 4 rows ~ 32 keys/block
  table_.reset(new std::atomic<uint64_t>[blocks_ * 8]);
  for (uint64_t i = 0; i < blocks_ * 8; ++i) table_[i].store(0, std::memory_order_relaxed);
  sample_size_ = 10 * counters;
}

uint32_t FrequencySketch::frequency(uint64_t hash) const {
  const uint64_t spread = spread_of(hash);
  const uint64_t block = block_of(hash);
  uint32_t f = 15;
  for (int r = 0; r < 4; ++r) {
    const Slot s = slot_of(block, spread, r);
    f = std::min<uint32_t>(f, uint32_t((table_[s.word].load(std::memory_order_relaxed) >> s.shift) & 0xf));
  }
  return f;
}

void FrequencySketch::increment(uint64_t hash) {
  const uint64_t spread = spread_of(hash);
  const uint64_t block = block_of(hash);
  bool added = false;
  for (int r = 0; r < 4; ++r) {
    const Slot s = slot_of(block, spread, r);
    std::atomic<uint64_t>& w = table_[s.word];
    // Relaxed load and store, not a locked read-modify-write: two readers racing on one word may
    // lose an increment, which a frequency *estimate* tolerates; a carry into the neighbouring
    // counter cannot happen because a saturated counter is never incremented.
    const uint64_t cur = w.load(std::memory_order_relaxed);
    if (((cur >> s.shift) & 0xf) != 0xf) {
      w.store(cur + (uint64_t(1) << s.shift), std::memory_order_relaxed);
      added = true;
    }
  }
  if (added) {
    const uint64_t n = additions_.load(std::memory_order_relaxed) + 1;
    additions_.store(n, std::memory_order_relaxed);
    if (n >= sample_size_) reset();
  }
}

void FrequencySketch::reset() {
  bool expected = false;
  if (!resetting_.compare_exchange_strong(expected, true)) return;  // one thread ages the sketch
  for (uint64_t i = 0; i < blocks_ * 8; ++i) {
    uint64_t cur = table_[i].load(std::memory_order_relaxed);
    while (!table_[i].compare_exchange_weak(cur, (cur >> 1) & kResetMask, std::memory_order_relaxed)) {
    }
  }
  additions_.store(sample_size_ / 2, std::memory_order_relaxed);
  resets_.fetch_add(1, std::memory_order_relaxed);
  resetting_.store(false);
}

}  // namespace fluxon
