#include "fluxon/runtime/campaign.hpp"
#include "fluxon/runtime/log.hpp"

#include <chrono>
#include <cstdio>

namespace fluxon {

std::string leader_key(const std::string& cluster) { return "/fluxon/" + cluster + "/leader"; }

namespace {
// An etcd call may take this long at most: a keepalive must come back well inside the lease.
int call_timeout(ElectionMillis ttl_ms) { return int(std::max<ElectionMillis>(50, std::min<ElectionMillis>(ttl_ms / 4, 1000))); }
// A follower that cannot read or watch the key (etcd starting, electing its own leader, away) tries
// again this soon: the poll period, at most 200 ms - a long poll period must not delay the watch.
int follower_retry_ms(int poll_ms) { return std::max(1, std::min(poll_ms, 200)); }
}  // namespace

Campaign::Campaign(std::vector<std::string> endpoints, const std::string& cluster, ElectionCore::Options o)
    : etcd_(std::move(endpoints), call_timeout(o.ttl_ms)),
      key_(leader_key(cluster)),
      address_(o.address),
      core_(o),
      ttl_ms_(o.ttl_ms),
      poll_ms_(o.poll_ms),
      ttl_s_(std::max<int64_t>(1, (o.ttl_ms + 999) / 1000)) {}

void Campaign::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
  follower_ = std::make_unique<KeyFollower>(etcd_.endpoints(), key_, call_timeout(ttl_ms_), follower_retry_ms(int(poll_ms_)),
                                            [this](const std::optional<EtcdKv>&) {
                                              {  // under the lock: the thread between its check and its sleep still wakes
                                                std::lock_guard<std::mutex> g(mu_);
                                                changed_ = true;
                                              }
                                              cv_.notify_all();
                                            });
}

