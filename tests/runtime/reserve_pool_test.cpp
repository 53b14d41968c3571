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
