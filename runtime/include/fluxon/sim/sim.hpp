// Deterministic cluster simulation: the master core and N owner cores wired through a seeded
// in-memory network and a simulated clock, in one thread. Owner<->master links inject delay,
// drop and duplicate from one seed; every run prints `seed=`. Clients talk to their owner through
// call()/note(), which run the simulation until the reply arrives.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <vector>

#include "fluxon/core/master_core.hpp"
#include "fluxon/core/owner_core.hpp"
#include "fluxon/runtime/config.hpp"

namespace fluxon::sim {

struct LinkFaults {
  double drop = 0;        // probability a message is lost
  double duplicate = 0;   // probability it is delivered twice
  Millis min_delay = 1;   // uniform delay in [min, max]
  Millis max_delay = 1;
};

class Cluster {
 public:
  // roles[i] (when given) is owner i's role: sglang_owner or remote_cache.
  Cluster(uint64_t seed, const OwnerConfig& owner_cfg, int owners = 1, std::vector<std::string> roles = {});
  uint64_t seed() const { return seed_; }
  Millis now() const { return now_; }

  LinkFaults to_master, from_master;   // applied on every owner<->master message
  // Data-plane fetches between owners: `drop` is the odds that one fails (peer unreachable,
  // connection reset), the delay is its duration.
  LinkFaults data;

  MasterCore& master() { return master_; }
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
  // PutLive notes delivered to a session so far.
  std::vector<wire::PutLiveT> take_put_live(uint64_t session);

  // The master process dies and a fresh one (no state) takes its place; owners reconnect.
  void restart_master();
  void run_for(Millis ms);
  bool run_until(const std::function<bool()>& pred, Millis limit);

  // Simulated segment bytes of owner i, per slot offset: clients write values at their offsets
  // and read them back; the data plane copies them between owners.
  void write(int owner, uint64_t offset, std::vector<uint8_t> bytes) { owners_[owner].mem[offset] = std::move(bytes); }
  std::vector<uint8_t> read(int owner, uint64_t offset) const;
  uint64_t transfers_failed() const { return transfers_failed_; }
  uint64_t transfers_done() const { return transfers_done_; }

  uint64_t messages_dropped() const { return dropped_; }
  uint64_t messages_duplicated() const { return duplicated_; }

 private:
  struct Event {
    Millis at;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  struct OwnerNode {
    std::unique_ptr<OwnerCore> core;
    std::map<uint64_t, std::vector<wire::PutLiveT>> notes;
    std::map<uint64_t, std::vector<uint8_t>> mem;
  };
  void schedule(Millis delay, std::function<void()> fn);
  void send_over(const LinkFaults& f, std::function<void()> deliver);
  void flush(int owner, Outbox& out);
  void step_to(Millis t);

  uint64_t seed_;
  std::mt19937_64 rng_;
  Millis now_ = 0;
  uint64_t seq_ = 0, dropped_ = 0, duplicated_ = 0, next_token_ = 1;
  uint64_t transfers_failed_ = 0, transfers_done_ = 0;
  uint64_t master_epoch_ = 0;  // a restart resets the connections: what was in flight is lost
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  MasterCore master_;
  std::vector<OwnerNode> owners_;
  std::map<uint64_t, Envelope> replies_;   // client token -> reply
};

}  // namespace fluxon::sim
