// WeightedCache<K, V>: Fluxon's size-weighted W-TinyLFU cache, the role Moka plays in the design
// (the master's resident index T2, the master hot tier T1, the owner-local hot cache).
//
// Each shard is a W-TinyLFU cache (Einziger, Friedman, Manes, ACM ToS 2017; size-aware admission
// as in Einziger et al., "Lightweight Robust Size Aware Cache Management", ACM ToS 2022):
//   - a window LRU takes new entries;
//   - the main space is a segmented LRU: probation (20%) and protected (80%);
//   - an entry leaving the window is a *candidate* for main; when main is over capacity the
//     candidate competes with the probation's LRU *victim(s)* on the TinyLFU frequency estimate:
//     one victim after another is evicted while the candidate is more frequent, until its weight
//     fits; if a victim wins, the candidate is evicted instead. Weights are bytes.
//   - the window's share of the capacity adapts to the workload (WindowSims, window_sims.hpp):
//     miniature simulations of the same cache with window shares from 1% to 100%, fed with a
//     hashed sample of the keys, score the bytes they hit; the cache takes the best share. A new
//     cache starts at 100% (an LRU) and keeps it until the simulations show that frequency pays:
//     recency workloads (multi-turn prefix chains) lose nothing against LRU, frequency workloads
//     (Zipf) get a small window within a few thousand sampled accesses. When the share shrinks,
//     main's least recent entries join the window in stamp order (every entry carries the tick of
//     its last access), so that a return to LRU loses no recency. (Measured before and not kept:
//     Caffeine's hill climbing on the sampled hit rate, and votes of ghost lists of rejected
//     candidates and evicted victims; see tools/cache_bench.cpp.)
//   - while the cache is an LRU, a shard over its capacity may take capacity from another shard
//     whose next eviction is older (borrow()): hash partitioning alone would evict entries a
//     single LRU keeps. The shards' capacities always sum to max_capacity().
// Reads take the shard lock shared and only record the entry in a ring; the next writer of the
// shard replays the ring in order under the exclusive lock: counts each read in the sketch and
// moves the entry to its list's MRU end (a probation entry to protected), so the lists are exact
// LRU orders. A read that finds the ring full (1024 reads since the shard's last write) marks the
// entry referenced instead, and the eviction scan gives a referenced entry a second chance
// (CLOCK). Readers never replay: doing so halved get throughput (measured), and a read-only phase
// is sampled rather than lost.
//
// Removal causes: Size (capacity or evict_some), Replaced (insert over a key), Explicit (remove,
// remove_if). This cache starts no thread: NotifyingCache (notifying_cache.hpp) adds a listener
// on a notifier thread of its own, outside every internal lock, each removed entry reported
// exactly once; the cores use this one and act on evictions at once (evicted_out). Nothing changes max_capacity() after construction (S5). Values are stored as given: a
// std::weak_ptr value does not extend the lifetime of its object.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>  // std::shared_lock
#include <optional>
#include <thread>  // std::this_thread::yield (ShardLock)
#include <unordered_map>
#include <utility>
#include <vector>

