// WeightedCache<K, V>: Fluxon's size-weighted W-TinyLFU cache, the role Moka plays in the design
// (the master's resident index T2, the master hot tier T1, the owner-local hot cache).
//
// Each shard is a W-TinyLFU cache (Einziger, Friedman, Manes, ACM ToS 2017; size-aware admission
// as in Einziger et al., "Lightweight Robust Size Aware Cache Management", ACM ToS 2022):
//   - a window LRU (1% of the weight) takes new entries;
//   - the main space is a segmented LRU: probation (20%) and protected (80%);
//   - an entry leaving the window is a *candidate* for main; when main is over capacity the
//     candidate competes with the probation's LRU *victim(s)* on the TinyLFU frequency estimate:
//     one victim after another is evicted while the candidate is more frequent, until its weight
//     fits; if a victim wins, the candidate is evicted instead. Weights are bytes.
//
// Removal causes: Size (capacity or evict_some), Replaced (insert over a key), Explicit (remove,
// remove_if). The listener runs on the cache's own notifier thread, outside every internal lock;
// a caller's operation only pushes into a lossless queue. Each removed entry is reported exactly
// once. Nothing changes max_capacity() after construction (S5). Values are stored as given: a
// std::weak_ptr value does not extend the lifetime of its object.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fluxon/runtime/frequency_sketch.hpp"
#include "fluxon/runtime/status.hpp"

namespace fluxon {

enum class RemovalCause : uint8_t { kSize, kReplaced, kExplicit };

inline const char* removal_cause_name(RemovalCause c) {
  switch (c) {
    case RemovalCause::kSize: return "Size";
    case RemovalCause::kReplaced: return "Replaced";
    case RemovalCause::kExplicit: return "Explicit";
  }
  return "?";
}

template <class K, class V, class Hash = std::hash<K>>
class WeightedCache {
 public:
  using Listener = std::function<void(const K& key, V&& value, uint64_t weight, RemovalCause cause)>;

  struct Options {
    uint64_t max_capacity = 0;         // bytes; fixed for the cache's life (S5)
    bool enforce_capacity = true;      // false: the resident-index mode, evicted only by evict_some*
    size_t shards = 16;                // an entry heavier than max_capacity / shards cannot stay
    uint64_t estimated_entries = 1 << 16;  // sizes the frequency sketch
    double window_ratio = 0.01;
    double protected_ratio = 0.80;     // of the main space
    Listener listener;
  };

  explicit WeightedCache(Options o) : opts_(std::move(o)) {
    const size_t n = std::max<size_t>(1, opts_.shards);
    const uint64_t per_entries = std::max<uint64_t>(64, opts_.estimated_entries / n);
    for (size_t i = 0; i < n; ++i) {
      auto s = std::make_unique<Shard>(per_entries);
      s->cap = opts_.max_capacity / n + (i < opts_.max_capacity % n ? 1 : 0);
      s->window_cap = std::max<uint64_t>(1, uint64_t(double(s->cap) * opts_.window_ratio));
      s->protected_cap = uint64_t(double(s->cap - std::min(s->cap, s->window_cap)) * opts_.protected_ratio);
      s->rng = 0x9e3779b97f4a7c15ull ^ (i + 1);
      shards_.push_back(std::move(s));
    }
    if (opts_.listener) notifier_ = std::thread([this] { run_notifier(); });
  }

  ~WeightedCache() {
    if (notifier_.joinable()) {
      {
        std::lock_guard<std::mutex> g(qm_);
        stop_ = true;
      }
      qcv_.notify_all();
      notifier_.join();
    }
  }

  WeightedCache(const WeightedCache&) = delete;
  WeightedCache& operator=(const WeightedCache&) = delete;

  uint64_t max_capacity() const { return opts_.max_capacity; }
  uint64_t weighted_size() const {
    uint64_t w = 0;
    for (auto& s : shards_) w += s->total_w.load(std::memory_order_relaxed);
    return w;
  }
  uint64_t entry_count() const {
    uint64_t n = 0;
    for (auto& s : shards_) n += s->count.load(std::memory_order_relaxed);
    return n;
  }

