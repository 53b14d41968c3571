// Deterministic cluster simulation: the master core and N owner cores wired through a seeded
// in-memory network and a simulated clock, in one thread. Owner<->master links inject delay,
// drop and duplicate from one seed; every run prints `seed=`. Clients talk to their owner through
// call()/note(), which run the simulation until the reply arrives.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <vector>

#include "fluxon/master/master_gate.hpp"
#include "fluxon/owner/owner_core.hpp"
#include "fluxon/driver/owner_driver.hpp"
#include "fluxon/runtime/config.hpp"

namespace fluxon::sim {

using fluxon::LinkFaults;
// A simulated link with no faults: every message takes 1 ms.
inline constexpr LinkFaults kQuietLink{0, 0, 1, 1};

class Cluster {
 public:
  // roles[i] (when given) is owner i's role: sglang_owner or remote_cache.
  Cluster(uint64_t seed, const OwnerConfig& owner_cfg, int owners = 1, std::vector<std::string> roles = {});
  uint64_t seed() const { return seed_; }
  Millis now() const { return now_; }

  // The owners' fault points (fluxon/driver/fault_points.hpp), drawn from the cluster's seed:
  // applied on every owner<->master message (1 ms each by default) and data-plane fetch (`drop`:
  // the odds that one fails, the delay: its duration).
 private:
  FaultPlan plan_;
 public:
  LinkFaults& to_master = plan_.master_request;
  LinkFaults& from_master = plan_.master_reply;
  LinkFaults& data = plan_.fetch;

  MasterCore& master() { return master_; }
  // The master's route tiers (MasterCore::set_tiers), before the owners register (right after
  // construction); a restarted master keeps them.
  void set_master_tiers(double tier2_ratio, double tier1_ratio) {
    tiers_ = {tier2_ratio, tier1_ratio};
    master_.set_tiers(tier2_ratio, tier1_ratio);
  }
  OwnerCore& owner(int i) { return *owners_[i].core; }

  // Client side: a session on owner i; call() returns the reply (running the cluster until it
  // arrives, or an error envelope with Timeout after `limit` simulated ms).
  uint64_t open_session(int owner);
  Envelope call(int owner, uint64_t session, Envelope req, Millis limit = 120000);
  void note(int owner, uint64_t session, Envelope note);
  // The owner drops key (route first), as eviction does.
  void remove_key(int owner, const std::string& key);
  // The client of `session` died: the owner releases what it held.
  void close_session(int owner, uint64_t session);
  // A request whose reply is collected later: requests that overlap in time.
  uint64_t send(int owner, uint64_t session, Envelope req);
  Envelope wait(uint64_t token, Millis limit = 120000);
  // The reply to `token` if it arrives within `limit` simulated ms (nothing otherwise: it may
  // still come, and is kept until collected).
  std::optional<Envelope> try_wait(uint64_t token, Millis limit);
  // PutLive notes delivered to owner's session so far (session ids are per owner).
  std::vector<wire::PutLiveT> take_put_live(int owner, uint64_t session);

  // Owner i's process dies and a new one (the next generation, an empty segment, no sessions)
  // takes its place: what was in flight to or from the old one finds nobody.
  void restart_owner(int i);
  // The master process dies and a fresh one (no state) takes its place; owners reconnect.
  void restart_master();
  // HA: the leader is paused (SIGSTOP) and a standby leads the next term from an empty core; the
  // owners find it (through etcd) and resync. What was sent to the old leader waits in its queue.
  void failover_master();
  // The paused old leader runs again, its lease gone: it answers what waited through the same
  // MasterGate as the daemon (not the leader, term 0), then is gone.
  void resume_old_master();
  // Owners a and b cannot reach each other's data planes (a switch port down between two hosts):
  // fetches between them fail as timeouts until healed; their control links to the master stay.
  void partition_owners(int a, int b, bool cut);
  uint64_t fetches_partitioned() const { return fetches_partitioned_; }
  // Every process's clock leaps `ms` ahead at once (a host stalled, a VM paused and resumed): what
  // was due meanwhile is delivered together at the new time, and every timer sees the leap.
  void jump_clock(Millis ms);
  uint64_t master_term() const { return gate_.term; }
  void drop_replies() { replies_.clear(); }  // replies nobody will collect (the fuzzer's)
  bool master_paused() const { return paused_.has_value(); }
  void run_for(Millis ms);
  bool run_until(const std::function<bool()>& pred, Millis limit);

