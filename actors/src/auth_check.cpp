// `fluxon auth check HOST:PORT [--key FILE] [--json]`: what a daemon's control port admits, seen
// from outside. Without the key it asks for a challenge, sends a request it has not earned and a
// message of no public kind; with the key it proves it, checks the daemon's proof, then replays
// its own proof on a fresh challenge. Each answer is reported as the daemon gave it.
#include <cstdio>
#include <unistd.h>

#include "caf_types.hpp"
#include "fluxon/actors/runtime.hpp"
#include "fluxon/runtime/json.hpp"

namespace fluxon {

int run_auth_check(const std::string& address, const std::string& key_file, bool json) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    std::fprintf(stderr, "fluxon auth check: expected HOST:PORT, got '%s'\n", address.c_str());
    return 2;
  }
  AuthKeyPtr key;
  if (!key_file.empty()) {
    auto k = load_key_file(key_file);
    if (!k.ok()) {
      std::fprintf(stderr, "fluxon auth check: %s\n", k.status().to_string().c_str());
      return 2;
    }
    key = *k;
  }
  caf::actor_system_config cfg;
  actors::configure(cfg, true);
  caf::actor_system sys{cfg};
  auto gate = sys.middleman().remote_actor(address.substr(0, colon), uint16_t(std::atoi(address.c_str() + colon + 1)));
  if (!gate) {
    std::fprintf(stderr, "fluxon auth check: %s is not reachable: %s\n", address.c_str(), sys.render(gate.error()).c_str());
    return 1;
  }
  using namespace actors;
  caf::scoped_actor self{sys};
  const auto t = std::chrono::seconds(5);
  std::vector<std::pair<std::string, std::string>> out;  // (what, answer)
  auto ask = [&](auto&&... xs) {
    Result<std::vector<uint8_t>> r = Status(Code::kClosed, "no answer");
    self->request(*gate, t, std::forward<decltype(xs)>(xs)...)
        .receive([&](Blob& b) { r = std::move(b.bytes); },
                 [&](caf::error& e) { r = Status(Code::kClosed, sys.render(e)); });
    return r;
  };
  auto challenge = ask(auth_atom::value);
  const bool auth_on = challenge.ok() && !challenge->empty();
  out.emplace_back("auth", auth_on ? "on" : (challenge.ok() ? "off" : challenge.status().message()));
  // A request this connection has not earned: a Hello (it would open a session).
  {
    auto r = ask(Blob{encode(make_envelope(wire::HelloT{{}, uint64_t(getpid())}))});
    std::string a;
    if (!r.ok()) a = "error: " + r.status().message();
    else if (auto env = decode(*r); !env.ok()) a = "undecodable: " + env.status().message();
    else if (Status s = envelope_status(**env); !s.is_ok()) a = s.to_string();
    else a = "answered";
    out.emplace_back("unproven_request", a);
  }
  // A message of no public kind (the owner's own timer tick).
  {
    std::string a = "answered";
    self->request(*gate, t, tick_atom::value)
        .receive([&](caf::message&) {}, [&](caf::error& e) { a = "dropped: " + sys.render(e); });
    out.emplace_back("internal_message", a);
  }
  if (key && auth_on && challenge->size() == kNonceBytes) {
    Nonce server{}, mine = random_nonce();
    std::copy(challenge->begin(), challenge->end(), server.begin());
    const Proof p = client_proof(*key, "caf", server, mine, {});
    const Blob nb{std::vector<uint8_t>(mine.begin(), mine.end())}, pb{std::vector<uint8_t>(p.begin(), p.end())};
    auto answer = ask(auth_atom::value, nb, pb);
    const Proof want = server_proof(*key, "caf", server, mine, {});
    std::string a;
    if (!answer.ok()) a = "error: " + answer.status().message();
    else if (answer->empty()) a = "refused";
    else if (answer->size() != kProofBytes || !equal_ct(want.data(), answer->data(), kProofBytes))
      a = "accepted, but the daemon's proof is wrong (it does not hold this key)";
    else a = "accepted";
    out.emplace_back("key_proof", a);
    // The same proof again, on a fresh challenge.
    (void)ask(auth_atom::value);  // a fresh challenge for this node
    auto replay = ask(auth_atom::value, nb, pb);
    out.emplace_back("replayed_proof", !replay.ok() ? "error: " + replay.status().message()
                                                    : replay->empty() ? "refused" : "accepted");
  }
  if (json) {
    std::printf("{");
    for (size_t i = 0; i < out.size(); ++i)
      std::printf("%s\"%s\": %s", i ? ", " : "", out[i].first.c_str(), json_quote(out[i].second).c_str());
    std::printf("}\n");
  } else {
    std::printf("fluxon auth check %s:\n", address.c_str());
    for (const auto& [what, a] : out) std::printf("  %-17s %s\n", what.c_str(), a.c_str());
  }
  return 0;
}

}  // namespace fluxon
