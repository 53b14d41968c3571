#include "fluxon/runtime/campaign.hpp"

#include <chrono>
#include <cstdio>

namespace fluxon {

std::string leader_key(const std::string& cluster) { return "/fluxon/" + cluster + "/leader"; }

namespace {
// An etcd call may take this long at most: a keepalive must come back well inside the lease.
int call_timeout(ElectionMillis ttl_ms) { return int(std::max<ElectionMillis>(50, std::min<ElectionMillis>(ttl_ms / 4, 1000))); }
}  // namespace

Campaign::Campaign(std::vector<std::string> endpoints, const std::string& cluster, ElectionCore::Options o)
    : etcd_(std::move(endpoints), call_timeout(o.ttl_ms)),
      key_(leader_key(cluster)),
      address_(o.address),
      core_(o),
      ttl_s_(std::max<int64_t>(1, (o.ttl_ms + 999) / 1000)) {}

void Campaign::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

Campaign::~Campaign() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Campaign::serving() const { return leader_.load() && steady_now_ms() < valid_until_.load(); }

std::string Campaign::leader_address() const {
  std::lock_guard<std::mutex> g(mu_);
  return leader_address_;
}

void Campaign::poke() {
  poked_ = true;
  cv_.notify_all();
}

void Campaign::publish() {
  const bool leads = core_.role() == ElectionCore::Role::kLeader;
  if (leads != leader_.load()) {  // the operator's record of each change, with the reason for a step-down
    if (leads) std::fprintf(stderr, "fluxon master: leading at term %llu\n", (unsigned long long)core_.term());
    else
      std::fprintf(stderr, "fluxon master: stepped down from term %llu (last etcd error: %s)\n",
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
                     [this] { return stop_.load() || poked_.load(); });
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

LeaderWatch::LeaderWatch(std::vector<std::string> endpoints, const std::string& cluster, int poll_ms,
                         OnLeader on_leader)
    : etcd_(std::move(endpoints), std::max(50, std::min(poll_ms * 4, 1000))),
      key_(leader_key(cluster)),
      poll_ms_(std::max(1, poll_ms)),
      on_leader_(std::move(on_leader)),
      thread_([this] {
        LeaderRecord seen;
        while (!stop_) {
          auto r = etcd_.get(key_);
          if (r.ok() && *r) {
            LeaderRecord now{(*r)->value, uint64_t((*r)->create_revision)};
            if (now.address != seen.address || now.term != seen.term) {
              seen = now;
              on_leader_(now);
            }
          }
          std::unique_lock<std::mutex> g(mu_);
          cv_.wait_for(g, std::chrono::milliseconds(poll_ms_), [this] { return stop_.load(); });
        }
      }) {}

LeaderWatch::~LeaderWatch() {
  stop_ = true;
  cv_.notify_all();
  thread_.join();
}

}  // namespace fluxon
