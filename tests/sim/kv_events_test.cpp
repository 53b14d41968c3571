// The KV-event log (docs/events.md): its order, bound, cursors and prefix filter, and the master's
// route changes as events (stored on publication, removed with its cause).
#include <doctest/doctest.h>

#include <map>
#include <random>

#include "fluxon/master/kv_events.hpp"
#include "fluxon/master/master_core.hpp"

namespace fluxon {

namespace {
std::vector<uint64_t> seqs(const KvEventLog::Read& r) {
  std::vector<uint64_t> out;
  for (const KvEvent& e : r.events) out.push_back(e.seq);
  return out;
}
}  // namespace

TEST_CASE("kv events: consecutive order, cursors continue exactly where they stopped, the prefix filters") {
  KvEventLog log(100);
  log.set_epoch(7);
  for (int i = 0; i < 10; ++i) log.stored((i % 2 ? "a:" : "b:") + std::to_string(i), 1, Version{1, 1, uint64_t(i)});
  auto all = log.read(0, 0, "", 0);  // no cursor: from the oldest
  CHECK_FALSE(all.lost);
  CHECK(seqs(all) == std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(all.next_seq == 10);
  auto part = log.read(7, 0, "", 4);
  CHECK(seqs(part) == std::vector<uint64_t>{1, 2, 3, 4});
  auto rest = log.read(7, part.next_seq, "", 0);
  CHECK(seqs(rest) == std::vector<uint64_t>{5, 6, 7, 8, 9, 10});
  CHECK_FALSE(rest.lost);
  auto at_head = log.read(7, rest.next_seq, "", 0);
  CHECK(at_head.events.empty());
  CHECK(at_head.next_seq == 10);  // a cursor at the head stays there
  CHECK_FALSE(at_head.lost);
  auto a = log.read(7, 0, "a:", 0);
  REQUIRE(a.events.size() == 5);
  for (const KvEvent& e : a.events) CHECK(e.key.substr(0, 2) == "a:");
  CHECK(a.next_seq == 10);  // it looked at every event: the cursor goes past the others too
  log.removed("a:1", 1, Version{1, 1, 1}, "removed");
  auto more = log.read(7, a.next_seq, "a:", 0);
  REQUIRE(more.events.size() == 1);
  CHECK(more.events[0].kind == KvEvent::Kind::kRemoved);
  CHECK(more.events[0].key == "a:1");
  CHECK(std::string(more.events[0].cause) == "removed");
}

TEST_CASE("kv events: at the bound the oldest go, counted, and a cursor they passed reads on from the oldest with lost") {
  KvEventLog log(4);
  log.set_epoch(3);
  for (int i = 0; i < 10; ++i) log.stored("k" + std::to_string(i), 1, Version{1, 1, uint64_t(i)});
  CHECK(log.size() == 4);
  CHECK(log.dropped() == 6);
  auto r = log.read(3, 2, "", 0);  // read up to 2: 3..6 are gone
  CHECK(r.lost);
  CHECK(r.first_seq == 7);
  CHECK(seqs(r) == std::vector<uint64_t>{7, 8, 9, 10});
  auto ok = log.read(3, 6, "", 0);  // up to 6 read: nothing it missed is gone
  CHECK_FALSE(ok.lost);
  CHECK(seqs(ok) == std::vector<uint64_t>{7, 8, 9, 10});
}

TEST_CASE("kv events: a cursor of another epoch (a restarted or new master) or from the future reads from the oldest, lost") {
  KvEventLog log(16);
  log.set_epoch(9);
  log.stored("x", 2, Version{2, 1, 1});
  auto other = log.read(8, 0, "", 0);
  CHECK(other.lost);
  CHECK(seqs(other) == std::vector<uint64_t>{1});
  auto future = log.read(9, 5, "", 0);
  CHECK(future.lost);
  CHECK(seqs(future) == std::vector<uint64_t>{1});
  KvEventLog off(0);  // capacity 0: nothing recorded
  off.stored("x", 1, Version{});
  CHECK(off.size() == 0);
  CHECK(off.read(0, 0, "", 0).events.empty());
}

TEST_CASE("kv events: the master's route changes - stored on publication, removed with its cause (removed, replaced, owner_restarted)") {
  MasterCore m;
  m.set_kv_events(1024, 42);
  auto put = [&](uint64_t gen, uint64_t put_id, std::vector<std::string> keys) {
    wire::PutDoneT pd;
    pd.node_id = 1;
    pd.generation = gen;
    pd.put_id = put_id;
    for (auto& k : keys) {
      auto item = std::make_unique<wire::RouteItemT>();
      item->key = k;
      item->len = 4096;
      pd.items.push_back(std::move(item));
    }
    auto r = m.handle(make_envelope(std::move(pd)));
    REQUIRE(r.body.AsPutDoneReply());
  };
  put(5, 1, {"p:a", "p:b"});
  put(5, 2, {"p:a"});  // its own newer version takes the route in place: replaced, then stored
  wire::RemoveRoutesT rr;
  auto item = std::make_unique<wire::RemoveRouteT>();
  item->key = "p:b";
  item->node_id = 1;
  item->generation = 5;
  item->put_id = 1;
  rr.items.push_back(std::move(item));
  REQUIRE(m.handle(make_envelope(std::move(rr))).body.AsRemoveRoutesReply()->removed[0]);
  wire::RegisterOwnerT reg;
  reg.node_id = 1;
  reg.generation = 6;  // a restart: its old generation's routes go
  REQUIRE(m.handle(make_envelope(std::move(reg))).body.AsRegisterOwnerReply());

  wire::KvEventsReqT req;
  req.prefix = "p:";
  auto rep = m.handle(make_envelope(req));
  auto* r = rep.body.AsKvEventsReply();
  REQUIRE(r);
  CHECK(r->epoch == 42);
  CHECK_FALSE(r->lost);
  struct Seen {
    std::string key;
    bool stored;
    uint64_t put_id;
    std::string cause;
    bool operator==(const Seen&) const = default;
  };
  std::vector<Seen> seen;
  for (const auto& e : r->events)
    seen.push_back({e->key, e->kind == wire::KvEventKind::Stored, e->put_id, e->cause});
  const std::vector<Seen> want{{"p:a", true, 1, ""},
                               {"p:b", true, 1, ""},
                               {"p:a", false, 1, "replaced"},
                               {"p:a", true, 2, ""},
                               {"p:b", false, 1, "removed"},
                               {"p:a", false, 2, "owner_restarted"}};
  CHECK(seen == want);
  for (const auto& e : r->events) CHECK(e->node == 1);
  CHECK(m.stats().kv_events == 6);
  // A cursor at the end reads nothing more; the reads are counted.
  req.epoch = r->epoch;
  req.seq = r->next_seq;
  CHECK(m.handle(make_envelope(req)).body.AsKvEventsReply()->events.empty());
  CHECK(m.counters().kv_event_reads_total == 2);
  CHECK(m.counters().kv_event_reads_lost_total == 0);
}

}  // namespace fluxon

namespace fluxon {

TEST_CASE("kv events: random appends of random key lengths and random cursors - every event read is the one appended at its seq") {
  std::mt19937_64 rng(20261207);
  for (size_t cap : {1u, 2u, 3u, 5u, 16u}) {
    KvEventLog log(cap);
    log.set_epoch(5);
    std::map<uint64_t, std::string> appended;
    for (int step = 0; step < 4000; ++step) {
      if (rng() % 3) {
        std::string key(rng() % (cap * KvEventLog::kKeyBytesPerEvent + 40), 'a');
        for (auto& ch : key) ch = char('a' + rng() % 26);
        log.stored(key, 1, Version{1, 1, uint64_t(step)});
        appended[log.next_seq() - 1] = key.substr(0, cap * KvEventLog::kKeyBytesPerEvent);
      } else {
        const uint64_t epoch = rng() % 4 == 0 ? rng() % 7 : 5;
        const uint64_t after = rng() % (log.next_seq() + 3);
        const bool all = rng() % 2;
        auto r = log.read(epoch, after, all ? "" : "a", uint32_t(rng() % 8));
        REQUIRE(r.first_seq <= log.next_seq());
        REQUIRE(log.size() <= cap);
        // Unfiltered, the events are the consecutive seqs from where the cursor continues.
        uint64_t want = epoch == 0 || r.lost ? r.first_seq : after + 1;
        for (const KvEvent& e : r.events) {
          if (all) REQUIRE(e.seq == want++);
          REQUIRE(e.seq >= r.first_seq);
          REQUIRE(e.seq < log.next_seq());
          REQUIRE(e.key == appended.at(e.seq));
        }
      }
    }
  }
}

}  // namespace fluxon
