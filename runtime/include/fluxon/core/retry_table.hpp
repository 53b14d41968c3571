// RetryTable: the jobs of one kind that the owner keeps asking the master about until a reply
// settles them (T1), with the tokens of every attempt. Any attempt's reply finds its job — a late
// answer to an early attempt settles it like the last one would —, and once the job is settled or
// its attempts are forgotten, their replies find nothing (a duplicate: dropped). Ordered by id, so
// re-sends go out in the same order every run (the simulation replays exactly).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fluxon {

template <class Job>
class RetryTable {
 public:
  using Map = std::map<uint64_t, Job>;
  using iterator = typename Map::iterator;
  using const_iterator = typename Map::const_iterator;

  iterator begin() { return jobs_.begin(); }
  iterator end() { return jobs_.end(); }
  const_iterator begin() const { return jobs_.begin(); }
  const_iterator end() const { return jobs_.end(); }
  iterator find(uint64_t id) { return jobs_.find(id); }
  Job& at(uint64_t id) { return jobs_.at(id); }
  size_t count(uint64_t id) const { return jobs_.count(id); }
  size_t size() const { return jobs_.size(); }
  bool empty() const { return jobs_.empty(); }

  std::pair<iterator, bool> emplace(uint64_t id, Job job) { return jobs_.emplace(id, std::move(job)); }
  // The job leaves with its attempts.
  void erase(iterator it) {
    forget(it->first);
    jobs_.erase(it);
  }
  Job take(iterator it) {
    Job j = std::move(it->second);
    erase(it);
    return j;
  }
  // An attempt of job `id` went out under `token`.
  void attempt(uint64_t id, uint64_t token) {
    by_token_[token] = id;
    attempts_[id].push_back(token);
  }
  // The job an attempt belongs to, while it is not settled.
  std::optional<uint64_t> id_of(uint64_t token) const {
    auto it = by_token_.find(token);
    if (it == by_token_.end()) return std::nullopt;
    return it->second;
  }
  // The attempts so far are answered (the job may go on with new ones).
  void forget(uint64_t id) {
    auto a = attempts_.find(id);
    if (a == attempts_.end()) return;
    for (uint64_t t : a->second) by_token_.erase(t);
    attempts_.erase(a);
  }
  size_t attempts_in_flight() const { return by_token_.size(); }

 private:
  Map jobs_;
  std::unordered_map<uint64_t, uint64_t> by_token_;               // token -> job id
  std::unordered_map<uint64_t, std::vector<uint64_t>> attempts_;  // job id -> its tokens
};

}  // namespace fluxon
