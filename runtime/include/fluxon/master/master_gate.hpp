// What a master answers around its core under leadership and terms (E1, E2 of election.hpp):
// shared by the master actor and the simulation's master failover, so both run one policy.
#pragma once
#include <string>

#include "fluxon/master/master_core.hpp"

namespace fluxon {

struct MasterGate {
  uint64_t term = 0;  // the term this master serves (0: the single-master mode)
  uint64_t not_leader_total = 0, newer_term_total = 0;
  // leads: this master may answer now (E1: its lease is certainly alive). A master that does not
  // lead, or that a request shows deposed (it names a newer term: E2), answers Closed with term 0,
  // which an owner that has seen any term refuses; else the core answers, stamped with the term.
  // deposed is set when the request named a newer term (the caller re-checks its leadership).
  Envelope serve(MasterCore& core, const Envelope& req, Millis now, bool leads, const std::string& leader_hint,
                 bool* deposed = nullptr) {
    if (!leads) {
      not_leader_total++;
      return not_leader("this master does not lead" +
                        (leader_hint.empty() ? std::string() : " (the leader: " + leader_hint + ")"));
    }
    if (req.term > term) {
      newer_term_total++;
      if (deposed) *deposed = true;
      return not_leader("term " + std::to_string(req.term) + " is newer than this master's " + std::to_string(term));
    }
    Envelope rep = core.handle(req, now);
    rep.term = term;
    return rep;
  }
  static Envelope not_leader(const std::string& why) {
    Envelope e = error_envelope(Status(Code::kClosed, why));
    e.term = 0;  // not a leader's answer: an owner that saw any term refuses it
    return e;
  }
};

}  // namespace fluxon
