// ClientDriver: the client's sequencing over ClientCore, the one KvClient runs and the whole-cluster
// simulation runs (tests/sim/client_core_test.cpp). It owns the order of every call (the core
// builds the request, the link carries it, the core reads the answer), the connections and their
// generations, and the client's policies:
// - reconnect: a lost session (the owner died, or a call was given up) is reopened on the next call
//   of an external client; a new generation is refused (GenerationMismatch) until the caller maps it
//   (segment()); an embedded client never reconnects;
// - give up on timeout: a call the owner did not answer within the call timeout ends its session
//   (a late answer could leave plans, handles or holdings nobody would use); the session's put
//   futures fail with Closed, the owner releases its holdings when the link goes;
// - acknowledgements: a full batch goes at once, the rest before the next call or when the port's
//   flusher runs (within its gathering window);
// - close: waits until no call runs, flushes, fails what is left.
// The world comes in through ClientPorts (links, mappings, the clock, the flusher's wake-up): real
// ones in KvClient, simulated ones in the simulation. Thread-safe: no lock is held across a call.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fluxon/client/client_core.hpp"
#include "fluxon/runtime/config.hpp"
#include "fluxon/runtime/owner_link.hpp"

namespace fluxon {

struct SegmentInfo {
  std::string segment_label;  // cpu:0 (embedded) or external_owner:0
  uint64_t write_ptr = 0;
  uint64_t read_ptr = 0;
  uint64_t len = 0;
  uint64_t generation = 0;
  uint32_t node_id = 0;
};

// Completes when the routes of a committed put batch are live at the master (V3).
class KvFuture {
 public:
  struct State;
  explicit KvFuture(std::shared_ptr<State> s) : s_(std::move(s)) {}
  bool done() const;
  // false on timeout; a negative timeout waits forever.
  bool wait(double timeout_s = -1) const;
  // Ok when the routes are live; the failure otherwise; Timeout when not done in time.
  Status result(double timeout_s = -1) const;
  uint64_t put_id() const;
  // The outcome if done, without waiting.
  std::optional<Status> outcome() const;

 private:
  std::shared_ptr<State> s_;
};

struct KvFuture::State {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  Status status;
  uint64_t put_id = 0;
  void complete(Status s);
};

// This process's mapping of one owner generation's segment.
class SegmentView {
 public:
  virtual ~SegmentView() = default;
  virtual uint8_t* base() const = 0;
  virtual uint64_t size() const = 0;
  // Segment ranges about to be written or read: into this process's page tables (ahead of the copy).
  virtual void touch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) { (void)ranges; }
};

class ClientPorts {
 public:
  virtual ~ClientPorts() = default;
  struct Opened {
    std::unique_ptr<OwnerLink> link;
    std::unique_ptr<SegmentView> view;
  };
  // A new session with the owner (a restarted owner's: its new generation) and the mapping of
  // its segment. The callbacks may run on any thread.
  virtual Result<Opened> open(LinkCallbacks cb) = 0;
  virtual Millis now() = 0;
  // Acknowledgements are waiting: ClientDriver::flush_acks() should run within the gathering window.
  virtual void acks_waiting() = 0;
};

struct ClientPolicy {
  uint32_t max_wait_ms = 0;        // client.max_wait_ms: the owner answers every waiting call by then
  uint32_t rpc_timeout_ms = 60000;  // client.rpc_timeout_ms
  bool embedded = false;            // the owner lives in this process: no reconnect
  static ClientPolicy of(const ClusterConfig& cfg) {
    return ClientPolicy{cfg.client.max_wait_ms, cfg.client.rpc_timeout_ms, cfg.embedded()};
  }
  // With max_wait_ms the owner answers every waiting call by then; one more second covers the trip.
  uint32_t call_timeout_ms() const {
    return max_wait_ms ? std::min(max_wait_ms + 1000, rpc_timeout_ms) : rpc_timeout_ms;
  }
};

class ClientDriver {
 public:
  ClientDriver(ClientPolicy policy, ClientPorts& ports);
  ~ClientDriver();
  ClientDriver(const ClientDriver&) = delete;
  ClientDriver& operator=(const ClientDriver&) = delete;

  // The first session, its generation acknowledged.
  Status open();
  // No call runs after it returns: acknowledgements flushed, futures failed (Closed), sessions gone.
  void close();

  // The attached owner's segment; maps (acknowledges) a new generation after a restart.
  Result<SegmentInfo> segment();
  Result<uint64_t> put_start(const std::vector<std::string>& keys, int64_t value_len, const PutOptionalArgs& opts);
  Result<KvFuture> put_commit(uint64_t plan_ptr);
  Status put_abort(uint64_t plan_ptr);
  Result<std::pair<uint64_t, GetStartResult>> get_start(const std::vector<std::string>& keys, bool prefix_best_effort,
                                                        const std::optional<std::vector<uint32_t>>& groups);
  Result<uint64_t> get_transfer(uint64_t handle, std::optional<int64_t> consume_prefix_len);
  Status cancel(uint64_t handle);
  Status release_views(uint64_t plan_ptr);
  Result<ExistsResult> exists_prefix(const std::vector<std::string>& keys,
                                     const std::optional<std::vector<uint32_t>>& groups, uint64_t expected_len,
                                     const std::string& key_prefix, const std::string& key_suffix);
  // Any other request to the attached owner, under the same policies (stats, remove_prefix...).
  Result<std::unique_ptr<Envelope>> request(const char* op, Envelope req);
  // Through the current link as they are, no policy: the transport's own round trip (bench
  // baseline), raw bytes (tests), the in-process master (embedded).
  Status ping();
  Status send_raw(const Bytes& bytes);
  Result<std::unique_ptr<Envelope>> call_master(const char* op, Envelope req);

  // The flusher: sends every acknowledgement waiting.
  void flush_acks();
  bool acks_waiting();

  struct Registry {
    uint64_t generation = 0;
    size_t put_plans = 0, read_plans = 0, handles = 0;
  };
  Registry registry();

  struct Conn;  // one session: its link, its mapping, its generation

 private:
  class CallGuard;
  Status connect();
  void complete(std::vector<std::pair<uint64_t, Status>> done);
  void lose(Conn& c, const Status& why);
  void prune_locked();
  Status reconnect_if_down();  // an external client's lost session is reopened
  Result<std::shared_ptr<Conn>> current();
  Result<std::unique_ptr<Envelope>> call(const std::shared_ptr<Conn>& c, Envelope req);
  void send_acks(bool flush);
  void acks_queued();
  template <class F>
  auto locked(F&& f) {
    std::lock_guard<std::mutex> g(m_);
    return f();
  }

  const ClientPolicy policy_;
  ClientPorts& ports_;
  std::mutex m_;  // guards the core, the connections and the futures; never held across a call
  ClientCore core_;
  std::shared_ptr<Conn> conn_;                           // the attached owner's
  std::map<uint64_t, std::shared_ptr<Conn>> old_conns_;  // serial -> earlier sessions plans or handles name
  uint64_t next_serial_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<KvFuture::State>> futures_;  // future id -> its state
  uint64_t next_future_ = 1;
  bool closed_ = false;
  uint64_t calls_in_flight_ = 0;  // public calls running now; close() waits for them
  std::condition_variable idle_;
};

}  // namespace fluxon