  // Inserts or replaces. weight 0 is rejected. With capacity enforced, an entry that cannot fit in
  // its shard is reported as evicted (Size) at once.
  Status insert(const K& key, V value, uint64_t weight) {
    if (weight == 0) return invalid_argument("weight: must be > 0");
    const uint64_t h = hash_of(key);
    Shard& s = shard(h);
    Events ev;
    {
      std::lock_guard<std::mutex> g(s.m);
      auto it = s.map.find(key);
      if (it != s.map.end()) {
        Node& n = it->second;
        ev.push_back(Event{key, std::move(n.value), n.weight, RemovalCause::kReplaced});
        n.value = std::move(value);
        s.adjust_weight(n, weight);
        s.sketch.increment(h);
        s.on_access(n);
      } else {
        auto [pos, _] = s.map.try_emplace(key);
        Node& n = pos->second;
        n.key = &pos->first;
        n.value = std::move(value);
        n.weight = weight;
        n.hash = h;
        s.sketch.increment(h);
        s.link(Region::kWindow, n);
        s.count.fetch_add(1, std::memory_order_relaxed);
      }
      maintain(s, ev);
    }
    publish(ev);
    return Status::ok();
  }

  // Returns a copy of the value and records the access.
  std::optional<V> get(const K& key) {
    const uint64_t h = hash_of(key);
    Shard& s = shard(h);
    std::lock_guard<std::mutex> g(s.m);
    auto it = s.map.find(key);
    if (it == s.map.end()) {
      misses_.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }
    hits_.fetch_add(1, std::memory_order_relaxed);
    s.sketch.increment(h);
    s.on_access(it->second);
    return it->second.value;
  }

  // Records an access without copying the value.
  bool touch(const K& key) {
    const uint64_t h = hash_of(key);
    Shard& s = shard(h);
    std::lock_guard<std::mutex> g(s.m);
    auto it = s.map.find(key);
    if (it == s.map.end()) return false;
    s.sketch.increment(h);
    s.on_access(it->second);
    return true;
  }

  bool contains(const K& key) const {
    const uint64_t h = hash_of(key);
    const Shard& s = shard(h);
    std::lock_guard<std::mutex> g(s.m);
    return s.map.count(key) > 0;
  }

  // Explicit removal; reported with cause Explicit.
  std::optional<V> remove(const K& key) {
    return remove_if(key, [](const V&) { return true; }, /*want_value=*/true);
  }

  // Removes only when pred(value) holds (e.g. the stored put_id matches): never a newer version.
  template <class Pred>
  bool remove_if(const K& key, Pred pred) {
    return remove_if(key, std::move(pred), false).has_value();
  }

  // Selects at least `bytes` of weight (or everything there is) from the coldest end of every
  // shard, removes it with cause Size, and returns the selected weight. max_capacity() is untouched.
  uint64_t evict_some(uint64_t bytes) {
    return evict_some_if(bytes, [](const K&, const V&) { return true; });
  }

  // As evict_some, restricted to entries for which pred(key, value) holds.
  template <class Pred>
  uint64_t evict_some_if(uint64_t bytes, Pred pred) {
    uint64_t selected = 0;
    std::vector<bool> exhausted(shards_.size(), false);
    size_t live = shards_.size();
    // Round robin, a bounded share per shard per pass, so that no shard gives more than its part.
    while (selected < bytes && live > 0) {
      const uint64_t share = std::max<uint64_t>(1, (bytes - selected) / live);
      for (size_t i = 0; i < shards_.size() && selected < bytes; ++i) {
        if (exhausted[i]) continue;
        Shard& s = *shards_[i];
        Events ev;
        uint64_t got = 0;
        {
          std::lock_guard<std::mutex> g(s.m);
          got = s.evict_coldest(std::min(share, bytes - selected), pred, ev);
        }
        publish(ev);
        if (got == 0) {
          exhausted[i] = true;
          live--;
        }
        selected += got;
      }
    }
    return selected;
  }

  // Waits until every removal queued so far has been delivered to the listener.
  void flush_listener() {
    if (!opts_.listener) return;
    std::unique_lock<std::mutex> g(qm_);
    idle_cv_.wait(g, [&] { return q_.empty() && !delivering_; });
  }

  uint64_t hits() const { return hits_.load(); }
  uint64_t misses() const { return misses_.load(); }

 private:
  enum class Region : uint8_t { kWindow, kProbation, kProtected };

