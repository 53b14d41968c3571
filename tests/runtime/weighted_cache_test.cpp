#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "fluxon/runtime/notifying_cache.hpp"

using namespace fluxon;

namespace {

struct Recorder {
  std::mutex m;
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t, RemovalCause>> events;  // key, value, weight, cause
  auto listener() {
    return [this](const uint64_t& k, uint64_t&& v, uint64_t w, RemovalCause c) {
      std::lock_guard<std::mutex> g(m);
      events.emplace_back(k, v, w, c);
    };
  }
  size_t count(RemovalCause c) {
    std::lock_guard<std::mutex> g(m);
    size_t n = 0;
    for (auto& e : events) n += std::get<3>(e) == c;
    return n;
  }
};

using Cache = NotifyingCache<uint64_t, uint64_t>;

Cache::Options opts(uint64_t cap, Recorder* r = nullptr, size_t shards = 1) {
  Cache::Options o;
  o.max_capacity = cap;
  o.shards = shards;
  if (r) o.listener = r->listener();
  return o;
}

}  // namespace

TEST_CASE("weighted cache: insert, get, contains, remove, sizes") {
  Recorder r;
  Cache c(opts(1000, &r));
  CHECK(c.insert(1, 10, 100).is_ok());
  CHECK(c.insert(2, 20, 200).is_ok());
  CHECK(c.get(1) == 10u);
  CHECK_FALSE(c.get(3).has_value());
  CHECK(c.contains(2));
  CHECK(c.touch(2));
  CHECK_FALSE(c.touch(3));
  CHECK(c.weighted_size() == 300);
  CHECK(c.entry_count() == 2);
  CHECK(c.remove(1) == 10u);
  CHECK_FALSE(c.remove(1).has_value());
  c.flush_listener();
  CHECK(r.count(RemovalCause::kExplicit) == 1);
  CHECK(c.weighted_size() == 200);
  CHECK(c.max_capacity() == 1000);
}

TEST_CASE("weighted cache: zero weight is rejected") {
  Cache c(opts(1000));
  CHECK(c.insert(1, 1, 0).code() == Code::kInvalidArgument);
  CHECK_FALSE(c.contains(1));
}

TEST_CASE("weighted cache: an entry heavier than the capacity is evicted at once, reported once") {
  Recorder r;
  Cache c(opts(1000, &r));
  CHECK(c.insert(7, 70, 5000).is_ok());
  c.flush_listener();
  CHECK_FALSE(c.contains(7));
  CHECK(c.weighted_size() == 0);
  REQUIRE(r.events.size() == 1);
  CHECK(std::get<0>(r.events[0]) == 7);
  CHECK(std::get<3>(r.events[0]) == RemovalCause::kSize);
  CHECK(c.max_capacity() == 1000);
}

TEST_CASE("weighted cache: insert over a key reports Replaced with the old value") {
  Recorder r;
  Cache c(opts(1000, &r));
  (void)c.insert(1, 10, 100);
  (void)c.insert(1, 11, 300);
  c.flush_listener();
  REQUIRE(r.events.size() == 1);
  CHECK(std::get<1>(r.events[0]) == 10);
  CHECK(std::get<3>(r.events[0]) == RemovalCause::kReplaced);
  CHECK(c.get(1) == 11u);
  CHECK(c.weighted_size() == 300);
}

TEST_CASE("weighted cache: remove_if never removes a newer version") {
  Recorder r;
  Cache c(opts(1000, &r));
  (void)c.insert(5, /*put_id=*/2, 100);
  CHECK_FALSE(c.remove_if(5, [](const uint64_t& put_id) { return put_id == 1; }));
  CHECK(c.contains(5));
  CHECK(c.remove_if(5, [](const uint64_t& put_id) { return put_id == 2; }));
  CHECK_FALSE(c.contains(5));
  c.flush_listener();
  CHECK(r.count(RemovalCause::kExplicit) == 1);
}