  // Simulated segment bytes of owner i, per slot offset: clients write values at their offsets
  // and read them back; the data plane copies them between owners.
  void write(int owner, uint64_t offset, std::vector<uint8_t> bytes) { owners_[owner].mem[offset] = std::move(bytes); }
  std::vector<uint8_t> read(int owner, uint64_t offset) const;
  uint64_t transfers_failed() const { return transfers_failed_; }
  uint64_t transfers_done() const { return transfers_done_; }

  uint64_t messages_dropped() const { return fired(FaultPoints::k_master_request, FaultPoints::kDropped) + fired(FaultPoints::k_master_reply, FaultPoints::kDropped); }
  uint64_t messages_duplicated() const { return fired(FaultPoints::k_master_request, FaultPoints::kDuplicated) + fired(FaultPoints::k_master_reply, FaultPoints::kDuplicated); }
  // Faults fired at point p, over all owners.
  uint64_t fired(FaultPoints::Point p, FaultPoints::Fault f) const;
  OwnerDriver& driver(int i) { return *owners_[i].driver; }

 private:
  struct Event {
    Millis at;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  // Owner i's ports: the simulated network, data plane and client channel.
  class Ports : public OwnerPorts {
   public:
    Ports(Cluster& c, int owner) : c_(c), owner_(owner) {}
    void reply(uint64_t token, Envelope& env) override;
    void note(uint64_t session, Envelope& env) override;
    void to_master(uint64_t token, SharedBytes bytes, Millis delay) override;
    void master_reply_later(uint64_t token, SharedBytes bytes, Millis delay) override;
    void fetch(TransferBatch batch, bool fail, Millis delay) override;
    void populate(uint64_t offset, uint64_t len) override;
    void flush_soon() override;

   private:
    Cluster& c_;
    int owner_;
  };
  struct OwnerNode {
    OwnerConfig cfg;
    std::unique_ptr<OwnerCore> core;
    std::unique_ptr<Ports> ports;
    std::unique_ptr<OwnerDriver> driver;
    std::map<uint64_t, std::vector<wire::PutLiveT>> notes;
    std::map<uint64_t, std::vector<uint8_t>> mem;
    uint64_t incarnation = 0;  // its process: a restart starts the next
  };
  void schedule(Millis delay, std::function<void()> fn);
  void start_owner(int i, uint64_t generation);
  void step_to(Millis t);
  // A client's request: the owner, its incarnation (a restarted owner numbers its tokens anew), the token.
  uint64_t client_token(int owner, uint64_t token) const {
    return (uint64_t(owner) << 56) | ((owners_[size_t(owner)].incarnation & 0xFF) << 48) | token;
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
  Millis now_ = 0;
  uint64_t seq_ = 0;
  uint64_t transfers_failed_ = 0, transfers_done_ = 0, fetches_partitioned_ = 0;
  std::set<std::pair<int, int>> partitions_;  // (lower, higher) owner index
  uint64_t master_epoch_ = 0;  // a restart resets the connections: what was in flight is lost
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  MasterCore master_;
  MasterGate gate_;  // the serving master's term (0 until a failover)
  struct Paused {
    MasterCore core;
    MasterGate gate;
    uint64_t epoch = 0;
    std::vector<std::function<void(MasterCore&, MasterGate&, bool)>> queue;  // requests waiting for it
  };
  std::optional<Paused> paused_;
  std::pair<double, double> tiers_{0, 0};
  std::vector<OwnerNode> owners_;
  std::map<uint64_t, Envelope> replies_;   // client token -> reply
};

}  // namespace fluxon::sim