  struct Node {
    const K* key = nullptr;
    V value{};
    uint64_t weight = 0;
    uint64_t hash = 0;
    Region region = Region::kWindow;
    Node* prev = nullptr;
    Node* next = nullptr;
  };

  // Intrusive LRU list: front = least recently used.
  struct List {
    Node head;
    List() { head.prev = head.next = &head; }
    Node* front() { return head.next == &head ? nullptr : head.next; }
    Node* after(Node* n) { return n->next == &head ? nullptr : n->next; }
    void push_back(Node& n) {
      n.prev = head.prev;
      n.next = &head;
      head.prev->next = &n;
      head.prev = &n;
    }
    static void unlink(Node& n) {
      n.prev->next = n.next;
      n.next->prev = n.prev;
      n.prev = n.next = nullptr;
    }
  };

  struct Event {
    K key;
    V value;
    uint64_t weight;
    RemovalCause cause;
  };
  using Events = std::vector<Event>;

  struct Shard {
    explicit Shard(uint64_t entries) : sketch(entries) {}
    mutable std::mutex m;
    std::unordered_map<K, Node, Hash> map;
    List lists[3];
    uint64_t w[3] = {0, 0, 0};
    std::atomic<uint64_t> total_w{0};
    std::atomic<uint64_t> count{0};
    uint64_t cap = 0, window_cap = 0, protected_cap = 0;
    uint64_t rng = 0;
    FrequencySketch sketch;

    List& list(Region r) { return lists[int(r)]; }
    void link(Region r, Node& n) {
      n.region = r;
      list(r).push_back(n);
      w[int(r)] += n.weight;
      total_w.fetch_add(n.weight, std::memory_order_relaxed);
    }
    void unlink(Node& n) {
      List::unlink(n);
      w[int(n.region)] -= n.weight;
      total_w.fetch_sub(n.weight, std::memory_order_relaxed);
    }
    void adjust_weight(Node& n, uint64_t weight) {
      w[int(n.region)] = w[int(n.region)] - n.weight + weight;
      total_w.fetch_add(weight - n.weight, std::memory_order_relaxed);  // modular arithmetic
      n.weight = weight;
    }
    void on_access(Node& n) {
      if (n.region == Region::kProbation) {
        unlink(n);
        link(Region::kProtected, n);
        // Protected overflow goes back to probation's MRU end.
        while (w[int(Region::kProtected)] > protected_cap) {
          Node* d = list(Region::kProtected).front();
          if (!d || d == &n) break;
          unlink(*d);
          link(Region::kProbation, *d);
        }
      } else {
        const Region r = n.region;
        List::unlink(n);
        list(r).push_back(n);
      }
    }
    uint64_t next_random() {
      rng ^= rng << 13;
      rng ^= rng >> 7;
      rng ^= rng << 17;
      return rng;
    }
    // TinyLFU admission with protection against hash flooding: a warm candidate that loses on
    // frequency still gets in now and then, so an attacker cannot pin a victim forever.
    bool admit(const Node& candidate, const Node& victim) {
      const uint32_t cf = sketch.frequency(candidate.hash), vf = sketch.frequency(victim.hash);
      if (cf > vf) return true;
      if (cf <= 5) return false;
      return (next_random() & 127) == 0;
    }
    void erase(Node& n, RemovalCause cause, Events& ev) {
      unlink(n);
      count.fetch_sub(1, std::memory_order_relaxed);
      auto it = map.find(*n.key);
      ev.push_back(Event{it->first, std::move(n.value), n.weight, cause});
      map.erase(it);
    }
    template <class Pred>
    uint64_t evict_coldest(uint64_t bytes, Pred& pred, Events& ev) {
      uint64_t got = 0;
      for (Region r : {Region::kProbation, Region::kWindow, Region::kProtected}) {
        Node* n = list(r).front();
        while (n && got < bytes) {
          Node* next = list(r).after(n);
          if (pred(*n->key, n->value)) {
            got += n->weight;
            erase(*n, RemovalCause::kSize, ev);
          }
          n = next;
        }
        if (got >= bytes) break;
      }
      return got;
    }
  };

  uint64_t hash_of(const K& key) const {
    uint64_t h = static_cast<uint64_t>(Hash{}(key));
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
  }
  Shard& shard(uint64_t h) { return *shards_[(h >> 40) % shards_.size()]; }
  const Shard& shard(uint64_t h) const { return *shards_[(h >> 40) % shards_.size()]; }

