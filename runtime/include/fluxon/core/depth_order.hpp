// DepthOrder: the prefix-depth eviction order (owner key eviction_order: prefix_depth). A restore
// stops at a request's first miss, so a page is worth a hit only while every page before it stays:
// the shallow pages of a prefix are worth the most, and under a loop of sessions that each re-read
// their whole history (multi-turn serving) recency points at exactly the pages needed next. The
// order takes first what went stale - untouched while the owner admitted `stale_bytes` (a few
// segments' worth): a finished session's prefix does not squat forever - oldest first; then the
// deepest pages, the least recently touched of a depth first. Plain state: the clock is the bytes
// admitted, never time.
//
// The horizon that fits depends on how long a live prefix waits to be read again against the
// capacity: a fixed one either lets live sessions go stale (too short) or keeps finished ones (too
// long). kAdaptive follows the workload instead: every kAdaptTouches reads it sets the horizon to
// twice the 90th percentile of the re-read intervals it saw (the bytes admitted between two reads of
// a key, in power-of-two buckets, the older counts halved at each setting); until the first setting
// nothing is stale.
#pragma once
#include <array>
#include <bit>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace fluxon {

class DepthOrder {
 public:
  static constexpr uint32_t kUnknown = UINT32_MAX;  // no depth given: ordered as the deepest
  static constexpr uint64_t kAdaptive = 0;           // stale_bytes: the horizon follows the re-reads
  static constexpr uint64_t kAdaptTouches = 4096;    // reads between two settings of that horizon

  explicit DepthOrder(uint64_t stale_bytes)
      : adaptive_(stale_bytes == kAdaptive), stale_bytes_(adaptive_ ? UINT64_MAX : stale_bytes) {}

  // key enters (or re-enters) the order at `depth`; the clock advances by its weight.
  void admit(const std::string& key, uint32_t depth, uint64_t weight) {
    erase(key);
    clock_ += weight;
    place(key, Item{depth, clock_, ++seq_});
  }
  // key was read: it is fresh again and the most recent of its depth.
  void touch(const std::string& key) {
    auto it = items_.find(key);
    if (it == items_.end()) return;
    const Item item{it->second.depth, clock_, ++seq_};
    if (adaptive_) observe_reread(clock_ - it->second.tick);
    unplace(key, it->second);
    items_.erase(it);
    place(key, item);
  }
  void erase(const std::string& key) {
    auto it = items_.find(key);
    if (it == items_.end()) return;
    unplace(key, it->second);
    items_.erase(it);
  }
  bool contains(const std::string& key) const { return items_.count(key) != 0; }
  size_t size() const { return items_.size(); }
  uint64_t clock() const { return clock_; }
  // The horizon now: untouched while more than this was admitted is stale (UINT64_MAX: never).
  uint64_t stale_bytes() const { return stale_bytes_; }
  bool adaptive() const { return adaptive_; }
  bool stale(const std::string& key) const {
    auto it = items_.find(key);
    return it != items_.end() && clock_ - it->second.tick > stale_bytes_;
  }

  // The depth a page may have and not be the next victim: the deepest one here, when nothing is
  // stale (a stale page goes first, whatever comes); nullopt then, or when empty. A page deeper
  // than it, admitted now, would be taken next (equal depths: the older first).
  std::optional<uint32_t> keep_cut() const {
    if (by_depth_.empty() || clock_ - std::get<1>(*by_seq_.begin()) > stale_bytes_) return std::nullopt;
    return std::get<0>(*by_depth_.begin());
  }

  // Visits keys in eviction order until `fn` returns true (the visit stops); fn must not change
  // the order (collect, then erase).
  template <class Fn>
  void visit(Fn&& fn) const {
    for (const auto& [seq, tick, key] : by_seq_) {  // stale first, the least recent first
      if (clock_ - tick <= stale_bytes_) break;    // ticks grow with seq: the rest are fresh
      if (fn(key)) return;
    }
    for (const auto& [depth, seq, tick, key] : by_depth_) {  // then the deepest, least recent first
      if (clock_ - tick > stale_bytes_) continue;             // visited above
      if (fn(key)) return;
    }
  }

 private:
  struct Item {
    uint32_t depth;
    uint64_t tick;  // the clock when it was admitted or last read
    uint64_t seq;   // the order of those events
  };
  using DepthKey = std::tuple<uint32_t, uint64_t, uint64_t, std::string>;  // depth, seq, tick, key
  struct Deeper {  // depth descending, then least recent first
    bool operator()(const DepthKey& a, const DepthKey& b) const {
      if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
      return std::get<1>(a) < std::get<1>(b);  // seq is unique
    }
  };
  void place(const std::string& key, Item item) {
    items_.emplace(key, item);
    by_seq_.emplace(item.seq, item.tick, key);
    by_depth_.emplace(item.depth, item.seq, item.tick, key);
  }
  void unplace(const std::string& key, const Item& item) {
    by_seq_.erase({item.seq, item.tick, key});
    by_depth_.erase({item.depth, item.seq, item.tick, key});
  }
  // kAdaptive: one re-read after `interval` bytes were admitted; every kAdaptTouches of them the
  // horizon becomes twice the 90th percentile's bucket bound, and the counts fade by half.
  void observe_reread(uint64_t interval) {
    reread_buckets_[std::bit_width(interval)]++;
    if (++rereads_ % kAdaptTouches != 0) return;
    uint64_t total = 0;
    for (uint64_t c : reread_buckets_) total += c;
    uint64_t below = 0;
    for (size_t b = 0; b < reread_buckets_.size(); ++b) {
      below += reread_buckets_[b];
      if (10 * below >= 9 * total) {  // bucket b holds intervals below 2^b
        stale_bytes_ = b >= 63 ? UINT64_MAX : uint64_t(2) << b;
        break;
      }
    }
    for (uint64_t& c : reread_buckets_) c /= 2;
  }

  bool adaptive_;
  uint64_t stale_bytes_;
  std::array<uint64_t, 65> reread_buckets_{};  // kAdaptive: re-reads by bit_width(interval)
  uint64_t rereads_ = 0;
  uint64_t clock_ = 0, seq_ = 0;
  std::unordered_map<std::string, Item> items_;
  std::set<std::tuple<uint64_t, uint64_t, std::string>> by_seq_;  // seq, tick, key
  std::set<DepthKey, Deeper> by_depth_;
};

}  // namespace fluxon