TEST_CASE("weighted cache: capacity holds after every insert, every Size eviction reported once") {
  Recorder r;
  Cache c(opts(10000, &r, 4));
  std::mt19937_64 rng(1);
  uint64_t inserted = 0;
  for (uint64_t i = 0; i < 5000; ++i) {
    (void)c.insert(rng() % 3000, i, 1 + rng() % 200);
    inserted++;
    CHECK(c.weighted_size() <= c.max_capacity());
  }
  c.flush_listener();
  // Every inserted value either is still cached or left exactly once.
  CHECK(r.events.size() + c.entry_count() == inserted);
  std::set<uint64_t> values;  // values are unique per insert: no duplicates among removals
  for (auto& e : r.events) CHECK(values.insert(std::get<1>(e)).second);
  CHECK(c.max_capacity() == 10000);
}

TEST_CASE("weighted cache: evict_some asked for less, then more than present, capacity unchanged (S5)") {
  Recorder r;
  Cache c(opts(100000, &r, 4));
  for (uint64_t i = 0; i < 100; ++i) (void)c.insert(i, i, 100);
  CHECK(c.weighted_size() == 10000);
  const uint64_t got = c.evict_some(250);
  CHECK(got >= 250);
  CHECK(got < 250 + 4 * 100 + 100);
  CHECK(c.weighted_size() == 10000 - got);
  CHECK(c.max_capacity() == 100000);
  const uint64_t rest = c.weighted_size();
  CHECK(c.evict_some(1u << 30) == rest);
  CHECK(c.weighted_size() == 0);
  CHECK(c.entry_count() == 0);
  CHECK(c.max_capacity() == 100000);
  c.flush_listener();
  CHECK(r.count(RemovalCause::kSize) == 100);
  // The cache still admits up to its unchanged capacity.
  for (uint64_t i = 0; i < 1000; ++i) (void)c.insert(1000 + i, i, 100);
  CHECK(c.weighted_size() > 90000);
}

TEST_CASE("weighted cache: evict_some_if selects only matching entries") {
  Recorder r;
  Cache c(opts(100000, &r, 2));
  for (uint64_t i = 0; i < 100; ++i) (void)c.insert(i, i, 10);
  const uint64_t got = c.evict_some_if(1u << 20, [](const uint64_t& k, const uint64_t&) { return k % 2 == 0; });
  CHECK(got == 500);
  for (uint64_t i = 0; i < 100; ++i) CHECK(c.contains(i) == (i % 2 == 1));
  c.flush_listener();
  for (auto& e : r.events) CHECK(std::get<0>(e) % 2 == 0);
  CHECK(c.max_capacity() == 100000);
}

TEST_CASE("weighted cache: evict_some takes the coldest entries first") {
  Cache c(opts(1u << 20));
  for (uint64_t i = 0; i < 100; ++i) (void)c.insert(i, i, 10);
  for (int rep = 0; rep < 3; ++rep)
    for (uint64_t i = 50; i < 100; ++i) c.get(i);
  c.evict_some(200);
  for (uint64_t i = 50; i < 100; ++i) CHECK(c.contains(i));
}

TEST_CASE("weighted cache: unbounded mode does not evict on insert") {
  Recorder r;
  auto o = opts(1000, &r, 2);
  o.enforce_capacity = false;
  Cache c(o);
  for (uint64_t i = 0; i < 100; ++i) (void)c.insert(i, i, 100);
  CHECK(c.weighted_size() == 10000);
  CHECK(c.entry_count() == 100);
  CHECK(c.evict_some(9000) >= 9000);
  CHECK(c.max_capacity() == 1000);
  c.flush_listener();
  CHECK(r.count(RemovalCause::kSize) >= 90);
}

TEST_CASE("weighted cache: weak_ptr values do not extend lifetimes") {
  WeightedCache<int, std::weak_ptr<int>>::Options o;
  o.max_capacity = 100;
  o.shards = 1;
  WeightedCache<int, std::weak_ptr<int>> c(o);
  auto obj = std::make_shared<int>(42);
  (void)c.insert(1, obj, 10);
  CHECK(obj.use_count() == 1);
  CHECK(c.get(1)->lock().get() == obj.get());
  obj.reset();
  CHECK(c.get(1)->expired());
}

