// RouteTable and InlineList (the master's route storage) against std::unordered_map / std::vector
// under random operations: every lookup, iteration and erase agrees.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <unordered_map>

#include "fluxon/master/route_table.hpp"
#include "fluxon/runtime/flat_map.hpp"
#include "fluxon/runtime/key_index.hpp"

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

namespace {
std::string hex_of(uint64_t a, uint64_t b) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
  return buf;
}
}  // namespace

TEST_CASE("key codec: SGLang keys pack their page hash and intern their affixes, every key decodes as it was") {
  KeyCodec c;
  std::string enc;
  const std::string sg = "sglang:" + hex_of(1, 2) + hex_of(3, 4) + "_Qwen-Qwen3-8B_0_2_layer_first_bfloat16_p64";
  c.encode(sg, enc, true);
  CHECK(enc.size() == 3 + 32);  // kind, pair id, 64 digits packed
  CHECK(enc[0] == KeyCodec::kPacked);
  CHECK(c.decode(enc) == sg);
  CHECK(c.affix_count() == 1);
  // The same affixes with another hash share the pair.
  const std::string sg2 = "sglang:" + hex_of(5, 6) + hex_of(7, 8) + "_Qwen-Qwen3-8B_0_2_layer_first_bfloat16_p64";
  c.encode(sg2, enc, true);
  CHECK(c.decode(enc) == sg2);
  CHECK(c.affix_count() == 1);
  // Keys without a long lowercase hex run stay raw: short runs, upper case, nothing at all.
  for (std::string k : {std::string("bench:run:rdata:0:12"), std::string(""), std::string("ABCDEF0123456789ABCDEF"),
                        std::string("deadbeef"), "x" + hex_of(9, 9).substr(0, 15) + "y"}) {
    c.encode(k, enc, true);
    CHECK(enc[0] == KeyCodec::kRaw);
    CHECK(c.decode(enc) == k);
  }
  // An odd run keeps its last digit in the tail; the longest run is the one packed.
  const std::string odd = "p:" + hex_of(10, 11) + "a:" + hex_of(1, 1).substr(0, 20) + "_t";
  c.encode(odd, enc, true);
  CHECK(enc[0] == KeyCodec::kPacked);
  CHECK(enc.size() == 3 + 16);
  CHECK(c.decode(enc) == odd);
  // Without interning, an unknown pair encodes raw (that key is in no table), a known one packed.
  const size_t pairs = c.affix_count();
  c.encode("other:" + hex_of(1, 2) + "_m", enc, false);
  CHECK(enc[0] == KeyCodec::kRaw);
  CHECK(c.affix_count() == pairs);
  c.encode(sg2, enc, false);
  CHECK(enc[0] == KeyCodec::kPacked);
}

TEST_CASE("route table: keys of many affix pairs, past the codec's dictionary, are all found and iterate decoded") {
  // More distinct affix pairs than the dictionary takes: the later keys are stored raw, and a key
  // encodes the same way at insertion and at lookup whichever it is.
  RouteTable<uint64_t> t;
  std::unordered_map<std::string, uint64_t> ref;
  const uint64_t n = KeyCodec::kMaxAffixes + 5000;
  auto key = [](uint64_t i) { return "m" + std::to_string(i) + ":" + hex_of(i * 7, i) + "_" + std::to_string(i % 3); };
  for (uint64_t i = 0; i < n; ++i) {
    REQUIRE(t.emplace(key(i), i).second);
    ref.emplace(key(i), i);
  }
  CHECK(t.affix_count() == KeyCodec::kMaxAffixes);
  for (uint64_t i = 0; i < n; i += 97) {
    auto it = t.find(key(i));
    REQUIRE(it != t.end());
    CHECK(it->second == i);
    CHECK(it->first == key(i));
  }
  CHECK(t.find(key(n)) == t.end());  // an unknown pair: raw, absent
  size_t seen = 0;
  for (const auto& [k, v] : t) {
    seen++;
    REQUIRE(ref.at(k) == v);
  }
  CHECK(seen == n);
  for (uint64_t i = 0; i < n; i += 2) t.erase(t.find(key(i)));
  for (uint64_t i = 1; i < n; i += 2) REQUIRE(t.find(key(i))->second == i);
  CHECK(t.size() == n / 2);
}

