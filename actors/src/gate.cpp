// The gate: what a daemon publishes on its CAF port instead of its actor. It passes requests
// (Blob) and notes (Note) to the actor behind it, and nothing else: the actor's own messages (its
// timers, its workers' reports) cannot come from the network. With the cluster key it passes them
// only from CAF nodes that proved the key (challenge-response, runtime/auth.hpp); a request from
// any other node is answered PermissionDenied, a note is dropped, both counted.
//
// A node stays proven while an actor of it that ran the handshake lives: the gate watches it, and
// its death (the connection closed) forgets the node, so a later connection starts over.
#include <map>
#include <set>

#include "caf_types.hpp"

namespace fluxon::actors {

namespace {

constexpr std::string_view kCafChannel = "caf";
constexpr size_t kMaxChallenges = 4096;  // nodes with a handshake begun and not finished

struct GateState {
  GateState() = default;  // not an aggregate: see OwnerState
  caf::actor target;
  AuthKeyPtr key;
  std::shared_ptr<GateStats> stats;
  std::map<caf::node_id, Nonce> challenges;
  std::map<caf::node_id, std::set<caf::actor_addr>> proven;  // node -> its watched actors
  std::map<caf::actor_addr, caf::node_id> watched;
  std::string who;  // "the owner" / "the master": errors name it
  static inline const char* name = "fluxon_gate";
};
using GateSelf = caf::stateful_actor<GateState>;

bool admitted(GateSelf* self) {
  auto& st = self->state;
  if (!st.key) return true;
  const auto& sender = self->current_sender();
  if (!sender) return false;  // anonymous: from the network, nobody proved anything
  if (sender->node() == self->node()) return true;
  return st.proven.count(sender->node()) != 0;
}

Blob refused(GateSelf* self, const char* what) {
  return Blob{encode(error_envelope(
      Status(Code::kPermissionDenied, self->state.who + " refused " + what +
                                          ": this connection has not proven the cluster key (auth.key_file)")))};
}

caf::behavior gate_actor(GateSelf* self, caf::actor target, AuthKeyPtr key, std::shared_ptr<GateStats> stats,
                         std::string who) {
  auto& st = self->state;
  st.target = target;
  st.key = std::move(key);
  st.stats = std::move(stats);
  st.who = std::move(who);
  self->monitor(target);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source == st.target.address()) return self->quit(dm.reason);
    auto w = st.watched.find(dm.source);
    if (w == st.watched.end()) return;
    auto p = st.proven.find(w->second);
    if (p != st.proven.end()) {
      p->second.erase(dm.source);
      if (p->second.empty()) st.proven.erase(p);
    }
    st.watched.erase(w);
  });
  // Anything else from the network: dropped, counted.
  self->set_default_handler([](caf::scheduled_actor* a, caf::message_view&) -> caf::result<caf::message> {
    static_cast<GateSelf*>(a)->state.stats->refused_other++;
    return caf::sec::unexpected_message;
  });
  return {
      // Step 1: a challenge for the sender's node (an empty blob: this daemon runs without a key).
      [=](auth_atom) -> Blob {
        auto& st = self->state;
        const auto& sender = self->current_sender();
        if (!st.key || !sender) return Blob{};
        if (st.challenges.size() >= kMaxChallenges) st.challenges.erase(st.challenges.begin());
        const Nonce n = random_nonce();
        st.challenges[sender->node()] = n;
        return Blob{std::vector<uint8_t>(n.begin(), n.end())};
      },
      // Step 2: the sender's nonce and proof; the answer is this daemon's proof (empty: refused).
      // A challenge answers one proof only: a replayed step 2 finds none, or another nonce.
      [=](auth_atom, Blob& client_nonce, Blob& proof) -> Blob {
        auto& st = self->state;
        const auto& sender = self->current_sender();
        if (!st.key || !sender) return Blob{};
        auto it = st.challenges.find(sender->node());
        if (it == st.challenges.end() || client_nonce.bytes.size() != kNonceBytes ||
            proof.bytes.size() != kProofBytes) {
          st.stats->handshakes_failed++;
          return Blob{};
        }
        const Nonce server = it->second;
        st.challenges.erase(it);
        Nonce cn{};
        std::copy(client_nonce.bytes.begin(), client_nonce.bytes.end(), cn.begin());
        const Proof want = client_proof(*st.key, kCafChannel, server, cn, {});
        if (!equal_ct(want.data(), proof.bytes.data(), kProofBytes)) {
          st.stats->handshakes_failed++;
          return Blob{};
        }
        st.stats->handshakes_ok++;
        const caf::actor_addr addr = caf::actor_cast<caf::actor_addr>(sender);
        if (st.watched.emplace(addr, sender->node()).second) {
          st.proven[sender->node()].insert(addr);
          self->monitor(addr);
        }
        const Proof mine = server_proof(*st.key, kCafChannel, server, cn, {});
        return Blob{std::vector<uint8_t>(mine.begin(), mine.end())};
      },
      [=](Blob& req) -> caf::response_promise {
        // Asked before the promise is made: making it takes the sender out of the message.
        const bool ok = admitted(self);
        auto rp = self->make_response_promise();
        if (ok) {
          rp.delegate(self->state.target, std::move(req));
        } else {
          self->state.stats->refused_calls++;
          rp.deliver(refused(self, "a request"));
        }
        return rp;
      },
      [=](Note& n) {
        if (admitted(self)) self->send(self->state.target, std::move(n));
        else self->state.stats->refused_notes++;
      },
  };
}

}  // namespace

caf::actor spawn_gate(caf::actor_system& sys, caf::actor target, AuthKeyPtr key, std::shared_ptr<GateStats> stats,
                      std::string who) {
  return sys.spawn(gate_actor, std::move(target), std::move(key), std::move(stats), std::move(who));
}

}  // namespace fluxon::actors
