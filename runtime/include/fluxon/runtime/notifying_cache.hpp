// NotifyingCache: WeightedCache with a removal listener. The listener runs on the cache's own
// notifier thread, outside every internal lock; a caller's operation only pushes its removals into
// the notifier queue, and each removed entry is reported exactly once. The queue is bounded
// (Options::max_pending_events): a caller whose removals find it full waits for the listener to
// catch up (lossless backpressure; the listener's own calls into the cache never wait).
#pragma once
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "fluxon/runtime/weighted_cache.hpp"

namespace fluxon {

template <class K, class V, class Hash = std::hash<K>>
class NotifyingCache : public WeightedCache<K, V, Hash> {
  using Base = WeightedCache<K, V, Hash>;

 public:
  using Listener = typename Base::Listener;
  struct Options : Base::Options {
    Listener listener;
    size_t max_pending_events = 1 << 16;
  };

  explicit NotifyingCache(Options o) : Base(o), listener_(std::move(o.listener)), max_pending_(o.max_pending_events) {
    if (listener_) notifier_ = std::thread([this] { run(); });
  }
  ~NotifyingCache() override {
    if (!notifier_.joinable()) return;
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    room_cv_.notify_all();
    notifier_.join();
  }

  // Waits until every removal queued so far has been delivered to the listener.
  void flush_listener() {
    if (!listener_) return;
    std::unique_lock<std::mutex> g(m_);
    idle_cv_.wait(g, [&] { return q_.empty() && !delivering_; });
  }
  // The bound at work: the deepest the queue got, and the callers that had to wait.
  size_t notifier_high_water() {
    std::lock_guard<std::mutex> g(m_);
    return high_water_;
  }
  uint64_t notifier_waits() {
    std::lock_guard<std::mutex> g(m_);
    return waits_;
  }

 private:
  using Event = typename Base::Event;
  void removed(typename Base::Events& ev) override {
    if (!listener_) return;
    {
      std::unique_lock<std::mutex> g(m_);
      if (std::this_thread::get_id() != notifier_.get_id() && q_.size() >= max_pending_) {
        waits_++;
        room_cv_.wait(g, [&] { return stop_ || q_.size() < max_pending_; });
      }
      for (auto& e : ev) q_.push_back(std::move(e));
      high_water_ = std::max(high_water_, q_.size());
    }
    cv_.notify_one();
  }
  void run() {
    std::unique_lock<std::mutex> g(m_);
    while (true) {
      cv_.wait(g, [&] { return stop_ || !q_.empty(); });
      if (q_.empty() && stop_) return;
      std::deque<Event> batch;
      batch.swap(q_);
      room_cv_.notify_all();
      delivering_ = true;
      g.unlock();
      for (auto& e : batch) listener_(e.key, std::move(e.value), e.weight, e.cause);
      g.lock();
      delivering_ = false;
      if (q_.empty()) idle_cv_.notify_all();
    }
  }

  Listener listener_;
  size_t max_pending_;
  std::mutex m_;
  std::condition_variable cv_, idle_cv_, room_cv_;
  std::deque<Event> q_;
  size_t high_water_ = 0;
  uint64_t waits_ = 0;
  bool delivering_ = false;
  bool stop_ = false;
  std::thread notifier_;
};

}  // namespace fluxon
