// WindowSims: miniature simulations that choose the window size of a W-TinyLFU cache.
//
// The idea is Waldspurger et al.'s ("Cache Modeling and Optimization using Miniature Simulations",
// USENIX ATC 2017): a cache of capacity C fed with a spatially hashed sample 1/R of the keys and
// given capacity C/R behaves, in hit ratio, like the full cache. WindowSims keeps a few such
// metadata-only caches (hashes and weights, no values), identical except for the window share of
// their capacity, fed with the same sampled accesses, and scores each by the bytes it hit over
// epochs of sampled accesses (each epoch's score halves the last one's). The full cache uses the
// window share of the best scorer; it changes only when another one beats the present choice by a
// margin, so that ties (a workload on which every share does the same) never move it.
//
// A new cache starts with the largest share, 100%: an LRU. Until the simulations show that
// frequency pays, nothing is lost against LRU on recency workloads (multi-turn prefix chains,
// where LRU's misses are the compulsory ones); on frequency workloads (Zipf) the simulations
// see the gap within a few epochs, which costs a small part of a point. The score's memory is
// short on purpose: a phase in which another share wins is worth following only at once (a
// memory of 8 epochs, or a lead required over 4 or 8 epochs, switched after such phases were
// half over and lost up to 0.1 point against LRU on the prefix trace; see tools/cache_bench.cpp).
//
// Not thread-safe: the owner serializes calls (WeightedCache: a mutex of its own, below the shard
// locks). The frequency sketch is the simulations' own: their accesses are the same stream for all.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>

#include "fluxon/runtime/frequency_sketch.hpp"

namespace fluxon {

class WindowSims {
 public:
  static constexpr std::array<double, 5> kShares = {0.01, 0.05, 0.20, 0.50, 1.00};
  static constexpr size_t kCount = kShares.size();
  static constexpr uint64_t kEpoch = 1024;  // sampled accesses per scoring epoch
  static constexpr double kKeep = 0.5;      // an epoch's score keeps this share of the last one's
  static constexpr double kMargin = 1.005;  // a challenger must score 0.5% more than the choice

  // capacity: the full cache's, in bytes; sketch_entries: what the cache sized its own frequency
  // sketches for (the simulations' sketch is that over the sample rate, so that it ages alike).
  // The sample starts with every key and halves (keeping a subset of itself) whenever a simulation
  // would hold more than max_entries keys.
  WindowSims(uint64_t capacity, uint64_t sketch_entries, uint64_t max_entries = 4096)
      : max_entries_(max_entries), sketch_entries_(sketch_entries), sketch_(std::make_unique<FrequencySketch>(sketch_entries)) {
    for (size_t i = 0; i < kCount; ++i) sims_[i].configure(capacity, kShares[i]);
  }

  // Whether a key (hash) is in the sample now; lock-free, for the callers' read paths.
  bool sampled(uint64_t hash) const { return ((hash >> 16) & mask_.load(std::memory_order_relaxed)) == 0; }
  // The window share the full cache should use now; lock-free.
  double share() const { return kShares[choice_.load(std::memory_order_relaxed)]; }

  // One access of a key (hash) of `weight` bytes; ignored unless sampled.
  void access(uint64_t hash, uint64_t weight) {
    if (!sampled(hash)) return;
    sketch_->increment(hash);
    for (auto& s : sims_) s.access(hash, weight, *sketch_);
    if (sims_[kCount - 1].index.size() > max_entries_) halve_sample();
    if (++in_epoch_ < kEpoch) return;
    in_epoch_ = 0;
    epochs_++;
    const size_t choice = choice_.load(std::memory_order_relaxed);
    size_t best = choice;
    for (size_t i = 0; i < kCount; ++i) {
      sims_[i].score = sims_[i].score * kKeep + double(sims_[i].epoch_hit_bytes);
      sims_[i].epoch_hit_bytes = 0;
      if (sims_[i].score > sims_[best].score) best = i;
    }
    if (best != choice && sims_[best].score > sims_[choice].score * kMargin) {
      choice_.store(best, std::memory_order_relaxed);
      changes_++;
    }
  }

  uint64_t sample_rate() const { return mask_.load(std::memory_order_relaxed) + 1; }  // 1 in this many keys
  uint64_t epochs() const { return epochs_; }
  uint64_t changes() const { return changes_; }
  // Entries simulation i holds now, and its capacity (tests: bounded by the sample).
  size_t entries(size_t i) const { return sims_[i].index.size(); }
  uint64_t capacity(size_t i) const { return sims_[i].cap; }

