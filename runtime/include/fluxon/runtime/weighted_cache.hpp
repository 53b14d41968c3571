// WeightedCache<K, V>: Fluxon's size-weighted W-TinyLFU cache, the role Moka plays in the design
// (the master's resident index T2, the master hot tier T1, the owner-local hot cache).
//
// Each shard is a W-TinyLFU cache (Einziger, Friedman, Manes, ACM ToS 2017; size-aware admission
// as in Einziger et al., "Lightweight Robust Size Aware Cache Management", ACM ToS 2022):
//   - a window (1% of the weight at first) takes new entries;
//   - the main space is a segmented LRU: probation (20%) and protected (80%);
//   - an entry leaving the window is a *candidate* for main; when main is over capacity the
//     candidate competes with the probation's LRU *victim(s)* on the TinyLFU frequency estimate:
//     one victim after another is evicted while the candidate is more frequent, until its weight
//     fits; if a victim wins, the candidate is evicted instead. Weights are bytes.
//   - the window size adapts to the workload from two ghost lists (hashes only): candidates the
//     admission rejected and probation victims it evicted. A miss on a rejected candidate that a
//     window larger by a horizon H would still have held is a vote for a larger window; a miss on
//     a victim that a main space larger by H would still have held is a vote for a smaller one.
//     Both ghosts forget on the clock of their own region (weight inserted into the window, weight
//     evicted from main), so the votes weigh the marginal value of the same H bytes on either
//     side, whatever the rates of rejection and eviction. A vote moves the window by a share of its
//     size that grows with a run of votes the same way (up to 32x). Recency-heavy workloads
//     (multi-turn prefix chains) get an LRU-like cache within a few hundred misses, frequency-heavy
//     ones keep a small window. (Hill climbing on the sampled hit rate, as in Caffeine, was measured
//     first: too slow to learn on the prefix trace or too noisy on Zipf; see tools/cache_bench.cpp.)
// Reads take the shard lock shared and only mark the entry referenced and count it in the
// sketch; the LRU order is repaired lazily (second chance) by writers under the exclusive lock.
//
// Removal causes: Size (capacity or evict_some), Replaced (insert over a key), Explicit (remove,
// remove_if). The listener runs on the cache's own notifier thread, outside every internal lock;
// a caller's operation only pushes into a lossless queue. Each removed entry is reported exactly
// once. Nothing changes max_capacity() after construction (S5). Values are stored as given: a
// std::weak_ptr value does not extend the lifetime of its object.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>  // std::shared_lock
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
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

// A reader-writer spin lock of one word: readers add 2, a writer owns bit 0 and has preference
// (once it holds the bit, new readers back off and it waits for the present ones to leave).
// Reads are short and never block on I/O, so spinning, then yielding, beats a futex lock's calls.
class ShardLock {
 public:
  void lock_shared() {
    while (true) {
      if ((state_.fetch_add(2, std::memory_order_acquire) & 1) == 0) return;
      state_.fetch_sub(2, std::memory_order_relaxed);
      wait_until([&] { return (state_.load(std::memory_order_relaxed) & 1) == 0; });
    }
  }
  void unlock_shared() { state_.fetch_sub(2, std::memory_order_release); }
  void lock() {
    while (state_.fetch_or(1, std::memory_order_acquire) & 1)
      wait_until([&] { return (state_.load(std::memory_order_relaxed) & 1) == 0; });
    wait_until([&] { return state_.load(std::memory_order_acquire) == 1; });
  }
  void unlock() { state_.fetch_and(~uint32_t(1), std::memory_order_release); }

