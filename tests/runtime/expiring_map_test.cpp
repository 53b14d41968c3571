// ExpiringMap: expiry in the order entries were set, a key set again keeps only its newest expiry,
// the bound drops the entry that would expire first (counted), the queue stays bounded under
// re-sets; over std::map, std::unordered_map and FlatMap alike.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <unordered_map>

#include "fluxon/runtime/expiring_map.hpp"
#include "fluxon/runtime/flat_map.hpp"

using namespace fluxon;

namespace {
struct IntHash {
  size_t operator()(uint64_t x) const { return size_t(x * 0x9E3779B97F4A7C15ull); }
};

template <class M>
void exercise(M& m) {
  m.set(1, 10, 100);
  m.set(2, 20, 200);
  m.set(3, 30, 300);
  REQUIRE(m.find(2));
  CHECK(*m.find(2) == 20);
  // Set again later: the first expiry no longer ends it.
  m.set(1, 11, 400);
  CHECK(m.expire(150) == 0);
  CHECK(*m.find(1) == 11);
  CHECK(m.expire(250) == 1);  // key 2
  CHECK_FALSE(m.find(2));
  m.renew(3, 500);
  CHECK(m.expire(450) == 1);  // key 1 (its 400), key 3 renewed past it
  CHECK(m.find(3));
  CHECK(m.erase(3));
  CHECK(m.expire(1000) == 0);
  CHECK(m.empty());
  // The bound: a fourth entry drops the one that expires first, counted.
  m.set(7, 70, 1100);
  m.set(8, 80, 1200);
  m.set(9, 90, 1300);
  m.set(7, 71, 1400);  // 7 now expires last: 8 is the first to go
  m.set(10, 100, 1500);
  CHECK(m.size() == 3);
  CHECK(m.dropped() == 1);
  CHECK_FALSE(m.find(8));
  CHECK(m.find(7));
  CHECK(m.find(9));
  CHECK(m.find(10));
  // Many re-sets of one key: the queue is compacted, it does not grow with them.
  for (int64_t t = 2000; t < 12000; ++t) m.set(9, 91, t);
  CHECK(m.queued() <= 2 * m.size() + 65);
  CHECK(m.expire(11998) == 2);  // 7 and 10; 9 lives until 11999
  CHECK(m.size() == 1);
  CHECK(m.expire(11999) == 1);
  CHECK(m.empty());
}
}  // namespace

TEST_CASE("bounds: ExpiringMap expires in order, keeps a re-set key's newest expiry, drops the first to expire at its bound (counted) - std::map, unordered_map, FlatMap") {
  ExpiringMap<uint64_t, int, std::map<uint64_t, ExpiringSlot<int>>> a(3);
  exercise(a);
  ExpiringMap<uint64_t, int, std::unordered_map<uint64_t, ExpiringSlot<int>>> b(3);
  exercise(b);
  ExpiringMap<uint64_t, int, FlatMap<uint64_t, ExpiringSlot<int>, IntHash>> c(3);
  exercise(c);
  // erase_if over the std containers (an owner's restart forgets its entries).
  a.set(1, 1, 10);
  a.set(2, 2, 10);
  a.erase_if([](uint64_t k, int) { return k == 1; });
  CHECK_FALSE(a.find(1));
  CHECK(a.find(2));
}