#include "fluxon/runtime/frequency_sketch.hpp"
#include "fluxon/runtime/open_addressing.hpp"
#include "fluxon/runtime/status.hpp"
#include "fluxon/runtime/window_sims.hpp"

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
  // Exclusive, only if nobody holds the lock now.
  bool try_lock() {
    uint32_t idle = 0;
    return state_.compare_exchange_strong(idle, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }

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
    double window_ratio = 0.01;        // the window share when it does not adapt
    double protected_ratio = 0.80;     // of the main space
    bool adaptive_window = true;       // the simulations choose the window share (see above)
  };

  explicit WeightedCache(Options o) : opts_(std::move(o)) {
    const size_t n = std::max<size_t>(1, opts_.shards);
    if (opts_.adaptive_window && opts_.enforce_capacity) {
      sims_ = std::make_unique<WindowSims>(opts_.max_capacity, opts_.estimated_entries);
      opts_.window_ratio = sims_->share();
    }
    const uint64_t per_entries = std::max<uint64_t>(64, opts_.estimated_entries / n);
    for (size_t i = 0; i < n; ++i) {
      auto s = std::make_unique<Shard>(per_entries);
      s->id = i;
      s->cap = opts_.max_capacity / n + (i < opts_.max_capacity % n ? 1 : 0);
      s->set_window(opts_.window_ratio, opts_.protected_ratio);
      s->rng = 0x9e3779b97f4a7c15ull ^ (i + 1);
      shards_.push_back(std::move(s));
    }
  }

  virtual ~WeightedCache() = default;

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
  Status insert(const K& key, V value, uint64_t weight) { return insert(key, std::move(value), weight, nullptr); }

  // As above; the entries this insert evicted for capacity (cause Size) are also appended to
  // *evicted_out (a core without threads acts on them at once, as with evict_some_if).
  Status insert(const K& key, V value, uint64_t weight, std::vector<std::pair<K, V>>* evicted_out) {
    if (weight == 0) return invalid_argument("weight: must be > 0");
    const uint64_t h = hash_of(key);
    Shard& s = shard(h);
    Events ev;
    {
      std::unique_lock<ShardLock> g(s.m);
      drain_reads(s);
      if (Node* found = s.index.find(h, key)) {
        Node& n = *found;
        ev.push_back(Event{key, std::move(n.value), n.weight, RemovalCause::kReplaced});
        n.value = std::move(value);
        s.adjust_weight(n, weight);
        s.replay_read(n, tick_.fetch_add(1, std::memory_order_relaxed) + 1);
        simulate(h, weight);
      } else {
        Node& n = *s.index.insert(h, key);
        n.value = std::move(value);
        n.weight = weight;
        n.hash = h;
        n.stamp = tick_.fetch_add(1, std::memory_order_relaxed) + 1;
        s.sketch.increment(h);
        s.link(Region::kWindow, n);
        s.count.fetch_add(1, std::memory_order_relaxed);
        simulate(h, weight);
      }
      if (opts_.enforce_capacity && s.total_w.load(std::memory_order_relaxed) > s.cap) borrow(s, ev);
      maintain(s, ev);
    }
    if (evicted_out)
      for (const auto& e : ev)
        if (e.cause == RemovalCause::kSize) evicted_out->emplace_back(e.key, e.value);
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
    s.record_read(*n, h, sims_.get());
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
    s.record_read(*n, h, sims_.get());
    return true;
  }

  // touch(*keys[i]) for every i < n (key_hashes[i] = Hash{}(*keys[i])), in this order within each shard, and the number
  // found. The batch's memory misses overlap: per shard, under one shared lock, every key's slot is
  // prefetched, then every candidate node, then every candidate's key bytes, before any is compared
  // (a 128-key batch paid about three misses per key one after another before: the owner's get_start).
  size_t touch_many(const K* const* keys, const uint64_t* key_hashes, size_t n) {
    thread_local std::vector<Probe> probes;
    size_t found = 0;
    for (auto& sp : shards_) {
      Shard& s = *sp;
      probes.clear();
      for (size_t i = 0; i < n; ++i) {
        const uint64_t h = mix(key_hashes[i]);
        if (&shard(h) == &s) probes.push_back(Probe{h, keys[i], nullptr});
      }
      if (probes.empty()) continue;
      std::shared_lock<ShardLock> g(s.m);
      for (const Probe& p : probes) s.index.prefetch_slot(p.h);
      for (Probe& p : probes)
        if ((p.node = s.index.first_candidate(p.h))) __builtin_prefetch(p.node);
      for (const Probe& p : probes)
        if (p.node) __builtin_prefetch(p.node->key_storage.data());
      for (Probe& p : probes) {
        Node* node = p.node && p.node->key_storage == *p.key ? p.node : s.index.find(p.h, *p.key);
        if (!node) continue;
        s.record_read(*node, p.h, sims_.get());
        found++;
      }
    }
    return found;
  }

  bool contains(const K& key) const {
    const uint64_t h = hash_of(key);
    const Shard& s = shard(h);
    std::shared_lock<ShardLock> g(s.m);
    return s.index.find(h, key) != nullptr;
  }

  // A copy of the value without recording an access (nullopt: absent).
  std::optional<V> peek(const K& key) const {
    const uint64_t h = hash_of(key);
    const Shard& s = shard(h);
    std::shared_lock<ShardLock> g(s.m);
    const Node* n = s.index.find(h, key);
    if (!n) return std::nullopt;
    return n->value;
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
  //
  // Coldest first across the shards: each step takes the shard whose next eligible victim (in the
  // shard's own order: probation, window, protected, each from its LRU end) was used least recently
  // (its stamp), so that a small request does not always fall on the same shard and the order is a
  // single cache's. (Before: a round robin from shard 0, which took every small request from shard
  // 0 - measured on the multi-turn prefix trace, tools/cache_bench.cpp: 3% prefix byte hits at 1%
  // of the working set against LRU's 24%.) Each shard's candidate is found again under its lock
  // before it goes.
  // order kRecency: the least recently used eligible entry of each shard, whatever its region (an
  // LRU order among the entries pred accepts: prefix-aware eviction's leaves, see Eviction).
  enum class Order : uint8_t { kPolicy, kRecency };
 private:
  struct Node;
  // Where a Scan's walk of one shard stands: the next entry to judge in region kOrder[region].
  struct Cursor {
    uint64_t budget = ~uint64_t(0);
    bool valid = false;
    uint64_t mods = 0;  // the shard's mods when `at` was last known to be linked
    int region = 0;
    Node* at = nullptr;
  };

 public:
  // A scan of the eviction order that goes on where it stopped (kPolicy order): each shard's walk
  // resumes after the entries pred turned down, so selecting k entries behind n ineligible ones
  // costs n + k calls of pred, not k * n (a whole core at 250,000 entries of an owner whose coldest
  // pages were not recoverable: every selection walked them all again). Resuming assumes pred's
  // answer for an entry it turned down holds while the Scan is used; reset() when it may not. A
  // change of the shard by anything but the scan's own removals (a read replayed, an insert)
  // restarts that shard's walk from its cold end. `budget`: at most that many calls of pred per
  // shard over the Scan's life (resets included), the cold end first; then the shard offers
  // nothing more.
  class Scan {
   public:
    explicit Scan(uint64_t budget = ~uint64_t(0)) : budget_(budget) {}
    void reset() {
      for (auto& c : at_) c.valid = false;
    }
    // pred calls left in the shard with the fewest (tests and diagnostics).
    uint64_t budget_left() const {
      uint64_t b = budget_;
      for (const auto& c : at_) b = std::min(b, c.budget);
      return b;
    }

   private:
    friend class WeightedCache;
    uint64_t budget_;
    std::vector<Cursor> at_;
  };
  template <class Pred>
  uint64_t evict_some_if(uint64_t bytes, Pred pred, std::vector<std::pair<K, V>>* selected_out,
                         Order order = Order::kPolicy, Scan* scan = nullptr) {
    constexpr uint64_t kNone = ~uint64_t(0);
    Scan own;
    Scan& sc = scan ? *scan : own;
    if (sc.at_.size() != shards_.size()) sc.at_.assign(shards_.size(), Cursor{sc.budget_});
    std::vector<uint64_t> stamp(shards_.size(), kNone);  // each shard's candidate's stamp, kNone: none
    auto peek = [&](size_t i) {
      Shard& s = *shards_[i];
      std::unique_lock<ShardLock> g(s.m);
      drain_reads(s);
      const Node* n = s.first_eligible(pred, order, sc.at_[i]);
      stamp[i] = n ? n->stamp : kNone;
    };
    for (size_t i = 0; i < shards_.size(); ++i) peek(i);
    uint64_t selected = 0;
    while (selected < bytes) {
      size_t best = 0;
      for (size_t i = 1; i < shards_.size(); ++i)
        if (stamp[i] < stamp[best]) best = i;
      if (stamp[best] == kNone) break;  // nothing eligible is left
      Shard& s = *shards_[best];
      Events ev;
      {
        std::unique_lock<ShardLock> g(s.m);
        drain_reads(s);
        Cursor& c = sc.at_[best];
        Node* n = s.first_eligible(pred, order, c);
        if (n && n->stamp <= stamp[best]) {
          selected += n->weight;
          // The walk goes on after n: its own removal leaves the cursor valid.
          const bool valid = c.valid && c.mods == s.mods;
          if (c.at == n) c.at = s.list(n->region).after(n);
          s.erase(*n, RemovalCause::kSize, ev);
          if (valid) c.mods = s.mods;
          n = s.first_eligible(pred, order, c);
        }
        stamp[best] = n ? n->stamp : kNone;  // (used since the peek: compared again)
      }
      if (selected_out)
        for (const auto& e : ev) selected_out->emplace_back(e.key, e.value);
      publish(ev);
    }
    return selected;
  }

  // The shard a key lives in (tests and diagnostics).
  size_t shard_of(const K& key) const { return shard(hash_of(key)).id; }

  // The window share the cache uses now (the simulations' choice when it adapts).
  double window_ratio() const { return sims_ ? sims_->share() : opts_.window_ratio; }

  // What the window simulations did so far (all zero when the window does not adapt).
  struct Adaptation {
    double window_ratio = 0;
    uint64_t sample_rate = 0;  // 1 key in this many is simulated
    uint64_t epochs = 0;       // scoring epochs completed
    uint64_t changes = 0;      // times the chosen share changed
    uint64_t sim_entries = 0;  // keys the largest simulation holds
    uint64_t sim_capacity = 0; // its capacity in bytes (the cache's / sample_rate)
  };
  Adaptation adaptation() const {
    Adaptation a;
    a.window_ratio = window_ratio();
    if (!sims_) return a;
    std::lock_guard<std::mutex> g(sims_m_);
    a.sample_rate = sims_->sample_rate();
    a.epochs = sims_->epochs();
    a.changes = sims_->changes();
    a.sim_entries = sims_->entries(WindowSims::kCount - 1);
    a.sim_capacity = sims_->capacity(WindowSims::kCount - 1);
    return a;
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
    uint64_t stamp = 0;  // the cache's tick at the last insert or replayed read
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
    void prefetch_slot(uint64_t h) const { __builtin_prefetch(&slots_[h & mask()]); }
    // The first node on h's probe whose hash is h (nearly always the key's own), or null.
    Node* first_candidate(uint64_t h) const {
      for (size_t i = h & mask();; i = (i + 1) & mask()) {
        const Slot& sl = slots_[i];
        if (!sl.node) return nullptr;
        if (sl.hash == h) return sl.node;
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
      backward_shift_erase(slots_, i, [](const Slot& s) { return s.hash; }, [](const Slot& s) { return s.node != nullptr; });
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

 protected:
  struct Event {
    K key;
    V value;
    uint64_t weight;
    RemovalCause cause;
  };
  using Events = std::vector<Event>;
  // The removals of one call, after its locks are released: NotifyingCache reports them.
  virtual void removed(Events&) {}

 private:

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
    double share = 0;  // the window share window_cap was computed for
    size_t id = 0;
    uint64_t mods = 0;  // changes of the lists' order (a Cursor is valid while it holds)
    // The stamp of the entry this shard would evict next (the older of the window's and
    // probation's LRU ends), for other shards deciding where capacity is worth least.
    std::atomic<uint64_t> coldest{~uint64_t(0)};

    void publish_coldest() {
      uint64_t c = ~uint64_t(0);
      for (Region r : {Region::kWindow, Region::kProbation})
        if (Node* f = list(r).front()) c = std::min(c, f->stamp);
      coldest.store(c, std::memory_order_relaxed);
    }

    void set_window(double window_share, double protected_ratio) {
      share = window_share;
      window_cap = std::max<uint64_t>(1, uint64_t(double(cap) * window_share));
      protected_cap = uint64_t(double(cap - std::min(cap, window_cap)) * protected_ratio);
    }

    // Reads are recorded in a ring of entries that writers replay under the exclusive lock
    // (Caffeine's read buffer): a read pays no sketch miss and no list update. Every exclusive
    // section replays the ring before it changes anything, so the entries in it are alive. When
    // more than kReadBuffer reads arrive between two writes of a shard, the excess only marks its
    // entries referenced (the sketch does not count it: a sample of a read-heavy phase).
    static constexpr uint64_t kReadBuffer = 1024;
    std::atomic<Node*> read_ring[kReadBuffer] = {};
    std::atomic<uint64_t> read_tail{0}, read_head{0};
    // Reads of sampled keys (hash, weight) for the window simulations: a ring of their own, so
    // that they are kept when the sketch's ring overflows (they are 1 in sample_rate reads).
    std::atomic<uint64_t> sample_ring[kReadBuffer][2] = {};
    std::atomic<uint64_t> sample_tail{0}, sample_head{0};

    void record_read(Node& n, uint64_t h, const WindowSims* sims) {
      // Approximate counters: plain relaxed loads and stores, no locked instruction (concurrent
      // readers may overwrite each other's slot: that read is lost, never torn).
      if (sims && sims->sampled(h)) {
        const uint64_t tail = sample_tail.load(std::memory_order_relaxed);
        if (tail - sample_head.load(std::memory_order_relaxed) < kReadBuffer) {
          sample_ring[tail % kReadBuffer][0].store(h, std::memory_order_relaxed);
          sample_ring[tail % kReadBuffer][1].store(n.weight, std::memory_order_relaxed);
          sample_tail.store(tail + 1, std::memory_order_relaxed);
        }
      }
      const uint64_t tail = read_tail.load(std::memory_order_relaxed);
      if (tail - read_head.load(std::memory_order_relaxed) >= kReadBuffer) {  // full: second chance
        if (!n.referenced.load(std::memory_order_relaxed)) n.referenced.store(true, std::memory_order_relaxed);
        return;
      }
      read_ring[tail % kReadBuffer].store(&n, std::memory_order_relaxed);
      read_tail.store(tail + 1, std::memory_order_relaxed);
    }
    // Under the exclusive lock: a recorded read moves its entry to the MRU end of its list.
    void replay_read(Node& n, uint64_t now) {
      sketch.increment(n.hash);
      n.stamp = now;
      n.referenced.store(false, std::memory_order_relaxed);
      ++mods;
      if (n.region == Region::kProbation) {
        promote(n, nullptr);
        return;
      }
      List::unlink(n);
      list(n.region).push_back(n);
    }
    List& list(Region r) { return lists[int(r)]; }
    void link(Region r, Node& n) {
      ++mods;
      n.region = r;
      list(r).push_back(n);
      w[int(r)] += n.weight;
      total_w.fetch_add(n.weight, std::memory_order_relaxed);
    }
    void unlink(Node& n) {
      ++mods;
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
    // The first entry pred accepts in eviction order (probation, window, protected, each from its
    // LRU end), or with kRecency the least recently used of each list's first: null if none.
    // kPolicy walks on from `c` (Scan); kRecency looks at each list from its LRU end.
    template <class Pred>
    Node* first_eligible(Pred& pred, Order order, Cursor& c) {
      static constexpr Region kOrder[3] = {Region::kProbation, Region::kWindow, Region::kProtected};
      if (order == Order::kPolicy) {
        if (!c.valid || c.mods != mods) {
          c.valid = true;
          c.mods = mods;
          c.region = 0;
          c.at = list(kOrder[0]).front();
        }
        while (c.region < 3) {
          for (; c.at; c.at = list(kOrder[c.region]).after(c.at)) {
            if (c.budget == 0) return nullptr;
            --c.budget;
            if (pred(c.at->key_storage, c.at->value)) return c.at;
          }
          if (++c.region < 3) c.at = list(kOrder[c.region]).front();
        }
        return nullptr;
      }
      Node* best = nullptr;
      for (Region r : kOrder)
        for (Node* n = list(r).front(); n; n = list(r).after(n)) {
          if (c.budget == 0) return best;
          --c.budget;
          if (!pred(n->key_storage, n->value)) continue;
          if (!best || n->stamp < best->stamp) best = n;
          break;
        }
      return best;
    }
  };

  struct Probe {
    uint64_t h;
    const K* key;
    Node* node;
  };
  uint64_t hash_of(const K& key) const { return mix(static_cast<uint64_t>(Hash{}(key))); }
  static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
  }
  Shard& shard(uint64_t h) { return *shards_[(h >> 40) % shards_.size()]; }
  const Shard& shard(uint64_t h) const { return *shards_[(h >> 40) % shards_.size()]; }

  // Under the shard's exclusive lock: the reads recorded since the last write go into the sketch,
  // the sampled ones into the window simulations.
  void drain_reads(Shard& s) {
    const uint64_t tail = s.read_tail.load(std::memory_order_relaxed);
    uint64_t head = s.read_head.load(std::memory_order_relaxed);
    if (tail - head > Shard::kReadBuffer) head = tail - Shard::kReadBuffer;
    const uint64_t now = tick_.load(std::memory_order_relaxed);
    for (; head != tail; ++head) s.replay_read(*s.read_ring[head % Shard::kReadBuffer].load(std::memory_order_relaxed), now);
    s.read_head.store(tail, std::memory_order_relaxed);
    if (!sims_) return;
    const uint64_t stail = s.sample_tail.load(std::memory_order_relaxed);
    uint64_t shead = s.sample_head.load(std::memory_order_relaxed);
    if (shead == stail) return;
    std::lock_guard<std::mutex> g(sims_m_);
    for (; shead != stail; ++shead) {
      auto& slot = s.sample_ring[shead % Shard::kReadBuffer];
      sims_->access(slot[0].load(std::memory_order_relaxed), slot[1].load(std::memory_order_relaxed));
    }
    s.sample_head.store(stail, std::memory_order_relaxed);
  }
  // A write of a key (hash) of `weight` bytes, for the window simulations.
  void simulate(uint64_t h, uint64_t weight) {
    if (!sims_ || !sims_->sampled(h)) return;
    std::lock_guard<std::mutex> g(sims_m_);
    sims_->access(h, weight);
  }

  // Shard s is over its capacity. Hash partitioning gives each shard a noisy share of the working
  // set, so a fixed capacity per shard evicts entries a single cache would keep. Instead, when
  // another shard (one chosen at random: two choices) would evict an older entry than s, s takes
  // capacity from it and it evicts now; the sum of the capacities stays max_capacity. Only while
  // the window is the whole cache (an LRU): with a frequency-biased main, an entry's age says
  // little of its worth (measured: Zipf 1.0 at 1% lost 1.5 points). Under s's lock; the other
  // shard's lock is only tried, so two shards borrowing from each other never wait.
  void borrow(Shard& s, Events& ev) {
    const size_t n = shards_.size();
    if (n < 2 || s.share < 1.0) return;
    s.publish_coldest();
    Shard& j = *shards_[(s.id + 1 + s.next_random() % (n - 1)) % n];
    if (j.coldest.load(std::memory_order_relaxed) >= s.coldest.load(std::memory_order_relaxed)) return;
    if (!j.m.try_lock()) return;
    drain_reads(j);
    const uint64_t floor = opts_.max_capacity / n / 8;  // a shard keeps at least 1/8 of its share
    const uint64_t need = s.total_w.load(std::memory_order_relaxed) - s.cap;
    const uint64_t give = std::min(need, j.cap > floor ? j.cap - floor : 0);
    if (give > 0) {
      j.cap -= give;
      j.set_window(j.share, opts_.protected_ratio);
      s.cap += give;
      s.set_window(s.share, opts_.protected_ratio);
      maintain(j, ev);
    }
    j.m.unlock();
  }

  // Window overflow becomes main candidates; then, when capacity is enforced, main is brought
  // back under capacity by admission duels between candidates and probation victims.
  void maintain(Shard& s, Events& ev) {
    if (sims_ && sims_->share() != s.share) {
      s.set_window(sims_->share(), opts_.protected_ratio);
      // A smaller main: its least recently used entries join the window where their last access
      // puts them (the window is in stamp order), so a return to a larger window loses no
      // recency; then protected overflow goes back to probation. (A larger main just admits the
      // window's overflow without duels until it is full.)
      const uint64_t main_cap = s.cap - std::min(s.cap, s.window_cap);
      if (s.w[int(Region::kProbation)] + s.w[int(Region::kProtected)] > main_cap) {
        std::vector<Node*> main;
        for (Region r : {Region::kProbation, Region::kProtected})
          for (Node* n = s.list(r).front(); n; n = s.list(r).after(n)) main.push_back(n);
        std::sort(main.begin(), main.end(), [](const Node* a, const Node* b) { return a->stamp < b->stamp; });
        Node* at = s.list(Region::kWindow).front();
        for (Node* d : main) {
          if (s.w[int(Region::kProbation)] + s.w[int(Region::kProtected)] <= main_cap) break;
          while (at && at->stamp <= d->stamp) at = s.list(Region::kWindow).after(at);
          s.unlink(*d);
          d->region = Region::kWindow;
          if (at) s.list(Region::kWindow).insert_before(at, *d);
          else s.list(Region::kWindow).push_back(*d);
          s.w[int(Region::kWindow)] += d->weight;
          s.total_w.fetch_add(d->weight, std::memory_order_relaxed);
        }
      }
      while (s.w[int(Region::kProtected)] > s.protected_cap) {
        Node* d = s.list(Region::kProtected).front();
        s.unlink(*d);
        s.link(Region::kProbation, *d);
      }
    }
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
        s.erase(*victim, RemovalCause::kSize, ev);
        victim = next;
      } else {
        Node* next = prob.after(candidate);
        s.erase(*candidate, RemovalCause::kSize, ev);
        candidate = next;
        candidates--;
      }
    }
    if (s.share >= 1.0 && shards_.size() > 1) s.publish_coldest();  // read by borrow() only
  }

  template <class Pred>
  std::optional<V> remove_if(const K& key, Pred pred, bool want_value) {
    const uint64_t h = hash_of(key);
    Shard& s = shard(h);
    Events ev;
    std::optional<V> out;
    {
      std::unique_lock<ShardLock> g(s.m);
      drain_reads(s);
      Node* n = s.index.find(h, key);
      if (!n || !pred(static_cast<const V&>(n->value))) return std::nullopt;
      if (want_value) out = n->value;
      else out.emplace();
      s.erase(*n, RemovalCause::kExplicit, ev);
    }
    publish(ev);
    return out;
  }

  void publish(Events& ev) {
    if (!ev.empty()) removed(ev);
  }

  Options opts_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<uint64_t> tick_{0};     // counts inserts: the clock of Node::stamp
  std::unique_ptr<WindowSims> sims_;  // adaptive window only; sims_m_ is taken below a shard lock
  mutable std::mutex sims_m_;

};

}  // namespace fluxon