TEST_CASE("node arena: freed blocks are reused by their size class, large ones go to the heap") {
  NodeArena a;
  void* p = a.allocate(100);
  void* q = a.allocate(100);
  CHECK(p != q);
  a.deallocate(p, 100);
  CHECK(a.allocate(97) == p);  // the same 8-byte class
  void* big = a.allocate(NodeArena::kMaxPooled + 1);
  std::memset(big, 1, NodeArena::kMaxPooled + 1);
  a.deallocate(big, NodeArena::kMaxPooled + 1);
  CHECK(a.chunk_bytes() == NodeArena::kChunk);
  a.deallocate(q, 100);
}

TEST_CASE("route table: churn at a constant size reuses its slots (deleted markers are swept, the table does not grow)") {
  RouteTable<uint64_t> t;
  auto key = [](uint64_t i) { return "sglang:" + hex_of(i * 0x9e3779b97f4a7c15ull, i) + "_m_0_1"; };
  const uint64_t live = 12100;  // 0.74 of 16384 slots: the first sweep doubles, later ones run at 0.37
  for (uint64_t i = 0; i < live; ++i) t.emplace(key(i), i);
  const size_t filled = t.capacity();
  size_t cap = 0;
  for (uint64_t i = live; i < 40 * live; ++i) {  // every key replaced 39 times over
    auto old = t.find(key(i - live));
    REQUIRE(old != t.end());
    REQUIRE(old->second == i - live);
    t.erase(old);
    REQUIRE(t.emplace(key(i), i).second);
    // The first sweep may double the table once (its live keys were past 3/8 of it); from then on
    // every sweep only clears the markers.
    if (i == 2 * live) cap = t.capacity();
    if (i > 2 * live) REQUIRE(t.capacity() == cap);
  }
  CHECK(t.size() == live);
  CHECK(cap <= 2 * filled);
  for (uint64_t i = 39 * live; i < 40 * live; ++i) REQUIRE(t.find(key(i))->second == i);
  for (uint64_t i = 0; i < 39 * live; i += 101) REQUIRE(t.find(key(i)) == t.end());
  size_t seen = 0;
  for (const auto& kv : t) seen += kv.second >= 39 * live;
  CHECK(seen == live);
}

TEST_CASE("route table: a batch prepared, prefetched, then found and inserted agrees with single lookups") {
  RouteTable<uint64_t> t;
  std::vector<std::string> keys;
  for (uint64_t i = 0; i < 3000; ++i)
    keys.push_back(i % 3 ? "sglang:" + hex_of(i, i * 3) + "_m" : "raw-key-" + std::to_string(i));
  std::vector<RouteTable<uint64_t>::Probe> probes(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) t.prepare(keys[i], probes[i]);
  for (auto& p : probes) t.prefetch(p);
  for (size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(t.find(probes[i]) == t.end());
    // A probe made before the table grew, or before its key's affixes were interned, still inserts
    // the key where single lookups find it.
    REQUIRE(t.emplace(keys[i], probes[i], i).second);
  }
  // The same new-affix key twice in one batch: the second probe, made before the first insertion
  // interned the affixes, finds what the first inserted.
  const std::string twice = "other:" + hex_of(77, 78) + "_n";
  RouteTable<uint64_t>::Probe p1, p2;
  t.prepare(twice, p1);
  t.prepare(twice, p2);
  REQUIRE(t.emplace(twice, p1, 1).second);
  REQUIRE(t.find(p2) != t.end());
  CHECK_FALSE(t.emplace(twice, p2, 2).second);
  CHECK(t.find(twice)->second == 1);
  for (size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(t.find(keys[i])->second == i);
    CHECK(t.find(keys[i])->first == keys[i]);
    RouteTable<uint64_t>::Probe p;
    t.prepare(keys[i], p);
    REQUIRE(t.find(p)->second == i);
    CHECK_FALSE(t.emplace(keys[i], p, 0).second);
  }
}

