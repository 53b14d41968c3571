#include <doctest/doctest.h>

#include <set>

#include "fluxon/runtime/reserve_pool.hpp"

using namespace fluxon;

TEST_CASE("slot_size is exact-fit 4 KiB alignment, no power-of-two rounding") {
  CHECK(slot_size_for(1) == 4096);
  CHECK(slot_size_for(4096) == 4096);
  CHECK(slot_size_for(4097) == 8192);
  CHECK(slot_size_for(4718592) == 4718592);  // not 8 MiB
  CHECK(slot_size_for(5 * 4096 + 1) == 6 * 4096);
}

TEST_CASE("slot_size never wraps: a length near 2^64 is a class larger than any grant, never 0") {
  const uint64_t top = ~uint64_t(0);
  for (uint64_t len : {top, top - 1, top - 4094, top - 4095, top - 4096, top / 2 + 1}) {
    CHECK(slot_size_for(len) >= len / 4096 * 4096);
    CHECK(slot_size_for(len) > kDefaultGrantBytes);
    CHECK(slot_size_for(len) % 4096 == 0);
  }
  const uint64_t grant = 64 << 10;
  ReservePool pool(4 * grant, grant, std::nullopt);
  auto r = pool.try_claim(top - 100, 1);  // before: a class of 0 bytes, a division by zero
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
}

TEST_CASE("expected capacity: the worked example of the design (113 slots/grant, 207 grants)") {
  auto g = expected_grants({4718592, 109951162777ull}, 512ull << 20);
  REQUIRE(g.ok());
  CHECK(g->slot_size == 4718592);
  CHECK(g->slots_per_grant == 113);
  CHECK(g->expected_grants == 207);
  CHECK(g->expected_grants * g->slots_per_grant == 23391);
  CHECK(expected_grants({0, 1}, 512ull << 20).status().code() == Code::kInvalidArgument);
  CHECK(expected_grants({(512ull << 20) + 1, 1}, 512ull << 20).status().code() == Code::kInvalidArgument);
}

TEST_CASE("expected capacity warms up and is a hard limit") {
  const uint64_t grant = 1 << 20;  // 1 MiB grants, 256 KiB values -> 4 slots per grant
  ReservePool pool(16 * grant, grant, ExpectedCapacity{256 << 10, 3 * grant});
  auto c = pool.counts();
  CHECK(c.grants == 3);
  CHECK(c.grant_limit == 3);
  CHECK(c.free == 12);
  auto ok = pool.try_claim(256 << 10, 12);
  REQUIRE(ok.ok());
  REQUIRE(ok->has_value());
  auto more = pool.try_claim(256 << 10, 1);  // would need a 4th grant: waits, never grows
  REQUIRE(more.ok());
  CHECK_FALSE(more->has_value());
  CHECK(pool.counts().grants == 3);
  CHECK(pool.try_claim(256 << 10, 13).status().code() == Code::kNoSpace);
}

TEST_CASE("claims are all-or-nothing and grow grant by grant on demand") {
  const uint64_t grant = 64 << 10;  // 16 slots of 4 KiB
  ReservePool pool(4 * grant, grant, std::nullopt);
  CHECK(pool.counts().grants == 0);
  auto a = pool.try_claim(100, 20);
  REQUIRE(a.ok());
  REQUIRE(a->has_value());
  CHECK((*a)->size() == 20);
  CHECK(pool.counts().grants == 2);
  CHECK(pool.counts().prepared == 20);
  CHECK(pool.counts().free == 12);
  // Offsets are distinct and slot-aligned inside the segment.
  std::set<uint64_t> offs;
  for (auto r : **a) offs.insert(pool.slot_offset(r));
  CHECK(offs.size() == 20);
  for (auto o : offs) CHECK(o % 4096 == 0);
  auto b = pool.try_claim(100, 45);  // 12 free + 2 grants = 44 < 45: cannot now
  REQUIRE(b.ok());
  CHECK_FALSE(b->has_value());
  CHECK(pool.counts().prepared == 20);  // nothing taken by the failed claim
  for (auto r : **a) pool.abort(r);
  CHECK(pool.counts().free == 64);
  CHECK(pool.counts().prepared == 0);
}

TEST_CASE("S1: a grant goes back only when all its slots are Free (shrink to serve another class)") {
  const uint64_t grant = 64 << 10;
  ReservePool pool(2 * grant, grant, std::nullopt);
  auto small = pool.try_claim(4096, 17);  // two grants of 4 KiB slots
  REQUIRE(small->has_value());
  auto big = pool.try_claim(32 << 10, 1);  // no grant is empty: must wait
  REQUIRE(big.ok());
  CHECK_FALSE(big->has_value());
  // Free all of the second grant's slots: it becomes reusable by the 32 KiB class.
  for (auto r : **small) pool.abort(r);
  auto big2 = pool.try_claim(32 << 10, 2);
  REQUIRE(big2->has_value());
  CHECK(pool.counts().grants == 2);
}

static SlotRef committed_slot(ReservePool& pool) {
  auto c = pool.try_claim(4096, 1);
  SlotRef r = (**c)[0];
  pool.commit_local(r);
  CHECK(pool.slot(r).state == SlotState::kPendingLocalVisible);
  pool.route_live(r);
  CHECK(pool.slot(r).state == SlotState::kCommitted);
  return r;
}

