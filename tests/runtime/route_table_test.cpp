// RouteTable and InlineList (the master's route storage) against std::unordered_map / std::vector
// under random operations: every lookup, iteration and erase agrees.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <string>
#include <unordered_map>

#include "fluxon/core/route_table.hpp"

using namespace fluxon;

TEST_CASE("route table: random inserts, finds, erases and iteration agree with std::unordered_map") {
  RouteTable<uint64_t> t;
  std::unordered_map<std::string, uint64_t> ref;
  std::mt19937_64 rng(5);
  for (int op = 0; op < 200000; ++op) {
    const std::string k = "key-" + std::to_string(rng() % 5000) + std::string(rng() % 40, 'x');
    switch (rng() % 3) {
      case 0: {
        const uint64_t v = rng();
        const auto [it, inserted] = t.emplace(k, v);
        const bool ref_inserted = ref.emplace(k, v).second;
        REQUIRE(inserted == ref_inserted);
        CHECK(it->first == k);
        CHECK(it->second == ref.at(k));
        break;
      }
      case 1: {
        auto it = t.find(k);
        auto r = ref.find(k);
        REQUIRE((it == t.end()) == (r == ref.end()));
        if (r != ref.end()) CHECK(it->second == r->second);
        break;
      }
      case 2: {
        auto it = t.find(k);
        if (it != t.end()) t.erase(it);
        ref.erase(k);
        break;
      }
    }
    REQUIRE(t.size() == ref.size());
  }
  size_t seen = 0;
  for (const auto& [k, v] : t) {
    seen++;
    CHECK(ref.at(std::string(k)) == v);
  }
  CHECK(seen == ref.size());
  // Erase everything through iteration-found keys: every probe chain stays intact.
  for (const auto& [k, v] : ref) {
    auto it = t.find(k);
    REQUIRE(it != t.end());
    t.erase(it);
  }
  CHECK(t.size() == 0);
  CHECK(t.begin() == t.end());
  // Move: the moved-to table owns the entries, the moved-from one is empty and usable.
  RouteTable<uint64_t> a;
  a.emplace("x", 1);
  RouteTable<uint64_t> b = std::move(a);
  CHECK(b.find("x")->second == 1);
  CHECK(a.size() == 0);
  a.emplace("y", 2);
  CHECK(a.find("y")->second == 2);
}

TEST_CASE("inline list: the first element inline, the rest in one vector, erase anywhere") {
  InlineList<int> l;
  CHECK(l.empty());
  for (int i = 0; i < 5; ++i) l.push_back(i);
  CHECK(l.size() == 5);
  l.erase_at(0);  // the second becomes the inline first
  l.erase_at(2);
  std::vector<int> got;
  for (int x : l) got.push_back(x);
  CHECK(got == std::vector<int>{1, 2, 4});
  l.erase_at(2);
  l.erase_at(1);
  l.erase_at(0);
  CHECK(l.empty());
  l.push_back(9);
  CHECK(l[0] == 9);
}