  // Window overflow becomes main candidates; then, when capacity is enforced, main is brought
  // back under capacity by admission duels between candidates and probation victims.
  void maintain(Shard& s, Events& ev) {
    size_t candidates = 0;
    while (s.w[int(Region::kWindow)] > s.window_cap) {
      Node* n = s.list(Region::kWindow).front();
      if (!n) break;
      s.unlink(*n);
      s.link(Region::kProbation, *n);
      candidates++;
    }
    if (!opts_.enforce_capacity) return;
    List& prob = s.list(Region::kProbation);
    Node* victim = prob.front();
    // The candidates are the last `candidates` nodes of probation; start from the oldest of them.
    Node* candidate = nullptr;
    if (candidates > 0) {
      candidate = prob.head.prev;
      for (size_t i = 1; i < candidates; ++i) candidate = candidate->prev;
    }
    while (s.total_w.load(std::memory_order_relaxed) > s.cap) {
      if (candidates == 0) candidate = nullptr;
      if (!candidate && !victim) {
        // Probation is empty of both: take from protected, then the window.
        Node* n = s.list(Region::kProtected).front();
        if (!n) n = s.list(Region::kWindow).front();
        if (!n) break;
        s.erase(*n, RemovalCause::kSize, ev);
        continue;
      }
      if (candidate && victim == candidate) {
        Node* next = prob.after(victim);
        s.erase(*victim, RemovalCause::kSize, ev);
        victim = next;
        candidate = next;
        candidates--;
        continue;
      }
      if (!victim) {
        Node* next = prob.after(candidate);
        s.erase(*candidate, RemovalCause::kSize, ev);
        candidate = next;
        candidates--;
        continue;
      }
      if (!candidate) {
        Node* next = prob.after(victim);
        s.erase(*victim, RemovalCause::kSize, ev);
        victim = next;
        continue;
      }
      if (candidate->weight > s.cap) {
        Node* next = prob.after(candidate);
        s.erase(*candidate, RemovalCause::kSize, ev);
        candidate = next;
        candidates--;
        continue;
      }
      if (s.admit(*candidate, *victim)) {
        Node* next = prob.after(victim);
        s.erase(*victim, RemovalCause::kSize, ev);
        victim = next;
      } else {
        Node* next = prob.after(candidate);
        s.erase(*candidate, RemovalCause::kSize, ev);
        candidate = next;
        candidates--;
      }
    }
  }

  template <class Pred>
  std::optional<V> remove_if(const K& key, Pred pred, bool want_value) {
    const uint64_t h = hash_of(key);
    Shard& s = shard(h);
    Events ev;
    std::optional<V> out;
    {
      std::lock_guard<std::mutex> g(s.m);
      auto it = s.map.find(key);
      if (it == s.map.end() || !pred(static_cast<const V&>(it->second.value))) return std::nullopt;
      if (want_value) out = it->second.value;
      else out.emplace();
      s.erase(it->second, RemovalCause::kExplicit, ev);
    }
    publish(ev);
    return out;
  }

  // The only work a caller does for the listener: a push into the lossless queue.
  void publish(Events& ev) {
    if (ev.empty() || !opts_.listener) return;
    {
      std::lock_guard<std::mutex> g(qm_);
      for (auto& e : ev) q_.push_back(std::move(e));
    }
    qcv_.notify_one();
  }

  void run_notifier() {
    std::unique_lock<std::mutex> g(qm_);
    while (true) {
      qcv_.wait(g, [&] { return stop_ || !q_.empty(); });
      if (q_.empty() && stop_) return;
      std::deque<Event> batch;
      batch.swap(q_);
      delivering_ = true;
      g.unlock();
      for (auto& e : batch) opts_.listener(e.key, std::move(e.value), e.weight, e.cause);
      g.lock();
      delivering_ = false;
      if (q_.empty()) idle_cv_.notify_all();
    }
  }

  Options opts_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<uint64_t> hits_{0}, misses_{0};

  std::mutex qm_;
  std::condition_variable qcv_, idle_cv_;
  std::deque<Event> q_;
  bool delivering_ = false;
  bool stop_ = false;
  std::thread notifier_;
};

}  // namespace fluxon
