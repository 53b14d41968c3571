// ReplicaBudget: the owner's half of the kv_score_pressure_budget admission policy. A replica on a
// CPU owner is worth its bytes only when the owner's own copy will go: while the owner admits
// without evicting, a replica is a duplicate (the design's E16ad/E16ae finding); once every page it
// admits pushes another out, the best-scored groups should be recoverable when their turn comes.
// So the client names the candidate groups (the score rule) with a priority each, and the owner
// keeps, in priority order and whole, the candidates that fit in `pages x pressure` pages of the
// batch, where pressure is the share of the owner's recent admissions that came with an eviction
// (evicted or demoted slots / admitted slots, over the last `window` admitted slots).
//
// TP invariance: the pressure differs from one moment to the next, so the first put of a logical
// group (TP rank removed, `group_id`) decides and the decision is kept for the other
// `shares - 1` puts of the group (the other TP ranks, which share this owner), then dropped. Bounds:
// kMemo decisions kept, each while the owner admits at most kMemoTtlSlots more slots (a rank's put
// that never came: refused, or behind another owner).
//
// Plain state: the clock is the slots admitted (passed in cumulative, with the evictions), never time.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fluxon/runtime/batch.hpp"

namespace fluxon {

class ReplicaBudget {
 public:
  static constexpr size_t kMemo = 65536;
  static constexpr uint64_t kMemoTtlSlots = 1 << 16;

  struct Outcome {
    uint32_t kept_keys = 0, cut_keys = 0, memo_keys = 0;
  };

  // The owner's admissions and evictions so far, cumulative, in slots; `window` (> 0): how many
  // of the last admitted slots the pressure looks at.
  void observe(uint64_t admitted_total, uint64_t evicted_total, uint64_t window) {
    if (!seen_) {
      seen_ = true;
    } else {
      admitted_ += double(admitted_total - last_admitted_);
      evicted_ += double(evicted_total - last_evicted_);
    }
    last_admitted_ = admitted_total;
    last_evicted_ = evicted_total;
    if (admitted_ > double(window)) {  // the older part of both fades in proportion
      const double f = double(window) / admitted_;
      admitted_ *= f;
      evicted_ *= f;
    }
  }
  // In [0, 1]: 0 while nothing admitted was paid for with an eviction, 1 when everything was.
  double pressure() const { return admitted_ <= 0 ? 0.0 : std::min(1.0, evicted_ / admitted_); }

  // Cuts `replica` (per key, constant inside each group of `group_lens`) to the budget of `b`.
  Outcome apply(std::vector<bool>& replica, const std::vector<uint32_t>& group_lens, const ReplicaBudgetArgs& b) {
    const uint64_t now = last_admitted_;
    expire(now);
    Outcome o;
    std::vector<size_t> start(group_lens.size());
    for (size_t g = 0, s = 0; g < group_lens.size(); s += group_lens[g], ++g) start[g] = s;
    auto set = [&](size_t g, bool v) {
      std::fill_n(replica.begin() + long(start[g]), group_lens[g], v);
      (v ? o.kept_keys : o.cut_keys) += group_lens[g];
    };
    std::vector<size_t> undecided;
    for (size_t g = 0; g < group_lens.size(); ++g) {
      if (!replica[start[g]]) continue;  // not a candidate: the client's rule said no, on every rank
      auto it = memo_.find(b.group_ids[g]);
      if (it == memo_.end()) {
        undecided.push_back(g);
        continue;
      }
      o.memo_keys += group_lens[g];
      const bool admit = it->second.admit;
      if (--it->second.left == 0) memo_.erase(it);
      set(g, admit);
    }
    // The best first; equal priorities by the TP-invariant group id.
    std::stable_sort(undecided.begin(), undecided.end(), [&](size_t x, size_t y) {
      if (b.priorities[x] != b.priorities[y]) return b.priorities[x] > b.priorities[y];
      return b.group_ids[x] < b.group_ids[y];
    });
    uint64_t left = uint64_t(double(b.pages) * pressure());
    for (size_t g : undecided) {
      const bool admit = group_lens[g] <= left;
      if (admit) left -= group_lens[g];
      set(g, admit);
      if (b.shares > 1) remember(b.group_ids[g], admit, b.shares - 1, now);
    }
    return o;
  }

  size_t memo_size() const { return memo_.size(); }
  uint64_t memo_dropped() const { return memo_dropped_; }

 private:
  struct Memo {
    bool admit = false;
    uint32_t left = 0;
    uint64_t seq = 0;
  };
  struct Stamp {
    uint64_t id, seq, at;
  };

  void remember(uint64_t id, bool admit, uint32_t left, uint64_t now) {
    memo_[id] = Memo{admit, left, ++seq_};
    order_.push_back(Stamp{id, seq_, now});
    // Both bounded: a consumed decision's stamp waits for the front (order_ at most twice kMemo).
    while (memo_.size() > kMemo || order_.size() > 2 * kMemo) drop_front();
  }
  void expire(uint64_t now) {
    while (!order_.empty() && (now - order_.front().at > kMemoTtlSlots || !live(order_.front()))) drop_front();
  }
  bool live(const Stamp& s) const {
    auto it = memo_.find(s.id);
    return it != memo_.end() && it->second.seq == s.seq;
  }
  void drop_front() {
    if (live(order_.front())) {
      memo_.erase(order_.front().id);
      ++memo_dropped_;  // a share never came (its put refused, or another owner's rank)
    }
    order_.pop_front();
  }

  double admitted_ = 0, evicted_ = 0;
  uint64_t last_admitted_ = 0, last_evicted_ = 0;
  bool seen_ = false;
  std::unordered_map<uint64_t, Memo> memo_;
  std::deque<Stamp> order_;
  uint64_t seq_ = 0, memo_dropped_ = 0;
};

}  // namespace fluxon
