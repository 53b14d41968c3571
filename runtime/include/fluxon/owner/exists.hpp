// Exists: how long is the existing prefix of a batch — the local index first, then one master
// Lookup for the rest (nothing is claimed, pinned or fetched). A question the master does not
// answer in time (or whose request failed) is answered with the local prefix. Bound:
// Limits::exists_questions waiting for the master (past it, answered with the local prefix).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fluxon/owner/owner_shared.hpp"

namespace fluxon {

class Exists {
 public:
  explicit Exists(OwnerShared& s) : s_(s) {}

  void ask(uint64_t token, uint64_t session, wire::ExistsReqT& req, Millis now, Outbox& out);
  void on_reply(uint64_t token, Envelope& reply, Outbox& out);
  void master_failed(uint64_t token);  // answered with its local prefix at the next expire()
  void expire(Millis now, Outbox& out);
  bool owns(uint64_t token) const { return jobs_.count(token) != 0; }

 private:
  struct Job {
    uint64_t session = 0, token = 0;
    std::optional<std::vector<uint32_t>> groups;
    uint32_t n = 0;                  // keys asked
    uint64_t expected_len = 0;
    uint32_t local = 0;              // leading keys found in the local index
    std::vector<std::string> rest;   // asked of the master
    Millis deadline = 0;
  };
  void answer(const Job& job, uint32_t remote, bool master_answered, Outbox& out);
  void erase(std::map<uint64_t, Job>::iterator it);

  OwnerShared& s_;
  std::map<uint64_t, Job> jobs_;                   // by master token
  std::set<std::pair<Millis, uint64_t>> deadlines_;  // (deadline, token)
  // ask()'s scratch (kept: no allocation per call): each key's entry and hash (LocalIndex::find_many).
  std::vector<const LocalIndex::Node*> lookup_;
  std::vector<uint64_t> lookup_hashes_;
};

}  // namespace fluxon