 private:
  template <class F>
  static void wait_until(F done) {
    for (uint32_t spins = 0; !done(); ++spins)
      if (spins > 64) std::this_thread::yield();
  }
  std::atomic<uint32_t> state_{0};
};

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
    bool adaptive_window = true;       // move the window size on the ghosts' votes (see above)
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
      std::unique_lock<ShardLock> g(s.m);
      s.drain_reads();
      if (Node* found = s.index.find(h, key)) {
        Node& n = *found;
        ev.push_back(Event{key, std::move(n.value), n.weight, RemovalCause::kReplaced});
        n.value = std::move(value);
        s.adjust_weight(n, weight);
        s.sketch.increment(h);
        n.referenced.store(true, std::memory_order_relaxed);
      } else {
        Node& n = *s.index.insert(h, key);
        n.value = std::move(value);
        n.weight = weight;
        n.hash = h;
        s.sketch.increment(h);
        s.link(Region::kWindow, n);
        s.count.fetch_add(1, std::memory_order_relaxed);
        s.insert_clock += weight;
        if (opts_.adaptive_window && opts_.enforce_capacity) s.vote(h, weight);
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
    std::shared_lock<ShardLock> g(s.m);
    Node* n = s.index.find(h, key);
    if (!n) return std::nullopt;
    s.record_read(*n, h);
    return n->value;
  }

  // Records an access without copying the value. (get's body again, on purpose: sharing it through a
  // callback measurably slowed the read path, see tools/cache_bench.cpp.)
  bool touch(const K& key) {
    const uint64_t h = hash_of(key);
    Shard& s = shard(h);
    std::shared_lock<ShardLock> g(s.m);
    Node* n = s.index.find(h, key);
    if (!n) return false;
    s.record_read(*n, h);
    return true;
  }

  bool contains(const K& key) const {
    const uint64_t h = hash_of(key);
    const Shard& s = shard(h);
    std::shared_lock<ShardLock> g(s.m);
    return s.index.find(h, key) != nullptr;
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
    return evict_some_if(bytes, std::move(pred), nullptr);
  }

  // As above; the selected entries are also appended to *selected_out (the caller acts on them at
  // once, in its own thread, as a core without threads must).
  template <class Pred>
  uint64_t evict_some_if(uint64_t bytes, Pred pred, std::vector<std::pair<K, V>>* selected_out) {
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
          std::unique_lock<ShardLock> g(s.m);
          s.drain_reads();
          got = s.evict_coldest(std::min(share, bytes - selected), pred, ev);
        }
        if (selected_out)
          for (const auto& e : ev) selected_out->emplace_back(e.key, e.value);
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

  // The current window share of the first shard (the ghosts' votes move it): tests and benchmarks.
  double window_ratio() const {
    const Shard& s = *shards_[0];
    std::shared_lock<ShardLock> g(s.m);
    return s.cap ? double(s.window_cap) / double(s.cap) : 0;
  }
  // Hashes the ghosts remember now, all shards (bounded by the horizon: tests).
  size_t ghost_entries() const {
    size_t n = 0;
    for (auto& sp : shards_) {
      std::shared_lock<ShardLock> g(sp->m);
      n += sp->rejected.fifo.size() + sp->evicted.fifo.size();
    }
    return n;
  }
  // Votes for a larger and for a smaller window so far, all shards.
  std::pair<uint64_t, uint64_t> window_votes() const {
    std::pair<uint64_t, uint64_t> v{0, 0};
    for (auto& sp : shards_) {
      std::shared_lock<ShardLock> g(sp->m);
      v.first += sp->votes_larger;
      v.second += sp->votes_smaller;
    }
    return v;
  }

 private:
  enum class Region : uint8_t { kWindow, kProbation, kProtected };

  // Cache-line aligned, read-path fields first: a lookup touches one line of the node.
  struct alignas(64) Node {
    K key_storage{};
    V value{};
    std::atomic<bool> referenced{false};  // set by readers under the shared lock
    Region region = Region::kWindow;
    uint64_t hash = 0;
    uint64_t weight = 0;
    Node* prev = nullptr;
    Node* next = nullptr;
  };

  // Intrusive LRU list: front = least recently used.
  struct List {
    Node head;
    List() { head.prev = head.next = &head; }
    Node* front() { return head.next == &head ? nullptr : head.next; }
    Node* after(Node* n) { return n->next == &head ? nullptr : n->next; }
    void push_back(Node& n) { insert_before(&head, n); }
    void insert_before(Node* pos, Node& n) {
      n.prev = pos->prev;
      n.next = pos;
      pos->prev->next = &n;
      pos->prev = &n;
    }
    static void unlink(Node& n) {
      n.prev->next = n.next;
      n.next->prev = n.prev;
      n.prev = n.next = nullptr;
    }
  };

  // Open-addressing index hash -> Node* (linear probing, backward-shift deletion): one memory
  // access finds the slot, one more the node. Nodes are allocated one by one and never move,
  // so the intrusive lists can point at them.
  class Index {
   public:
    Index() { slots_.assign(16, Slot{}); }
    ~Index() {
      for (auto& sl : slots_) delete sl.node;
    }
    Node* find(uint64_t h, const K& key) const {
      for (size_t i = h & mask(); ; i = (i + 1) & mask()) {
        const Slot& sl = slots_[i];
        if (!sl.node) return nullptr;
        if (sl.hash == h && sl.node->key_storage == key) return sl.node;
      }
    }
    // Inserts a new node for key (absent).
    Node* insert(uint64_t h, const K& key) {
      if ((size_ + 1) * 2 > slots_.size()) grow();
      Node* n = new Node();
      n->key_storage = key;
      place(h, n);
      size_++;
      return n;
    }
    void erase(uint64_t h, Node* n) {
      size_t i = h & mask();
      while (slots_[i].node != n) i = (i + 1) & mask();
      // Backward-shift deletion keeps every probe chain unbroken without tombstones.
      size_t j = i;
      while (true) {
        j = (j + 1) & mask();
        if (!slots_[j].node) break;
        const size_t home = slots_[j].hash & mask();
        const bool movable = (j > i) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
          slots_[i] = slots_[j];
          i = j;
        }
      }
      slots_[i] = Slot{};
      size_--;
      delete n;
    }

   private:
    struct Slot {
      uint64_t hash = 0;
      Node* node = nullptr;
    };
    size_t mask() const { return slots_.size() - 1; }
    void place(uint64_t h, Node* n) {
      size_t i = h & mask();
      while (slots_[i].node) i = (i + 1) & mask();
      slots_[i] = Slot{h, n};
    }
    void grow() {
      std::vector<Slot> old(slots_.size() * 2);
      old.swap(slots_);
      for (auto& sl : old)
        if (sl.node) place(sl.hash, sl.node);
    }
    std::vector<Slot> slots_;
    size_t size_ = 0;
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
    mutable ShardLock m;
    Index index;
    List lists[3];
    uint64_t w[3] = {0, 0, 0};
    std::atomic<uint64_t> total_w{0};
    std::atomic<uint64_t> count{0};
    uint64_t cap = 0, window_cap = 0, protected_cap = 0;
    uint64_t rng = 0;
    FrequencySketch sketch;
    // Window adaptation (see the header comment).
    struct Ghost {
      std::deque<std::pair<uint64_t, uint64_t>> fifo;  // (hash, region clock when it left)
      std::unordered_map<uint64_t, uint32_t> live;     // hash -> copies in fifo
      void forget_before(uint64_t now, uint64_t horizon) {
        while (!fifo.empty() && now - fifo.front().second > horizon) {
          auto it = live.find(fifo.front().first);
          if (it != live.end() && --it->second == 0) live.erase(it);
          fifo.pop_front();
        }
      }
      void add(uint64_t h, uint64_t now) {
        fifo.emplace_back(h, now);
        live[h]++;
      }
      bool take(uint64_t h) {
        auto it = live.find(h);
        if (it == live.end()) return false;
        if (--it->second == 0) live.erase(it);
        return true;
      }
    };
    Ghost rejected, evicted;
    uint64_t insert_clock = 0, evict_clock = 0;  // weight inserted into the window / evicted from main
    int64_t run = 0;                             // votes in a row: > 0 larger, < 0 smaller
    uint64_t votes_larger = 0, votes_smaller = 0;
    static constexpr double kHorizon = 1.0 / 16;   // H, of the shard's capacity
    static constexpr double kShare = 1.0 / 64;     // a vote moves the window by this share of it ...
    static constexpr int64_t kMaxRun = 32;         // ... times the run of equal votes, at most this
    static constexpr double kMinWindow = 0.01, kMaxWindow = 0.99;

    void remember_rejected(const Node& n) { rejected.add(n.hash, insert_clock); }
    void remember_evicted(const Node& n) {
      evict_clock += n.weight;
      evicted.add(n.hash, evict_clock);
    }
    // A new key of `weight` arrives (a miss): did either side lose it for lack of H more bytes?
    void vote(uint64_t h, uint64_t weight) {
      const uint64_t horizon = std::max<uint64_t>(1, uint64_t(kHorizon * double(cap)));
      rejected.forget_before(insert_clock, horizon);
      evicted.forget_before(evict_clock, horizon);
      int dir = 0;
      if (rejected.take(h)) dir = 1;
      else if (evicted.take(h)) dir = -1;
      if (dir == 0) return;
      run = (dir > 0) == (run > 0) ? run + dir : dir;
      (dir > 0 ? votes_larger : votes_smaller)++;
      const double w = double(window_cap);
      const double step = std::max(double(weight), kShare * w * double(std::min(kMaxRun, run > 0 ? run : -run)));
      window_cap = uint64_t(std::clamp(w + dir * step, kMinWindow * double(cap), kMaxWindow * double(cap)));
      protected_cap = uint64_t(double(cap - std::min(cap, window_cap)) * 0.80);
    }

    // Reads are recorded in a lossy ring of hashes that writers drain into the sketch under the
    // exclusive lock (Caffeine's read buffer): a read pays no sketch miss. When more than
    // kReadBuffer reads arrive between two writes of a shard, the excess is not counted (a
    // sample of a read-heavy phase; admission happens on writes, which drain first).
    static constexpr uint64_t kReadBuffer = 64;
    std::atomic<uint64_t> read_ring[kReadBuffer] = {};
    std::atomic<uint64_t> read_tail{0}, read_head{0};

    void record_read(Node& n, uint64_t h) {
      // Approximate counters: plain relaxed loads and stores, no locked instruction.
      if (!n.referenced.load(std::memory_order_relaxed)) n.referenced.store(true, std::memory_order_relaxed);
      const uint64_t tail = read_tail.load(std::memory_order_relaxed);
      if (tail - read_head.load(std::memory_order_relaxed) >= kReadBuffer) return;  // full: lossy
      read_ring[tail % kReadBuffer].store(h, std::memory_order_relaxed);
      read_tail.store(tail + 1, std::memory_order_relaxed);
    }
    // Under the exclusive lock.
    void drain_reads() {
      const uint64_t tail = read_tail.load(std::memory_order_relaxed);
      uint64_t head = read_head.load(std::memory_order_relaxed);
      if (tail - head > kReadBuffer) head = tail - kReadBuffer;
      for (; head != tail; ++head) sketch.increment(read_ring[head % kReadBuffer].load(std::memory_order_relaxed));
      read_head.store(tail, std::memory_order_relaxed);
    }
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
    // A referenced probation entry is promoted; protected overflow goes back to probation, in
    // front of `before` (the pending candidates) so that they stay the newest.
    void promote(Node& n, Node* before) {
      n.referenced.store(false, std::memory_order_relaxed);
      unlink(n);
      link(Region::kProtected, n);
      size_t guard = 2 * count.load(std::memory_order_relaxed) + 2;
      while (w[int(Region::kProtected)] > protected_cap && guard-- > 0) {
        Node* d = list(Region::kProtected).front();
        if (!d || d == &n) break;
        unlink(*d);
        if (d->referenced.exchange(false, std::memory_order_relaxed)) {
          link(Region::kProtected, *d);  // second chance at the MRU end
          continue;
        }
        d->region = Region::kProbation;
        if (before) list(Region::kProbation).insert_before(before, *d);
        else list(Region::kProbation).push_back(*d);
        w[int(Region::kProbation)] += d->weight;
        total_w.fetch_add(d->weight, std::memory_order_relaxed);
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
      ev.push_back(Event{std::move(n.key_storage), std::move(n.value), n.weight, cause});
      index.erase(n.hash, &n);
    }
    template <class Pred>
    uint64_t evict_coldest(uint64_t bytes, Pred& pred, Events& ev) {
      uint64_t got = 0;
      for (Region r : {Region::kProbation, Region::kWindow, Region::kProtected}) {
        Node* n = list(r).front();
        while (n && got < bytes) {
          Node* next = list(r).after(n);
          if (pred(n->key_storage, n->value)) {
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
    size_t guard = 2 * s.count.load(std::memory_order_relaxed) + 2;
    while (s.w[int(Region::kWindow)] > s.window_cap && guard-- > 0) {
      Node* n = s.list(Region::kWindow).front();
      if (!n) break;
      s.unlink(*n);
      if (n->referenced.exchange(false, std::memory_order_relaxed) && s.list(Region::kWindow).front()) {
        s.link(Region::kWindow, *n);  // read while in the window: LRU order, repaired lazily
        continue;
      }
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
      if (victim != candidate && victim->referenced.load(std::memory_order_relaxed)) {
        // Read since it entered probation: promoted instead of evicted (lazy SLRU access).
        Node* next = prob.after(victim);
        s.promote(*victim, candidate);
        victim = next ? next : prob.front();
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
        if (opts_.adaptive_window) s.remember_evicted(*victim);
        s.erase(*victim, RemovalCause::kSize, ev);
        victim = next;
      } else {
        Node* next = prob.after(candidate);
        if (opts_.adaptive_window) s.remember_rejected(*candidate);
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
      std::unique_lock<ShardLock> g(s.m);
      Node* n = s.index.find(h, key);
      if (!n || !pred(static_cast<const V&>(n->value))) return std::nullopt;
      if (want_value) out = n->value;
      else out.emplace();
      s.erase(*n, RemovalCause::kExplicit, ev);
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

  std::mutex qm_;
  std::condition_variable qcv_, idle_cv_;
  std::deque<Event> q_;
  bool delivering_ = false;
  bool stop_ = false;
  std::thread notifier_;
};

}  // namespace fluxon