 private:
  // Keys whose next hash bit is set leave the sample; every capacity halves with it.
  void halve_sample() {
    const uint64_t mask = mask_.load(std::memory_order_relaxed);
    if (mask >= (uint64_t(1) << 40)) return;
    const uint64_t bit = mask + 1;
    mask_.store(mask | bit, std::memory_order_relaxed);
    sketch_ = std::make_unique<FrequencySketch>(std::max<uint64_t>(64, sketch_entries_ / sample_rate()));
    for (size_t i = 0; i < kCount; ++i) {
      Sim& s = sims_[i];
      for (int r = 0; r < 3; ++r)
        for (auto it = s.lists[r].begin(); it != s.lists[r].end();) {
          auto next = std::next(it);
          if ((it->hash >> 16) & bit) s.drop(it, Sim::Region(r));
          it = next;
        }
      s.configure(s.cap / 2, kShares[i]);
      s.epoch_hit_bytes /= 2;
      s.score /= 2;
      s.shrink();
    }
  }

  // One metadata-only W-TinyLFU: window LRU, then probation and protected (80% of main).
  struct Sim {
    enum Region : uint8_t { kWindow, kProbation, kProtected };
    struct Entry {
      uint64_t hash, weight;
    };
    struct Where {
      Region region;
      std::list<Entry>::iterator it;
    };
    uint64_t cap = 0, window_cap = 0, main_cap = 0, protected_cap = 0;
    std::list<Entry> lists[3];  // front = least recently used
    uint64_t w[3] = {0, 0, 0};
    std::unordered_map<uint64_t, Where> index;
    uint64_t epoch_hit_bytes = 0;
    double score = 0;

    void configure(uint64_t capacity, double share) {
      cap = capacity;
      window_cap = std::max<uint64_t>(1, uint64_t(double(cap) * share));
      main_cap = cap - std::min(cap, window_cap);
      protected_cap = uint64_t(double(main_cap) * 0.8);
    }
    void move(Where& at, Region to) {
      w[at.region] -= at.it->weight;
      w[to] += at.it->weight;
      lists[to].splice(lists[to].end(), lists[at.region], at.it);
      at.region = to;
    }
    void drop(std::list<Entry>::iterator it, Region r) {
      w[r] -= it->weight;
      index.erase(it->hash);
      lists[r].erase(it);
    }
    // Back under capacity after a change of it: protected overflow to probation, window overflow
    // through admission, then the coldest main entries.
    void shrink() {
      while (w[kProtected] > protected_cap) move(index.find(lists[kProtected].front().hash)->second, kProbation);
      while (w[kWindow] > window_cap) drop(lists[kWindow].begin(), kWindow);
      while (w[kProbation] + w[kProtected] > main_cap)
        drop(lists[kProbation].empty() ? lists[kProtected].begin() : lists[kProbation].begin(),
             lists[kProbation].empty() ? kProtected : kProbation);
    }
    void access(uint64_t hash, uint64_t weight, const FrequencySketch& sketch) {
      auto found = index.find(hash);
      if (found != index.end()) {
        Where& at = found->second;
        epoch_hit_bytes += at.it->weight;
        move(at, at.region == kWindow ? kWindow : kProtected);
        while (w[kProtected] > protected_cap) move(index.find(lists[kProtected].front().hash)->second, kProbation);
        return;
      }
      if (weight > cap) return;
      lists[kWindow].push_back(Entry{hash, weight});
      w[kWindow] += weight;
      index.emplace(hash, Where{kWindow, std::prev(lists[kWindow].end())});
      while (w[kWindow] > window_cap) {
        const uint64_t c = lists[kWindow].front().hash;
        move(index.find(c)->second, kProbation);
        admit(std::prev(lists[kProbation].end()), sketch);
      }
    }
    // The candidate (newest in probation) against the coldest main entries, on frequency.
    void admit(std::list<Entry>::iterator c, const FrequencySketch& sketch) {
      const uint32_t cf = sketch.frequency(c->hash);
      while (w[kProbation] + w[kProtected] > main_cap) {
        Region vr = kProbation;
        auto v = lists[kProbation].begin();
        if (v == c) {
          if (lists[kProtected].empty()) break;
          vr = kProtected;
          v = lists[kProtected].begin();
        }
        if (cf <= sketch.frequency(v->hash)) break;
        drop(v, vr);
      }
      if (w[kProbation] + w[kProtected] > main_cap) drop(c, kProbation);
    }
  };

  const uint64_t max_entries_, sketch_entries_;
  std::atomic<uint64_t> mask_{0};
  std::atomic<size_t> choice_{kCount - 1};
  std::unique_ptr<FrequencySketch> sketch_;
  std::array<Sim, kCount> sims_;
  uint64_t in_epoch_ = 0, epochs_ = 0, changes_ = 0;
};

}  // namespace fluxon
