// CAF message types of Fluxon: every payload is an encoded FlatBuffers Envelope. Blob is a
// request (it gets a reply), Note is one-way.
#pragma once
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <cstdint>
#include <vector>

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
caf::actor spawn_owner(caf::actor_system& sys, const ClusterConfig& cfg, const OwnerConfig& ocfg,
                       caf::actor master, const std::string& master_host, uint16_t master_port, bool metrics,
                       std::string* error);
}  // namespace actors
}  // namespace fluxon