TEST_CASE("weighted cache: the listener runs outside the cache's locks") {
  // A listener that calls back into the cache would deadlock if it ran under a shard lock.
  Cache* self = nullptr;
  std::atomic<int> reentered{0};
  Cache::Options o = opts(100);
  o.listener = [&](const uint64_t& k, uint64_t&&, uint64_t, RemovalCause) {
    self->contains(k);
    (void)self->insert(1000000 + k, 0, 1);
    reentered++;
  };
  Cache c(o);
  self = &c;
  for (uint64_t i = 0; i < 50; ++i) (void)c.insert(i, i, 10);
  c.flush_listener();
  CHECK(reentered.load() > 0);
}

TEST_CASE("weighted cache: the notifier queue is bounded - callers wait for a slow listener, nothing is lost") {
  std::atomic<int> delivered{0};
  Cache::Options o = opts(100);
  o.max_pending_events = 4;
  o.listener = [&](const uint64_t&, uint64_t&&, uint64_t, RemovalCause) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    delivered++;
  };
  Cache c(o);
  for (uint64_t i = 0; i < 300; ++i) (void)c.insert(i, i, 10);  // 290 evictions at least
  c.flush_listener();
  CHECK(c.notifier_high_water() <= 4 + 1);  // the bound, plus the one call's batch that passed it
  CHECK(c.notifier_waits() > 0);
  CHECK(delivered.load() >= 290);
}

