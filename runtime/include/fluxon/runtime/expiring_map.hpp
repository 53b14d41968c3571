// ExpiringMap: a map whose entries expire, and a bound on how many it keeps. Each entry carries
// its expiry; a queue of (expiry, key) in the order entries were set finds the expired ones
// without a scan (every map of the kind has one time-to-live, so that order is the expiry order).
// Setting a key again queues it again: a queued entry whose expiry no longer matches its key's is
// skipped, and the queue is compacted when such entries outnumber the live ones. At the bound,
// set() first drops the entry that would expire first: `dropped()` counts them (the owner of the
// map exports it). The underlying map is a parameter: std::map / std::unordered_map of K -> Slot,
// or FlatMap (find returns a pointer; prefetch).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <type_traits>
#include <utility>
#include <vector>

namespace fluxon {

template <class V>
struct ExpiringSlot {
  V value{};
  int64_t expires = 0;
};

template <class K, class V, class Map>
class ExpiringMap {
 public:
  using Slot = ExpiringSlot<V>;
  explicit ExpiringMap(size_t bound) : bound_(bound) {}

  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  size_t bound() const { return bound_; }
  uint64_t dropped() const { return dropped_; }

  V* find(const K& key) {
    Slot* s = lookup(key);
    return s ? &s->value : nullptr;
  }
  const V* find(const K& key) const { return const_cast<ExpiringMap*>(this)->find(key); }
  // The value with its expiry.
  Slot* slot(const K& key) { return lookup(key); }
  const Slot* slot(const K& key) const { return const_cast<ExpiringMap*>(this)->lookup(key); }
  // key -> value until `expires` (replacing an entry of key, and its expiry).
  V& set(const K& key, V value, int64_t expires) {
    Slot* s = lookup(key);
    const bool fresh = !s;
    if (fresh) {
      if (map_.size() >= bound_) drop_first();
      s = insert(key);
    }
    const bool queue = fresh || s->expires != expires;
    *s = Slot{std::move(value), expires};
    if (queue) {
      queue_.emplace_back(expires, key);
      compact();
    }
    return s->value;
  }
  // Keeps key's value, gives it a new expiry (a later one: the queue stays in expiry order).
  void renew(const K& key, int64_t expires) {
    if (Slot* s = lookup(key); s && s->expires != expires) {
      s->expires = expires;
      queue_.emplace_back(expires, key);
      compact();
    }
  }
  bool erase(const K& key) { return erase_key(key); }
  // Every entry for which pred(key, value) holds goes (std::map / std::unordered_map only).
  template <class F>
  void erase_if(F pred) {
    std::erase_if(map_, [&](const auto& e) { return pred(e.first, e.second.value); });
  }
  // Drops the entries whose expiry is <= now; returns how many.
  size_t expire(int64_t now) {
    size_t n = 0;
    while (!queue_.empty() && queue_.front().first <= now) {
      const auto& [when, key] = queue_.front();
      if (Slot* s = lookup(key); s && s->expires == when) {
        erase_key(key);
        n++;
      }
      queue_.pop_front();
    }
    return n;
  }
  Map& map() { return map_; }  // prefetch, iteration
  const Map& map() const { return map_; }
  size_t queued() const { return queue_.size(); }

 private:
  static constexpr bool kPointerFind = std::is_pointer_v<decltype(std::declval<Map&>().find(std::declval<const K&>()))>;
  Slot* lookup(const K& key) {
    if constexpr (kPointerFind) {
      return map_.find(key);
    } else {
      auto it = map_.find(key);
      return it == map_.end() ? nullptr : &it->second;
    }
  }
  Slot* insert(const K& key) {
    if constexpr (kPointerFind) return map_.try_emplace(key, Slot{}).first;
    else return &map_.try_emplace(key).first->second;
  }
  bool erase_key(const K& key) {
    if constexpr (kPointerFind) return map_.erase(key);
    else return map_.erase(key) > 0;
  }
  // The live entry that expires first goes (the bound).
  void drop_first() {
    while (!queue_.empty()) {
      const auto [when, key] = queue_.front();
      queue_.pop_front();
      if (Slot* s = lookup(key); s && s->expires == when) {
        erase_key(key);
        dropped_++;
        return;
      }
    }
  }
  // Queued entries of keys set again (or erased) are skipped when they come up; when they
  // outnumber the live ones the queue is rebuilt from what is live, in its order.
  void compact() {
    if (queue_.size() <= 2 * map_.size() + 64) return;
    std::deque<std::pair<int64_t, K>> live;
    for (auto& q : queue_)
      if (Slot* s = lookup(q.second); s && s->expires == q.first) live.push_back(std::move(q));
    queue_.swap(live);
  }

  size_t bound_;
  Map map_;
  std::deque<std::pair<int64_t, K>> queue_;
  uint64_t dropped_ = 0;
};

}  // namespace fluxon