TEST_CASE("S2: route-first release order frees the slot only after the last holder") {
  ReservePool pool(1 << 20, 1 << 20, std::nullopt);
  SlotRef r = committed_slot(pool);
  pool.add_holder(r);
  pool.route_dropped(r);
  CHECK(pool.slot(r).state == SlotState::kCommitted);  // a holder still reads it
  CHECK(pool.counts().committed == 1);
  pool.release_holder(r);
  CHECK(pool.slot(r).state == SlotState::kFree);
  CHECK(pool.counts().committed == 0);
  CHECK(pool.take_freed());
}

TEST_CASE("S2: holder-first release order frees the slot only after the route") {
  ReservePool pool(1 << 20, 1 << 20, std::nullopt);
  SlotRef r = committed_slot(pool);
  pool.add_holder(r);
  pool.release_holder(r);
  CHECK(pool.slot(r).state == SlotState::kCommitted);  // the route still references it
  CHECK_FALSE(pool.take_freed());
  pool.route_dropped(r);
  CHECK(pool.slot(r).state == SlotState::kFree);
}

TEST_CASE("a never-published slot is freed when the precommit entry and holders are gone") {
  ReservePool pool(1 << 20, 1 << 20, std::nullopt);
  auto c = pool.try_claim(4096, 1);
  SlotRef r = (**c)[0];
  pool.commit_local(r);
  pool.add_holder(r);
  pool.route_dropped(r);  // master refused the route
  CHECK(pool.slot(r).state != SlotState::kFree);
  pool.release_holder(r);
  CHECK(pool.slot(r).state == SlotState::kFree);
}

TEST_CASE("value larger than a grant is rejected") {
  ReservePool pool(4 << 20, 1 << 20, std::nullopt);
  CHECK(pool.try_claim((1 << 20) + 1, 1).status().code() == Code::kInvalidArgument);
}

TEST_CASE("S1: a grant drained for another size keeps its freed slots out of its class, then serves the new size whole") {
  const uint64_t grant = 64 << 10;  // 4 slots of 16 KiB, or 16 of 4 KiB
  ReservePool pool(2 * grant, grant, std::nullopt);
  auto all = pool.try_claim(16384, 8);  // both grants serve 16 KiB
  REQUIRE(all.ok());
  REQUIRE(all->has_value());
  // One grant idle (every slot freed), the other full.
  const uint32_t idle = (**all)[0].grant;
  for (SlotRef r : **all)
    if (r.grant == idle) pool.abort(r);
  auto busy = pool.try_claim(16384, 4);  // its four slots in use again
  REQUIRE(busy.ok());
  REQUIRE(busy->has_value());
  for (SlotRef r : **busy) CHECK(r.grant == idle);
  pool.abort((**busy)[0]);  // grant `idle`: 3 in use, the other grant: 4 in use
  CHECK_FALSE(pool.try_claim(4096, 1)->has_value());  // no 4 KiB slot, no grant to carve or shrink
  const auto d = pool.drain_for(4096);
  REQUIRE(d.has_value());
  CHECK(*d == idle);  // the one with the fewest slots in use
  CHECK(pool.drain_for(4096) == d);  // the same grant while it drains
  CHECK(pool.draining(*d));
  // Its slots are no longer handed to 16 KiB claims...
  auto more16 = pool.try_claim(16384, 1);
  REQUIRE(more16.ok());
  CHECK_FALSE(more16->has_value());
  // ...and the 4 KiB class carves it once it is idle, whole (S5: still 2 grants).
  CHECK_FALSE(pool.try_claim(4096, 1)->has_value());
  for (size_t i = 1; i < (**busy).size(); ++i) pool.abort((**busy)[i]);
  auto small = pool.try_claim(4096, 16);
  REQUIRE(small.ok());
  REQUIRE(small->has_value());
  for (SlotRef r : **small) CHECK(r.grant == *d);
  CHECK(pool.counts().grants == 2);
  CHECK_FALSE(pool.draining(*d));
}

TEST_CASE("S1: slots freed in a grant being drained stay with it until the grant is idle") {
  const uint64_t grant = 64 << 10;
  ReservePool pool(2 * grant, grant, std::nullopt);
  auto all = pool.try_claim(16384, 8);
  REQUIRE(all.ok());
  REQUIRE(all->has_value());
  const auto d = pool.drain_for(4096);
  REQUIRE(d.has_value());
  std::vector<SlotRef> in_d;
  for (SlotRef r : **all)
    if (r.grant == *d) in_d.push_back(r);
  REQUIRE(in_d.size() == 4);
  for (size_t i = 0; i + 1 < in_d.size(); ++i) pool.abort(in_d[i]);  // three of four freed
  CHECK(pool.used_bytes(*d) == 16384);
  auto c16 = pool.try_claim(16384, 1);
  REQUIRE(c16.ok());
  CHECK_FALSE(c16->has_value());  // the freed slots of the draining grant are not handed out
  CHECK_FALSE(pool.try_claim(4096, 1)->has_value());  // not idle yet
  pool.abort(in_d.back());
  auto c4 = pool.try_claim(4096, 1);
  REQUIRE(c4.ok());
  CHECK(c4->has_value());
}