TEST_CASE("flat map: random inserts, finds and erases agree with std::unordered_map") {
  struct H {
    size_t operator()(uint64_t k) const { return k * 0x9e3779b97f4a7c15ull >> 7; }
  };
  FlatMap<uint64_t, uint64_t, H> m;
  std::unordered_map<uint64_t, uint64_t> ref;
  std::mt19937_64 rng(11);
  for (int op = 0; op < 300000; ++op) {
    const uint64_t k = rng() % 4000;
    switch (rng() % 3) {
      case 0: {
        const uint64_t v = rng();
        auto [p, inserted] = m.try_emplace(k, v);
        REQUIRE(inserted == ref.emplace(k, v).second);
        REQUIRE(*p == ref.at(k));
        break;
      }
      case 1: {
        const uint64_t* p = m.find(k);
        REQUIRE((p == nullptr) == (ref.count(k) == 0));
        if (p) REQUIRE(*p == ref.at(k));
        break;
      }
      case 2:
        REQUIRE(m.erase(k) == (ref.erase(k) == 1));
        break;
    }
    REQUIRE(m.size() == ref.size());
  }
  size_t seen = 0;
  m.for_each([&](uint64_t k, uint64_t v) {
    seen++;
    CHECK(ref.at(k) == v);
  });
  CHECK(seen == ref.size());
}

TEST_CASE("key index: random inserts, finds, batched finds and erases agree with std::unordered_map, colliding hashes too") {
  // A hash of 4 values: nearly every key shares its hash with others, so probes pass over
  // matching hashes of other keys (the case find_many settles by comparing the key itself).
  struct Collide {
    size_t operator()(std::string_view k) const { return std::hash<std::string_view>{}(k) & 3; }
  };
  auto run = [](auto& m) {
    std::unordered_map<std::string, uint64_t> ref;
    std::mt19937_64 rng(7);
    auto key = [&] { return "sglang:page:" + std::to_string(rng() % 600) + "_0_2"; };
    for (int op = 0; op < 60000; ++op) {
      switch (rng() % 4) {
        case 0: {
          const std::string k = key();
          const uint64_t v = rng();
          auto [node, fresh] = m.insert_or_assign(k, v);
          REQUIRE(fresh == (ref.count(k) == 0));
          ref[k] = v;
          REQUIRE(node->first == k);
          REQUIRE(node->second == v);
          break;
        }
        case 1: {
          const std::string k = key();
          auto* node = m.find(k);
          REQUIRE((node == nullptr) == (ref.count(k) == 0));
          if (node) REQUIRE(node->second == ref.at(k));
          break;
        }
        case 2: {
          std::vector<std::string> keys;
          for (int i = 0; i < 40; ++i) keys.push_back(key());
          std::vector<const typename std::remove_reference_t<decltype(m)>::value_type*> out(keys.size());
          std::vector<uint64_t> hashes(keys.size());
          m.find_many(keys, keys.size(), out.data(), hashes.data());
          for (size_t i = 0; i < keys.size(); ++i) {
            REQUIRE(hashes[i] == m.hash(keys[i]));
            REQUIRE((out[i] == nullptr) == (ref.count(keys[i]) == 0));
            if (out[i]) REQUIRE(out[i]->first == keys[i]);
          }
          break;
        }
        case 3: {
          const std::string k = key();
          auto* node = m.find(k);
          REQUIRE((node != nullptr) == (ref.erase(k) == 1));
          if (node) m.erase(node);
          break;
        }
      }
      REQUIRE(m.size() == ref.size());
    }
    size_t seen = 0;
    for (const auto& [k, v] : m) {
      REQUIRE(ref.at(k) == v);
      seen++;
    }
    CHECK(seen == ref.size());
  };
  KeyIndex<uint64_t> plain;
  run(plain);
  KeyIndex<uint64_t, Collide> colliding;
  run(colliding);
}
