// CAF message types of Fluxon: every payload is an encoded FlatBuffers Envelope. Blob is a
// request (it gets a reply), Note is one-way.
#pragma once
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/auth.hpp"
#include "fluxon/runtime/clock.hpp"

namespace fluxon::actors {

struct Blob {
  std::vector<uint8_t> bytes;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Blob& x) {
  return f(caf::meta::type_name("fluxon_blob"), x.bytes);
}

struct Note {
  std::vector<uint8_t> bytes;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Note& x) {
  return f(caf::meta::type_name("fluxon_note"), x.bytes);
}

using tick_atom = caf::atom_constant<caf::atom("tick")>;
using reconnect_atom = caf::atom_constant<caf::atom("reconnect")>;
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using call_atom = caf::atom_constant<caf::atom("call")>;
using delayed_atom = caf::atom_constant<caf::atom("delayed")>;
using fetched_atom = caf::atom_constant<caf::atom("fetched")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
using mreply_atom = caf::atom_constant<caf::atom("mreply")>;
using populated_atom = caf::atom_constant<caf::atom("populated")>;
using chclosed_atom = caf::atom_constant<caf::atom("chclosed")>;
using deferred_atom = caf::atom_constant<caf::atom("deferred")>;
using leader_atom = caf::atom_constant<caf::atom("leader")>;
using auth_atom = caf::atom_constant<caf::atom("auth")>;
using out_atom = caf::atom_constant<caf::atom("out")>;

inline void configure(caf::actor_system_config& cfg, bool network) {
  cfg.add_message_type<Blob>("fluxon_blob");
  cfg.add_message_type<Note>("fluxon_note");
  // Blocking client calls wait on a condition variable; the sharing policy wakes a worker at once
  // instead of the work-stealing back-off polls (CAF-NOTES.md).
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", 2);
  if (network) cfg.load<caf::io::middleman>();
}

inline int64_t now_ms() { return steady_now_ms(); }
// The wall clock in ms since the epoch (what people read: the status page's times).
inline uint64_t wall_ms() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

// What a daemon's gate (gate.cpp) counted: handshakes, and what it refused from nodes that did
// not prove the cluster key.
struct GateStats {
  std::atomic<uint64_t> handshakes_ok{0}, handshakes_failed{0};
  std::atomic<uint64_t> refused_calls{0}, refused_notes{0}, refused_other{0};
};

// Publish this, not the actor: it passes requests and notes only (from proven nodes, with a key).
// `who` names the daemon in refusals ("the owner", "the master").
caf::actor spawn_gate(caf::actor_system& sys, caf::actor target, AuthKeyPtr key, std::shared_ptr<GateStats> stats,
                      std::string who);

// The client side of the gate's handshake, run by `self` (its node is what gets proven; the gate
// watches `self`): asks `gate` for a challenge, proves `key`, checks the gate's proof, then calls
// done(status) in self's context. A gate without a key answers an empty challenge: fine without a
// key, refused with one (the peer could be anyone); a challenge without a key: refused.
template <class Self, class F>
void prove_key(Self* self, const caf::actor& gate, AuthKeyPtr key, std::chrono::milliseconds timeout,
               const std::string& peer, F done) {
  auto fail = [done, peer](const std::string& why) mutable { done(Status(Code::kPermissionDenied, peer + " " + why)); };
  auto lost = [done, peer, self](caf::error& e) mutable {
    done(Status(Code::kClosed, peer + ": no answer to the key handshake: " + self->system().render(e)));
  };
  self->request(gate, timeout, auth_atom::value)
      .then(
          [=](Blob& challenge) mutable {
            if (challenge.bytes.empty()) {
              if (!key) return done(Status::ok());
              return fail("does not authenticate (its cluster config has no auth), and this one has a key: refused");
            }
            if (!key) return fail("requires the cluster key, and this process has none (auth: {key_file: PATH})");
            if (challenge.bytes.size() != kNonceBytes) return fail("sent a malformed challenge");
            Nonce server{}, mine = random_nonce();
            std::copy(challenge.bytes.begin(), challenge.bytes.end(), server.begin());
            const Proof p = client_proof(*key, "caf", server, mine, {});
            self->request(gate, timeout, auth_atom::value, Blob{std::vector<uint8_t>(mine.begin(), mine.end())},
                          Blob{std::vector<uint8_t>(p.begin(), p.end())})
                .then(
                    [=](Blob& answer) mutable {
                      if (answer.bytes.empty()) return fail("refused this process's key (auth.key_file differs)");
                      const Proof want = server_proof(*key, "caf", server, mine, {});
                      if (answer.bytes.size() != kProofBytes || !equal_ct(want.data(), answer.bytes.data(), kProofBytes))
                        return fail("does not hold this cluster's key");
                      done(Status::ok());
                    },
                    lost);
          },
          lost);
}

// Spawns the actors of one node kind inside `sys` (definitions in master_actor.cpp / owner_actor.cpp).
}  // namespace fluxon::actors

namespace fluxon {
struct ClusterConfig;
struct OwnerConfig;
class Segment;
namespace actors {
caf::actor spawn_master(caf::actor_system& sys, const ClusterConfig& cfg, bool metrics);
// master may be invalid: the owner then connects (and reconnects) to master_host:master_port
// through the middleman (daemon mode; port 0 = never).
// key: the cluster key (null: no auth): the data plane, the channel and the master's gate ask for
// it; gate_stats: the counters of the gate published in front of this owner (null: none).
caf::actor spawn_owner(caf::actor_system& sys, const ClusterConfig& cfg, const OwnerConfig& ocfg,
                       caf::actor master, const std::string& master_host, uint16_t master_port, bool metrics,
                       std::string* error, AuthKeyPtr key = nullptr, std::shared_ptr<GateStats> gate_stats = nullptr);
}  // namespace actors
}  // namespace fluxon