Campaign::~Campaign() {
  follower_.reset();
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Campaign::serving() const { return leader_.load() && steady_now_ms() < valid_until_.load(); }

std::string Campaign::leader_address() const {
  std::lock_guard<std::mutex> g(mu_);
  return leader_address_;
}

void Campaign::poke() {
  {
    std::lock_guard<std::mutex> g(mu_);
    poked_ = true;
  }
  cv_.notify_all();
}

void Campaign::publish() {
  const bool leads = core_.role() == ElectionCore::Role::kLeader;
  if (leads != leader_.load()) {  // the operator's record of each change, with the reason for a step-down
    if (leads) logging::logf(logging::Level::kInfo, "master", "leading at term %llu\n", (unsigned long long)core_.term());
    else
      logging::logf(logging::Level::kWarn, "master", "stepped down from term %llu (last etcd error: %s)\n",
                   (unsigned long long)term_.load(), last_error_.empty() ? "none" : last_error_.c_str());
  }
  // valid_until before leader: a reader that sees leader also sees the bound that goes with it.
  valid_until_ = leads ? core_.valid_until() : 0;
  leader_ = leads;
  term_ = core_.term();
  won_ = core_.elections_won();
  step_downs_ = core_.step_downs();
  std::lock_guard<std::mutex> g(mu_);
  leader_address_ = core_.leader() ? core_.leader()->address : "";
}

void Campaign::run() {
  int64_t created_at = 0;  // this master's key, while it leads (to resign only that key)
  for (;;) {
    if (stop_ && core_.role() != ElectionCore::Role::kStopped) core_.stop();
    const int64_t now = steady_now_ms();
    if (changed_.exchange(false)) core_.leader_changed(now);
    const ElectionCore::Action a = core_.next(now);
    auto fail = [&](const Status& s) {
      errors_++;
      last_error_ = s.to_string();
      core_.failed(steady_now_ms());
    };
    switch (a.what) {
      case ElectionCore::Do::kWait: {  // what the last action changed is published already
        if (core_.stopped()) return;
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait_for(g, std::chrono::milliseconds(std::max<int64_t>(1, a.until - now)),
                     [this] { return stop_.load() || poked_.load() || changed_.load(); });
        poked_ = false;
        break;
      }
      case ElectionCore::Do::kGrant: {
        auto r = etcd_.grant(ttl_s_);
        if (r.ok()) core_.granted(*r, now);
        else fail(r.status());
        break;
      }
      case ElectionCore::Do::kCampaign: {
        auto r = etcd_.create(key_, address_, a.lease);
        if (!r.ok()) {
          fail(r.status());
          break;
        }
        // A key under this very lease is this master's own (a create whose answer was lost, retried).
        const bool won = r->won || r->holder.lease == a.lease;
        if (won) created_at = r->holder.create_revision;
        core_.campaigned(won, LeaderRecord{r->holder.value, uint64_t(r->holder.create_revision)}, now);
        break;
      }
      case ElectionCore::Do::kKeepAlive: {
        auto r = etcd_.keepalive(a.lease);
        if (r.ok()) core_.kept_alive(*r > 0, now);
        else fail(r.status());
        break;
      }
      case ElectionCore::Do::kReadLeader: {
        auto r = etcd_.get(key_);
        if (!r.ok()) {
          fail(r.status());
          break;
        }
        std::optional<LeaderRecord> holder;
        if (*r) holder = LeaderRecord{(*r)->value, uint64_t((*r)->create_revision)};
        core_.read_leader(holder, steady_now_ms());
        break;
      }
      case ElectionCore::Do::kResign: {
        if (created_at) (void)etcd_.remove_if_created_at(key_, created_at);
        (void)etcd_.revoke(a.lease);
        created_at = 0;
        core_.resigned();
        break;
      }
    }
    publish();
  }
}

KeyFollower::KeyFollower(std::vector<std::string> endpoints, std::string key, int timeout_ms, int retry_ms,
                         OnChange on_change)
    : endpoints_(std::move(endpoints)),
      key_(std::move(key)),
      timeout_ms_(timeout_ms),
      retry_ms_(std::max(1, retry_ms)),
      on_change_(std::move(on_change)),
      thread_([this] { run(); }) {}

KeyFollower::~KeyFollower() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void KeyFollower::run() {
  EtcdClient etcd(endpoints_, timeout_ms_);
  while (!stop_) {
    if (auto r = etcd.range(key_); r.ok()) {
      on_change_(r->kv);
      if (auto w = EtcdWatch::open(endpoints_, key_, r->revision + 1, timeout_ms_); w.ok()) {
        opened_++;
        int64_t heard = steady_now_ms();
        while (!stop_) {
          auto events = (*w)->next(100);  // the stop flag's pace
          if (!events.ok()) break;
          const int64_t now = steady_now_ms();
          if (events->empty()) {
            if (now - heard > kQuietMs) break;  // read and watch again
            continue;
          }
          heard = now;
          for (const EtcdEvent& e : *events) on_change_(e.deleted ? std::nullopt : std::optional<EtcdKv>(e.kv));
        }
        if (stop_) return;
        continue;  // read again at once: nothing between the watch's end and the read is missed
      }
    }
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait_for(g, std::chrono::milliseconds(retry_ms_), [this] { return stop_.load(); });
  }
}

LeaderWatch::LeaderWatch(std::vector<std::string> endpoints, const std::string& cluster, int poll_ms,
                         OnLeader on_leader)
    : on_leader_(std::move(on_leader)),
      follower_(std::move(endpoints), leader_key(cluster), std::max(50, std::min(poll_ms * 4, 1000)),
                follower_retry_ms(poll_ms),
                [this](const std::optional<EtcdKv>& kv) {
                  if (!kv) return;  // no leader now: the next one's key will come
                  const LeaderRecord now{kv->value, uint64_t(kv->create_revision)};
                  if (now.address == seen_.address && now.term == seen_.term) return;
                  seen_ = now;
                  on_leader_(now);
                }) {}

LeaderWatch::~LeaderWatch() = default;

}  // namespace fluxon
