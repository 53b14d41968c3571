// OwnerDriver: the one place that turns an OwnerCore's output into effects — replies, notes,
// master requests, fetches, grant population — through OwnerPorts, with the fault points applied
// on the way (fault_points.hpp). The CAF owner actor and the simulator both drive their cores
// through it: they decode their inputs, call the driver, and implement the ports; everything
// between (client tokens and their sessions, the G9 flush decision, the master link's state,
// which faults fire) is this code, so the simulation runs what the daemon runs.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "fluxon/owner/owner_core.hpp"
#include "fluxon/driver/fault_points.hpp"
#include "fluxon/messages/codec.hpp"

namespace fluxon {

using SharedBytes = std::shared_ptr<const Bytes>;

class OwnerPorts {
 public:
  virtual ~OwnerPorts() = default;
  // The reply to client request `token`.
  virtual void reply(uint64_t token, Envelope& env) = 0;
  virtual void note(uint64_t session, Envelope& env) = 0;
  // Request `token` to the master, sent after `delay` ms; its answer comes back through
  // OwnerDriver::master_replied() (or master_failed()).
  virtual void to_master(uint64_t token, SharedBytes bytes, Millis delay) = 0;
  // A master reply to hand to OwnerDriver::on_master_reply() after `delay` ms.
  virtual void master_reply_later(uint64_t token, SharedBytes bytes, Millis delay) = 0;
  // Fetch `batch` over the data plane and report it to OwnerDriver::on_transfer_done(); with
  // `fail`, the batch fails after its bytes came (an injected fault). `delay`: the simulated time it takes.
  virtual void fetch(TransferBatch batch, bool fail, Millis delay) = 0;
  // Grants newly carved: fault their pages in (off the owner's thread), in order, and report each
  // range done to OwnerDriver::on_populated() (warm-up progress).
  virtual void populate(uint64_t offset, uint64_t len) = 0;
  // A grant given back (idle shrink): release its memory to the system (no slot of it is in use).
  virtual void release(uint64_t offset, uint64_t len) {}
  // Call OwnerDriver::flush() once the inputs already queued are handled (G9).
  virtual void flush_soon() = 0;
};

class OwnerDriver {
 public:
  OwnerDriver(OwnerCore& core, OwnerPorts& ports, const FaultPlan* faults, std::mt19937_64* rng)
      : core_(core), ports_(ports), faults_(faults, rng) {}

  OwnerCore& core() { return core_; }
  const FaultPoints& faults() const { return faults_; }

  // A client request: the token its reply will carry (reply() of the ports), then the call.
  uint64_t begin_request(uint64_t session);
  // A client request as it came: verified, then read in place when it is a GetStartReq (the hot
  // path: no object-API copy of its keys) or decoded and served as on_client_request. `admitted`
  // gets the request's token (begin_request) before the core sees it: where its reply goes. A
  // message that fails verification: its error, and nothing else happened.
  Status on_client_bytes(const uint8_t* data, size_t len, Millis now, const std::function<void(uint64_t)>& admitted);
  void on_client_note(Envelope& note, Millis now);
  // The session's client is gone: what it held is released; requests of it still waiting are
  // never answered (their tokens are returned, for the transport to forget).
  std::vector<uint64_t> close_session(uint64_t session, Millis now);
  // The master answered request `token` (the bytes as they came): faults of the reply path, then
  // on_master_reply() (at once or later, through the ports).
  void master_replied(uint64_t token, SharedBytes bytes);
  void on_master_reply(uint64_t token, const Bytes& bytes, Millis now);
  // The ports faulted in `len` bytes of a range populate() handed them.
  void on_populated(uint64_t len) { core_.on_populated(len); }
  void master_failed(uint64_t token) { core_.on_master_failure(token); }
  // The link to the master is up (at start, or again after a reconnect) or down.
  void master_up(Millis now, bool reconnected);
  void master_down() { master_up_ = false; }
  void see_master_term(uint64_t term) { core_.see_master_term(term); }
  void on_transfer_done(uint64_t id, const Status& result, Millis now);
  // Peers read these offsets of this owner's segment for their readers (the data plane's log, which
  // let `dropped_total` go so far).
  void on_peer_reads(const std::vector<uint64_t>& offsets, uint64_t dropped_total = 0) {
    core_.on_peer_reads(offsets, dropped_total);
  }
  void flush(Millis now);
  void tick(Millis now);
  void remove_key(const std::string& key, Millis now);

 private:
  void drain();
  // A decoded client request (what on_client_bytes does with anything but a GetStartReq).
  void on_client_request(uint64_t token, Envelope& req, Millis now);
  void after_request();  // a client request was served: its effects out, G9's flush asked for
  std::vector<std::string_view> key_views_;  // on_client_bytes: a GetStartReq's keys in place

  OwnerCore& core_;
  OwnerPorts& ports_;
  FaultPoints faults_;
  Outbox out_;
  std::unordered_map<uint64_t, uint64_t> waiting_;  // client token -> its session (not answered yet)
  uint64_t next_token_ = 1;
  bool master_up_ = false;
  bool flush_queued_ = false;  // a flush is asked for (G9: leaders wait for it)
};

}  // namespace fluxon