TEST_CASE("weighted cache: concurrent insert/get/remove, listener exactly once") {
  Recorder r;
  Cache c(opts(50000, &r, 8));
  std::atomic<uint64_t> inserts{0}, explicit_removes{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(t);
    for (int i = 0; i < 20000; ++i) {
      const uint64_t k = rng() % 5000;
      switch (rng() % 4) {
        case 0:
        case 1:
          (void)c.insert(k, (uint64_t(t) << 32) | uint64_t(i), 1 + rng() % 100);
          inserts++;
          break;
        case 2: c.get(k); break;
        case 3:
          if (c.remove(k)) explicit_removes++;
          break;
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) ts.emplace_back(worker, t + 1);
  for (auto& t : ts) t.join();
  c.flush_listener();
  CHECK(c.weighted_size() <= c.max_capacity());
  CHECK(r.events.size() + c.entry_count() == inserts.load());
  CHECK(r.count(RemovalCause::kExplicit) == explicit_removes.load());
  std::set<uint64_t> values;
  for (auto& e : r.events) CHECK(values.insert(std::get<1>(e)).second);
}

TEST_CASE("frequency sketch: counts, saturates at 15, ages") {
  FrequencySketch s(1024);
  for (int i = 0; i < 20; ++i) s.increment(77);
  CHECK(s.frequency(77) == 15);
  CHECK(s.frequency(78) <= 1);
  for (uint64_t i = 0; i < s.sample_size(); ++i) s.increment(1000 + i);
  CHECK(s.resets() >= 1);
  CHECK(s.frequency(77) <= 8);
}

TEST_CASE("W-TinyLFU (a fixed 1% window) keeps a hot set through a scan that flushes an LRU") {
  auto o = opts(1000);
  o.adaptive_window = false;
  Cache c(o);
  for (int rep = 0; rep < 5; ++rep)
    for (uint64_t k = 0; k < 500; ++k) {
      if (!c.get(k)) (void)c.insert(k, k, 1);
    }
  for (uint64_t k = 100000; k < 110000; ++k) (void)c.insert(k, k, 1);  // a one-pass scan
  int hot = 0;
  for (uint64_t k = 0; k < 500; ++k) hot += c.contains(k);
  CHECK(hot > 450);
}

TEST_CASE("adaptive window: hot set and scans, the simulations leave LRU and the hot set survives the scans") {
  Cache c(opts(1000));
  uint64_t scan = 1 << 20;
  int late_hits = 0, late_reads = 0;
  for (int round = 0; round < 40; ++round) {
    for (uint64_t k = 0; k < 500; ++k) {
      const bool hit = c.touch(k);
      if (!hit) (void)c.insert(k, k, 1);
      if (round >= 30) late_reads++, late_hits += hit;
    }
    for (int i = 0; i < 1500; ++i) (void)c.insert(scan++, 0, 1);  // flushes an LRU of 1000
  }
  const auto ad = c.adaptation();
  MESSAGE("window " << ad.window_ratio << " after " << ad.changes << " changes; hot hit ratio in the last rounds "
                    << double(late_hits) / late_reads);
  CHECK(ad.window_ratio < 0.5);
  CHECK(double(late_hits) / late_reads > 0.9);
}

namespace {
// Multi-turn shape: each "session" writes fresh keys and reads them again a few turns later, the
// gap longer than a 1% window but well inside the capacity (an LRU hits every re-read).
double recency_run(Cache& c, uint64_t* lru_hits, uint64_t* reads) {
  std::mt19937_64 rng(5);
  std::deque<std::vector<uint64_t>> recent;
  uint64_t next = 1, hits = 0;
  *reads = 0;
  for (int turn = 0; turn < 6000; ++turn) {
    std::vector<uint64_t> fresh;
    for (int i = 0; i < 8; ++i) fresh.push_back(next++);
    for (uint64_t k : fresh) (void)c.insert(k, k, 1);
    recent.push_back(fresh);
    if (recent.size() > 40) recent.pop_front();
    if (recent.size() < 40) continue;
    // re-read a turn 20..39 back: 160..320 keys ago, inside a capacity of 1000
    const auto& old = recent[rng() % 20];
    for (uint64_t k : old) {
      ++*reads;
      if (c.touch(k)) hits++;
      else (void)c.insert(k, k, 1);
    }
  }
  *lru_hits = *reads;  // an LRU of 1000 holds every key re-read here
  return double(hits) / double(*reads);
}
}  // namespace

TEST_CASE("adaptive window: a new cache is an LRU, and a recency-heavy workload keeps it one") {
  Cache::Options o = opts(1000);
  Cache fixed([&] { auto f = opts(1000); f.adaptive_window = false; return f; }());
  Cache adaptive(o);
  CHECK(adaptive.window_ratio() == 1.0);
  CHECK(fixed.window_ratio() == doctest::Approx(0.01));
  uint64_t lru = 0, reads = 0;
  const double f = recency_run(fixed, &lru, &reads);
  const double a = recency_run(adaptive, &lru, &reads);
  const auto ad = adaptive.adaptation();
  MESSAGE("fixed 1% window " << f << ", adaptive " << a << ", window " << ad.window_ratio << " after " << ad.epochs
                             << " epochs, " << ad.changes << " changes");
  CHECK(ad.epochs > 10);
  CHECK(ad.window_ratio == 1.0);
  CHECK(a > 0.99);
  CHECK(a > f + 0.3);
  CHECK(adaptive.max_capacity() == 1000);  // S5: the window moves inside the capacity
  CHECK(adaptive.weighted_size() <= 1000);
}

TEST_CASE("adaptive window: a frequency-heavy workload gets a small window, the simulations stay bounded") {
  Cache c(opts(1000));
  std::mt19937_64 rng(9);
  uint64_t one_hit = 1 << 30;
  int hot_hits = 0, hot_reads = 0;
  for (int i = 0; i < 200000; ++i) {
    if (rng() % 2) {  // a hot set of 600 keys, read over and over
      const uint64_t k = rng() % 600;
      hot_reads++;
      if (c.touch(k)) hot_hits++;
      else (void)c.insert(k, k, 1);
    } else {  // one-hit wonders
      (void)c.insert(one_hit++, 0, 1);
    }
  }
  const auto ad = c.adaptation();
  MESSAGE("window " << ad.window_ratio << ", hot hit ratio " << double(hot_hits) / hot_reads << ", simulated 1 key in "
                    << ad.sample_rate << ", " << ad.sim_entries << " held");
  CHECK(ad.window_ratio < 0.1);
  CHECK(ad.changes >= 1);
  CHECK(double(hot_hits) / hot_reads > 0.9);
  CHECK(ad.sim_entries <= 1000);  // a simulation holds what its capacity holds, no more
  CHECK(ad.sim_capacity == 1000 / ad.sample_rate);
}

TEST_CASE("window simulations: the sample halves to stay bounded, ties never move the choice") {
  WindowSims sims(/*capacity=*/1 << 20, /*sketch_entries=*/1 << 16, /*max_entries=*/512);
  for (uint64_t k = 1; k <= 20000; ++k) sims.access(k * 0x9e3779b97f4a7c15ull, 1);
  for (size_t i = 0; i < WindowSims::kCount; ++i) {
    CHECK(sims.entries(i) <= 512);
    CHECK(sims.capacity(i) == (uint64_t(1) << 20) / sims.sample_rate());
  }
  CHECK(sims.sample_rate() >= 32);  // 20000 keys, all fitting: about 20000 / rate kept
  // Every key fits in every simulation: all score the same, and the LRU choice stays.
  for (int round = 0; round < 16; ++round)
    for (uint64_t k = 1; k <= 20000; ++k) sims.access(k * 0x9e3779b97f4a7c15ull, 1);
  CHECK(sims.epochs() > 5);
  CHECK(sims.changes() == 0);
  CHECK(sims.share() == 1.0);
}

TEST_CASE("weighted cache: reads are replayed in order, so eviction follows exact LRU (not CLOCK)") {
  Cache c(opts(3));
  (void)c.insert(1, 1, 1);
  CHECK(c.touch(1));  // read before 2 and 3 arrive: 1 is the least recently used
  (void)c.insert(2, 2, 1);
  (void)c.insert(3, 3, 1);
  (void)c.insert(4, 4, 1);
  CHECK_FALSE(c.contains(1));  // a second-chance bit alone would have kept 1 and dropped 2
  CHECK(c.contains(2));
  CHECK(c.contains(3));
  CHECK(c.contains(4));
  CHECK(c.touch(2));  // now 3 is the least recently used: first in, first out would drop 2
  (void)c.insert(5, 5, 1);
  CHECK_FALSE(c.contains(3));
  CHECK(c.contains(2));
}

TEST_CASE("weighted cache: an LRU's shards lend capacity, so the shards hold what one LRU would") {
  Recorder r;
  Cache c(opts(100, &r, 2));
  std::vector<uint64_t> keys[2];
  for (uint64_t k = 1; keys[0].size() < 200 || keys[1].size() < 200; ++k) keys[c.shard_of(k)].push_back(k);
  // 50 keys of shard 0, then 80 of shard 1: one LRU of 100 keeps the newest 20 and all 80.
  for (int i = 0; i < 50; ++i) (void)c.insert(keys[0][i], 0, 1);
  for (int i = 0; i < 80; ++i) {
    (void)c.insert(keys[1][i], 1, 1);
    CHECK(c.weighted_size() <= 100);
  }
  for (int i = 0; i < 50; ++i) CHECK(c.contains(keys[0][i]) == (i >= 30));
  for (int i = 0; i < 80; ++i) CHECK(c.contains(keys[1][i]));
  CHECK(c.max_capacity() == 100);  // S5
  c.flush_listener();
  CHECK(r.count(RemovalCause::kSize) == 30);
  // A shard keeps at least 1/8 of its share: 6 of shard 0's 50 survive whatever shard 1 does.
  for (int i = 80; i < 200; ++i) (void)c.insert(keys[1][i], 1, 1);
  int left = 0;
  for (int i = 0; i < 50; ++i) left += c.contains(keys[0][i]);
  CHECK(left == 6);
  CHECK(c.weighted_size() <= 100);
}

TEST_CASE("weighted cache: evict_some takes the coldest entry across the shards - small requests do not all fall on one shard") {
  // An unbounded LRU (the owner's resident tier) of 4 shards: one entry at a time goes in the
  // order the entries were last used, whichever shard holds them.
  auto o = opts(1u << 20, nullptr, 4);
  o.enforce_capacity = false;
  WeightedCache<uint64_t, uint64_t> c(o);
  for (uint64_t i = 0; i < 64; ++i) (void)c.insert(i, i, 10);
  std::set<size_t> shards;
  for (uint64_t i = 0; i < 64; ++i) shards.insert(c.shard_of(i));
  REQUIRE(shards.size() == 4);
  for (uint64_t i = 0; i < 32; ++i) {
    std::vector<std::pair<uint64_t, uint64_t>> gone;
    REQUIRE(c.evict_some_if(1, [](const uint64_t&, const uint64_t&) { return true; }, &gone) == 10);
    REQUIRE(gone.size() == 1);
    CHECK(gone[0].first == i);
  }
  for (uint64_t i = 32; i < 64; ++i) CHECK(c.contains(i));
}

TEST_CASE("weighted cache: evict_some_if in recency order takes the least recently used eligible entry, whatever its region") {
  // A bounded W-TinyLFU with a fixed small window: entries read again sit in protected, new ones in
  // the window; kPolicy takes probation first, kRecency the oldest eligible by last use.
  auto o = opts(1000, nullptr, 1);
  o.adaptive_window = false;
  o.window_ratio = 0.1;
  WeightedCache<uint64_t, uint64_t> c(o);
  for (uint64_t i = 0; i < 50; ++i) (void)c.insert(i, i, 10);
  for (uint64_t i = 0; i < 10; ++i) c.touch(i);  // read again: protected
  for (uint64_t i = 200; i < 240; ++i) (void)c.insert(i, i, 10);  // newer: window, then probation
  // Eligible: 0..9 (protected, used before 200..239) and 200..239. Probation-first would take a
  // 2xx key; the least recently used eligible one is 0.
  auto pred = [](const uint64_t& k, const uint64_t&) { return k < 10 || k >= 200; };
  std::vector<std::pair<uint64_t, uint64_t>> gone;
  REQUIRE(c.evict_some_if(1, pred, &gone) == 10);
  CHECK(gone[0].first >= 200);  // kPolicy: probation first
  gone.clear();
  REQUIRE(c.evict_some_if(1, pred, &gone, WeightedCache<uint64_t, uint64_t>::Order::kRecency) == 10);
  CHECK(gone[0].first == 0);
}

TEST_CASE("weighted cache: a Scan goes on where it stopped - k selections behind n ineligible entries cost n + O(k) judgments") {
  // The owner's resident tier (unbounded, 4 shards): 4,000 entries nobody may take, coldest
  // first, then 400 that may go. Selecting them one call at a time through one Scan judges each
  // ineligible entry once; without the Scan every call walks all 4,000 again (1.6M judgments).
  auto o = opts(1u << 30, nullptr, 4);
  o.enforce_capacity = false;
  using C = WeightedCache<uint64_t, uint64_t>;
  C c(o);
  for (uint64_t i = 0; i < 4400; ++i) (void)c.insert(i, i, 1);
  uint64_t judged = 0;
  auto pred = [&](const uint64_t& k, const uint64_t&) {
    ++judged;
    return k >= 4000;
  };
  C::Scan scan;
  std::vector<std::pair<uint64_t, uint64_t>> gone;
  for (int i = 0; i < 400; ++i) REQUIRE(c.evict_some_if(1, pred, &gone, C::Order::kPolicy, &scan) == 1);
  REQUIRE(gone.size() == 400);
  for (size_t i = 0; i < gone.size(); ++i) CHECK(gone[i].first == 4000 + i);  // still the coldest first
  CHECK(judged < 4000 + 8 * 400);  // per call: each shard's candidate judged again, then the next one
  // Without a Scan the same selections walk the ineligible entries every time.
  C d(o);
  for (uint64_t i = 0; i < 4400; ++i) (void)d.insert(i, i, 1);
  judged = 0;
  for (int i = 0; i < 40; ++i) REQUIRE(d.evict_some_if(1, pred, &gone) == 1);
  CHECK(judged > 40 * 4000);
}

TEST_CASE("weighted cache: a Scan restarts a shard changed behind it and stops at its budget") {
  auto o = opts(1u << 30, nullptr, 1);
  o.enforce_capacity = false;
  using C = WeightedCache<uint64_t, uint64_t>;
  C c(o);
  for (uint64_t i = 0; i < 100; ++i) (void)c.insert(i, i, 1);
  std::set<uint64_t> allowed{50};
  auto pred = [&](const uint64_t& k, const uint64_t&) { return allowed.count(k) != 0; };
  C::Scan scan;
  std::vector<std::pair<uint64_t, uint64_t>> gone;
  REQUIRE(c.evict_some_if(1, pred, &gone, C::Order::kPolicy, &scan) == 1);
  CHECK(gone.back().first == 50);
  // An entry the walk passed may go now (the caller's pred changed): reset() sees it.
  allowed = {10, 90};
  scan.reset();
  REQUIRE(c.evict_some_if(1, pred, &gone, C::Order::kPolicy, &scan) == 1);
  CHECK(gone.back().first == 10);
  // The walk stands at 90 now (the next candidate). A read moves 5 behind it, an insert adds 200,
  // and 90 itself is removed: the shard changed, the walk starts again from the cold end - the
  // cursor never follows the node that left (ASan would see it in the asan_ubsan build).
  allowed = {5, 95, 200};
  c.touch(5);
  (void)c.insert(200, 200, 1);
  (void)c.remove(90);
  REQUIRE(c.evict_some_if(3, pred, &gone, C::Order::kPolicy, &scan) == 3);
  CHECK(gone[gone.size() - 3].first == 95);  // 5 was read last: it is now among the newest
  CHECK(gone[gone.size() - 2].first == 5);
  CHECK(gone[gone.size() - 1].first == 200);
  // A budget of 30 judgments: entry 40 lies past it, entry 20 within.
  C::Scan small(30);
  allowed = {40};
  CHECK(c.evict_some_if(1, pred, &gone, C::Order::kPolicy, &small) == 0);
  CHECK(small.budget_left() == 0);
  C::Scan enough(30);
  allowed = {20};
  CHECK(c.evict_some_if(1, pred, &gone, C::Order::kPolicy, &enough) == 1);
}

TEST_CASE("weighted cache: touch_many leaves the cache exactly as touch one key at a time does") {
  // Two caches fed the same inserts over capacity; reads go through touch() in one and through
  // touch_many() in the other. Every shard sees the same reads in the same order, so both evict
  // the same entries.
  using SCache = WeightedCache<std::string, uint64_t>;
  SCache::Options o;
  o.max_capacity = 300;
  o.shards = 4;
  SCache one(o), many(o);
  std::mt19937_64 rng(5);
  auto key = [&](uint64_t i) { return "sglang:page:" + std::to_string(i) + "_1_2"; };
  size_t found_one = 0, found_many = 0;
  for (int round = 0; round < 3000; ++round) {
    const uint64_t k = rng() % 1000;
    (void)one.insert(key(k), k, 1 + k % 3);
    (void)many.insert(key(k), k, 1 + k % 3);
    std::vector<std::string> keys;
    for (int i = 0; i < 24; ++i) keys.push_back(key(rng() % 400));  // a hot part, some absent
    std::vector<const std::string*> ptrs;
    std::vector<uint64_t> hashes;
    for (const auto& s : keys) {
      ptrs.push_back(&s);
      hashes.push_back(std::hash<std::string>{}(s));
      found_one += one.touch(s);
    }
    found_many += many.touch_many(ptrs.data(), hashes.data(), ptrs.size());
  }
  CHECK(found_one == found_many);
  CHECK(found_one > 0);
  CHECK(one.weighted_size() == many.weighted_size());
  size_t kept = 0;
  for (uint64_t k = 0; k < 1000; ++k) {
    CHECK(one.contains(key(k)) == many.contains(key(k)));
    kept += one.contains(key(k));
  }
  CHECK(kept > 0);
  CHECK(kept < 1000);
}
