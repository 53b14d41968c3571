// RetryTable: the jobs of one kind that the owner keeps asking the master about until a reply
// settles them (T1), with the tokens of every attempt. Any attempt's reply finds its job — a late
// answer to an early attempt settles it like the last one would —, and once the job is settled or
// its attempts are forgotten, their replies find nothing (a duplicate: dropped). Ordered by id, so
// re-sends go out in the same order every run (the simulation replays exactly). Each job's next
// re-send time (Job::next_send, set only through schedule()) is indexed: due(now) finds the jobs
// to ask again without scanning the rest.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <algorithm>
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
  const_iterator find(uint64_t id) const { return jobs_.find(id); }
  Job& at(uint64_t id) { return jobs_.at(id); }
  size_t count(uint64_t id) const { return jobs_.count(id); }
  size_t size() const { return jobs_.size(); }
  bool empty() const { return jobs_.empty(); }

  std::pair<iterator, bool> emplace(uint64_t id, Job job) {
    auto r = jobs_.emplace(id, std::move(job));
    if (r.second) timers_.emplace(r.first->second.next_send, id);
    return r;
  }
  // The job leaves with its attempts and its timer.
  void erase(iterator it) {
    forget(it->first);
    timers_.erase({it->second.next_send, it->first});
    jobs_.erase(it);
  }
  // The next time job `id` is asked again.
  void schedule(uint64_t id, int64_t when) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    timers_.erase({it->second.next_send, id});
    it->second.next_send = when;
    timers_.emplace(when, id);
  }
  // The jobs whose re-send time has come, in id order (as a scan of the table would find them).
  std::vector<uint64_t> due(int64_t now) const {
    std::vector<uint64_t> ids;
    for (auto t = timers_.begin(); t != timers_.end() && t->first <= now; ++t) ids.push_back(t->second);
    std::sort(ids.begin(), ids.end());
    return ids;
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
  // Whether an attempt of job `id` went out under `token` (several jobs may share one message).
  bool attempted(uint64_t id, uint64_t token) const {
    auto a = attempts_.find(id);
    return a != attempts_.end() && std::find(a->second.begin(), a->second.end(), token) != a->second.end();
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
  std::set<std::pair<int64_t, uint64_t>> timers_;                  // (next_send, job id)
  std::unordered_map<uint64_t, uint64_t> by_token_;               // token -> job id
  std::unordered_map<uint64_t, std::vector<uint64_t>> attempts_;  // job id -> its tokens
};

}  // namespace fluxon
