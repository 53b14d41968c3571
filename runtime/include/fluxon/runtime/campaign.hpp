// The two etcd drivers of the HA mode, each one thread over an EtcdClient:
//   Campaign     runs a master's ElectionCore (fluxon/master/election.hpp) and publishes what the
//                master actor reads before every answer: serving(), term(), the leader's address.
//   LeaderWatch  an owner's view of who leads: follows the leadership key and calls back on a change.
// The leadership key of cluster C is /fluxon/C/leader; its value is the leader's "host:port". Both
// follow it through an etcd watch (KeyFollower): a change reaches them as etcd applies it - a dead
// leader's key expiring wakes the standbys at once, a new leader's key reaches the owners at once -
// with a read every poll_ms only while etcd cannot be watched.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fluxon/master/election.hpp"
#include "fluxon/runtime/clock.hpp"
#include "fluxon/runtime/etcd.hpp"

namespace fluxon {

std::string leader_key(const std::string& cluster);

// One thread following one key: reads it, then watches it from the revision read, so no change is
// missed; calls on_change (on its thread) with the key after every change (nullopt: deleted). When
// the watch breaks, or after kQuietMs without a word from etcd (a stream that died silently), it
// reads and watches again; while it cannot, it retries every retry_ms.
class KeyFollower {
 public:
  using OnChange = std::function<void(const std::optional<EtcdKv>&)>;
  static constexpr int kQuietMs = 10000;
  KeyFollower(std::vector<std::string> endpoints, std::string key, int timeout_ms, int retry_ms, OnChange on_change);
  ~KeyFollower();
  KeyFollower(const KeyFollower&) = delete;
  KeyFollower& operator=(const KeyFollower&) = delete;
  uint64_t watches_opened() const { return opened_.load(); }

 private:
  void run();
  std::vector<std::string> endpoints_;
  std::string key_;
  int timeout_ms_, retry_ms_;
  OnChange on_change_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> opened_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

class Campaign {
 public:
  // Campaigns from start() on (a master that cannot bind its port never runs for leader).
  Campaign(std::vector<std::string> endpoints, const std::string& cluster, ElectionCore::Options o);
  void start();
  ~Campaign();  // stops: a leader resigns (its key goes at once), then the thread ends
  Campaign(const Campaign&) = delete;
  Campaign& operator=(const Campaign&) = delete;

  // E1, from any thread: this master leads and its lease is certainly alive at etcd now.
  bool serving() const;
  uint64_t term() const { return term_.load(); }
  std::string leader_address() const;
  uint64_t elections_won() const { return won_.load(); }
  uint64_t step_downs() const { return step_downs_.load(); }
  uint64_t etcd_errors() const { return errors_.load(); }
  // Wakes the thread now (the master saw a newer term in a request: it may be deposed).
  void poke();

 private:
  void run();
  void publish();

  EtcdClient etcd_;
  std::string key_;
  std::string address_;
  ElectionCore core_;
  ElectionMillis ttl_ms_, poll_ms_;
  int64_t ttl_s_;
  std::atomic<bool> stop_{false}, leader_{false}, poked_{false};
  std::atomic<bool> changed_{false};  // the follower saw the key change: a standby reads it now
  std::atomic<int64_t> valid_until_{0};
  std::atomic<uint64_t> term_{0}, won_{0}, step_downs_{0}, errors_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string leader_address_;
  std::string last_error_;  // the thread's own (for its step-down log line)
  std::thread thread_;
  std::unique_ptr<KeyFollower> follower_;  // after thread_: it pokes the campaign's thread
};

class LeaderWatch {
 public:
  using OnLeader = std::function<void(const LeaderRecord&)>;
  // Follows the key (KeyFollower, retrying every min(poll_ms, 200 ms) while it cannot); on_leader
  // is called (on the follower's thread) when the leader's address or term changes.
  LeaderWatch(std::vector<std::string> endpoints, const std::string& cluster, int poll_ms, OnLeader on_leader);
  ~LeaderWatch();
  LeaderWatch(const LeaderWatch&) = delete;
  LeaderWatch& operator=(const LeaderWatch&) = delete;

 private:
  OnLeader on_leader_;
  LeaderRecord seen_;  // the follower's thread's own
  KeyFollower follower_;
};

}  // namespace fluxon
