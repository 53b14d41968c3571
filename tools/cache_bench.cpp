// fluxon_cache_bench: WeightedCache (W-TinyLFU) against an LRU of the same capacity on the same
// traces, and its get throughput against a tbb::concurrent_hash_map lookup, all in one run.
#include <tbb/concurrent_hash_map.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <list>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fluxon/core/depth_order.hpp"
#include "fluxon/runtime/prefix_chains.hpp"
#include "fluxon/runtime/weighted_cache.hpp"

using namespace fluxon;

namespace {

struct Req {
  uint64_t key;
  uint32_t weight;
};

// A weighted LRU: the baseline.
class Lru {
 public:
  explicit Lru(uint64_t cap) : cap_(cap) {}
  // A hit moves k to the MRU end; a miss inserts it (touch_only: a miss changes nothing).
  bool access(uint64_t k, uint64_t w, bool touch_only = false) {
    auto it = map_.find(k);
    if (it != map_.end()) {
      order_.splice(order_.end(), order_, it->second);
      return true;
    }
    if (touch_only || w > cap_) return false;
    order_.push_back({k, w});
    map_[k] = std::prev(order_.end());
    size_ += w;
    while (size_ > cap_) {
      auto& f = order_.front();
      size_ -= f.second;
      map_.erase(f.first);
      order_.pop_front();
    }
    return false;
  }

 private:
  uint64_t cap_, size_ = 0;
  std::list<std::pair<uint64_t, uint64_t>> order_;
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, uint64_t>>::iterator> map_;
};

struct Ratio {
  double hit, byte_hit;
};

template <class Access>
Ratio replay(const std::vector<Req>& trace, Access&& access) {
  uint64_t hits = 0, bytes = 0, hit_bytes = 0;
  for (const auto& r : trace) {
    const bool h = access(r);
    hits += h;
    bytes += r.weight;
    hit_bytes += h ? r.weight : 0;
  }
  return {100.0 * hits / trace.size(), 100.0 * hit_bytes / bytes};
}

Ratio run_tinylfu(const std::vector<Req>& t, uint64_t cap, uint64_t keys, bool adaptive) {
  WeightedCache<uint64_t, uint32_t>::Options o;
  o.adaptive_window = adaptive;
  o.max_capacity = cap;
  o.shards = 16;
  o.estimated_entries = keys;
  WeightedCache<uint64_t, uint32_t> c(o);
  auto res = replay(t, [&](const Req& r) {
    if (c.touch(r.key)) return true;
    (void)c.insert(r.key, r.weight, r.weight);
    return false;
  });
  if (adaptive && std::getenv("FLUXON_CACHE_BENCH_VERBOSE")) {
    const auto a = c.adaptation();
    std::fprintf(stderr, "  window at the end %.2f; %llu changes in %llu epochs; 1 key in %llu simulated (%llu held)\n",
                 a.window_ratio, (unsigned long long)a.changes, (unsigned long long)a.epochs,
                 (unsigned long long)a.sample_rate, (unsigned long long)a.sim_entries);
  }
  return res;
}

Ratio run_lru(const std::vector<Req>& t, uint64_t cap) {
  Lru l(cap);
  return replay(t, [&](const Req& r) { return l.access(r.key, r.weight); });
}

class Zipf {
 public:
  Zipf(uint64_t n, double s) : cdf_(n) {
    double sum = 0;
    for (uint64_t i = 0; i < n; ++i) cdf_[i] = (sum += 1.0 / std::pow(double(i + 1), s));
    for (auto& c : cdf_) c /= sum;
  }
  uint64_t operator()(std::mt19937_64& rng) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return uint64_t(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

uint64_t scramble(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  return x;
}

std::vector<Req> zipf_trace(uint64_t keys, double s, size_t n, bool variable_sizes, uint64_t seed) {
  Zipf z(keys, s);
  std::mt19937_64 rng(seed);
  std::vector<Req> t(n);
  for (auto& r : t) {
    const uint64_t rank = z(rng);
    r.key = scramble(rank + 1);
    r.weight = variable_sizes ? uint32_t(4096 * (1 + scramble(rank) % 16)) : 4096;
  }
  return t;
}

// A hot set under Zipf, interrupted by long one-pass scans (the case where LRU collapses).
std::vector<Req> scan_trace(size_t n, uint64_t seed) {
  Zipf z(20000, 0.9);
  std::mt19937_64 rng(seed);
  std::vector<Req> t;
  uint64_t next_scan_key = 1ull << 40;
  while (t.size() < n) {
    for (int i = 0; i < 20000 && t.size() < n; ++i) t.push_back({scramble(z(rng) + 1), 4096});
    for (int i = 0; i < 30000 && t.size() < n; ++i) t.push_back({scramble(next_scan_key++), 4096});
  }
  return t;
}

// Multi-turn LLM serving: each request reads its session's prefix chain (shared system prompt
// pages first, then the session's own history) and appends new pages; sessions are picked with a
// skew toward recent ones. Page keys are chained hashes, as in SGLang's radix cache. A request is
// its pages in prefix order, each with the page before it (its parent); `reads` of them existed.
struct Page {
  uint64_t key, parent;  // parent 0: the first page of a prompt
  uint32_t depth;        // its index in the prompt (content_depths)
};
struct Request {
  std::vector<Page> pages;
  size_t reads = 0;  // the prefix that existed; the rest are new pages
};
constexpr uint32_t kLlmPage = 4718592;

std::vector<Request> llm_requests(size_t n, uint64_t seed, uint64_t* distinct_pages) {
  std::mt19937_64 rng(seed);
  const int prompts = 16, prompt_pages = 24;
  std::vector<std::vector<Page>> sessions;
  std::vector<Request> out;
  size_t pages = 0;
  uint64_t distinct = uint64_t(prompts) * prompt_pages;
  auto page_key = [](uint64_t parent, uint64_t salt) { return scramble(parent * 1000003 + salt + 1); };
  while (pages < n) {
    const bool fresh = sessions.empty() || rng() % 5 == 0;
    if (fresh) {
      std::vector<Page> s;
      const uint64_t p = rng() % prompts;
      uint64_t h = p + 7, parent = 0;
      for (int i = 0; i < prompt_pages; ++i) {
        h = page_key(h, i);
        s.push_back({h, parent, uint32_t(i)});
        parent = h;
      }
      sessions.push_back(std::move(s));
    }
    // Recent sessions are far more likely to continue.
    const size_t back = std::min<size_t>(sessions.size() - 1, size_t(std::exponential_distribution<double>(0.02)(rng)));
    auto& s = sessions[sessions.size() - 1 - back];
    Request r;
    r.pages = s;
    r.reads = s.size();
    const int fresh_pages = 1 + int(rng() % 24);
    for (int i = 0; i < fresh_pages; ++i) {
      const uint64_t k = page_key(s.back().key, rng());
      s.push_back({k, s.back().key, uint32_t(s.size())});
      r.pages.push_back(s.back());
      distinct++;
    }
    pages += r.pages.size();
    out.push_back(std::move(r));
  }
  *distinct_pages = distinct;
  return out;
}

// The same trace as page reads, each counted on its own.
std::vector<Req> llm_trace(size_t n, uint64_t seed, uint64_t* distinct_pages) {
  std::vector<Req> t;
  for (const auto& r : llm_requests(n, seed, distinct_pages))
    for (const auto& p : r.pages) t.push_back({p.key, kLlmPage});
  t.resize(n);
  return t;
}

// Prefix hits, as a restore counts them: a request's pages hit up to its first miss; from there on
// they are recomputed and stored again (a page still held is only touched). Byte-hit ratio, %.
template <class Cache>
double prefix_byte_hits(const std::vector<Request>& trace, Cache& c) {
  uint64_t hit = 0, all = 0;
  for (const auto& r : trace) {
    bool missed = false;
    for (size_t i = 0; i < r.pages.size(); ++i) {
      const Page& p = r.pages[i];
      all += kLlmPage;
      if (!missed && i < r.reads && c.touch(p.key)) {
        hit += kLlmPage;
        continue;
      }
      missed = true;
      if (!c.touch(p.key)) c.put(p);
    }
  }
  return 100.0 * double(hit) / double(all);
}

// Bounded LRU, and the bounded W-TinyLFU, for prefix_byte_hits.
struct LruCache {
  Lru l;
  bool touch(uint64_t k) { return l.access(k, 0, true); }
  void put(const Page& p) { (void)l.access(p.key, kLlmPage); }
};
struct TinyLfuCache {
  WeightedCache<uint64_t, uint32_t> c;
  bool touch(uint64_t k) { return c.touch(k); }
  void put(const Page& p) { (void)c.insert(p.key, 0, kLlmPage); }
};

// The owner's resident tier: an unbounded W-TinyLFU order that capacity pressure evicts from with
// evict_some_if (as Eviction::select does); prefix-aware, leaves first (PrefixChains) in the tier's
// order (as the owner does) or in recency order, then anything.
struct OwnerTier {
  WeightedCache<uint64_t, uint32_t> c;
  uint64_t cap;
  bool prefix_aware;
  WeightedCache<uint64_t, uint32_t>::Order order;
  PrefixChains<uint64_t> chains;
  uint64_t held = 0;
  bool touch(uint64_t k) { return c.touch(k); }
  void put(const Page& p) {
    const uint64_t k = p.key, parent = p.parent;
    (void)c.insert(k, 0, kLlmPage);
    held += kLlmPage;
    if (prefix_aware) chains.link(k, parent, parent != 0);
    if (held <= cap) return;
    std::vector<std::pair<uint64_t, uint32_t>> gone;
    uint64_t got = 0;
    if (prefix_aware)
      got = c.evict_some_if(held - cap, [&](const uint64_t& key, const uint32_t&) { return chains.is_leaf(key); }, &gone,
                            order);
    if (got < held - cap) got += c.evict_some_if(held - cap - got, [](const uint64_t&, const uint32_t&) { return true; }, &gone);
    held -= got;
    for (const auto& [key, v] : gone) chains.unlink(key);
  }
};

// The owner's prefix-depth order (eviction_order: prefix_depth; DepthOrder itself): what went stale
// (untouched while `turnover` capacities' worth was admitted) first, then the deepest pages, the
// least recently read of a depth first.
struct DepthTier {
  DepthOrder order;
  uint64_t cap;
  uint64_t held = 0;
  static std::string name(uint64_t k) { return std::string(reinterpret_cast<const char*>(&k), sizeof k); }
  bool touch(uint64_t k) {
    const std::string key = name(k);
    if (!order.contains(key)) return false;
    order.touch(key);
    return true;
  }
  void put(const Page& p) {
    order.admit(name(p.key), p.depth, kLlmPage);
    held += kLlmPage;
    if (held <= cap) return;
    std::vector<std::string> gone;
    uint64_t got = 0;
    order.visit([&](const std::string& key) {
      gone.push_back(key);
      got += kLlmPage;
      return got >= held - cap;
    });
    for (const auto& key : gone) order.erase(key);
    held -= got;
  }
};

// The offline bound: Belady's MIN (a page not read again goes first, then the one read again last;
// it sees the future) on the same sequence of page accesses, which no order changes - every page of
// every request is read or stored - counting every access that finds its page. MIN keeps the most
// of those any cache of this size can; a prefix hit is one of them, so no order's prefix byte-hit
// ratio passes this.
double belady_byte_hits(const std::vector<Request>& trace, uint64_t cap) {
  std::vector<size_t> next;  // per page read, in trace order: the index of that page's next read
  {
    std::vector<uint64_t> keys;
    for (const auto& r : trace)
      for (const auto& p : r.pages) keys.push_back(p.key);
    next.assign(keys.size(), SIZE_MAX);
    std::unordered_map<uint64_t, size_t> later;
    for (size_t i = keys.size(); i-- > 0;) {
      auto [it, fresh] = later.try_emplace(keys[i], i);
      if (!fresh) {
        next[i] = it->second;
        it->second = i;
      }
    }
  }
  std::set<std::pair<size_t, uint64_t>> by_next;  // next read, key: the last goes first
  std::unordered_map<uint64_t, size_t> held;      // key -> its next read
  uint64_t hit = 0, all = 0;
  size_t at = 0;
  for (const auto& r : trace) {
    for (size_t i = 0; i < r.pages.size(); ++i, ++at) {
      const uint64_t k = r.pages[i].key;
      all += kLlmPage;
      auto h = held.find(k);
      if (h != held.end()) {
        hit += kLlmPage;
        by_next.erase({h->second, k});
      }
      held[k] = next[at];
      by_next.insert({next[at], k});
      while (held.size() * kLlmPage > cap) {
        auto last = std::prev(by_next.end());
        held.erase(last->second);
        by_next.erase(last);
      }
    }
  }
  return 100.0 * double(hit) / double(all);
}

WeightedCache<uint64_t, uint32_t>::Options tier_options(uint64_t cap, uint64_t keys, bool bounded) {
  WeightedCache<uint64_t, uint32_t>::Options o;
  o.max_capacity = cap;
  o.enforce_capacity = bounded;
  o.shards = bounded ? 16 : 4;  // the owner's resident tier has 4 (local_index.cpp)
  o.estimated_entries = keys;
  return o;
}

// One trace at one capacity: LRU, W-TinyLFU with a fixed 1% window (Moka's policy), and with the
// adaptive window (ghost votes, weighted_cache.hpp); hit ratio, then byte-hit ratio; deltas against LRU.
std::string g_only;  // --only: rows whose trace name contains it
// --stale-turnovers A,B: the depth order's stale horizons in capacities (eviction_stale_turnover; 0:
// none): the owner's default 4, and none (every session lives on).
double g_stale[2] = {4, 0};

void row(const char* name, const char* size, const std::vector<Req>& t, uint64_t cap, uint64_t keys) {
  if (!g_only.empty() && std::string(name).find(g_only) == std::string::npos) return;
  const Ratio l = run_lru(t, cap), f = run_tinylfu(t, cap, keys, false), a = run_tinylfu(t, cap, keys, true);
  std::printf("%-25s %-5s %6.2f %6.2f %+6.2f %6.2f %+6.2f | %6.2f %6.2f %+6.2f %6.2f %+6.2f\n", name, size, l.hit, f.hit,
              f.hit - l.hit, a.hit, a.hit - l.hit, l.byte_hit, f.byte_hit, f.byte_hit - l.byte_hit, a.byte_hit,
              a.byte_hit - l.byte_hit);
}

double mops(std::function<void(int)> body, int threads, size_t ops_per_thread) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i) ts.emplace_back(body, i);
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return threads * ops_per_thread / s / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = 4000000;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--requests" && i + 1 < argc) n = std::stoull(argv[++i]);
    if (std::string(argv[i]) == "--stale-turnovers" && i + 1 < argc &&  // the two depth-order columns
        (std::sscanf(argv[++i], "%lf,%lf", &g_stale[0], &g_stale[1]) != 2 || g_stale[0] < 0 || g_stale[1] < 0)) {
      std::fprintf(stderr, "fluxon_cache_bench: --stale-turnovers takes A,B (capacities, >= 0; 0: none), not '%s'\n",
                   argv[i]);
      return 2;
    }
    if (std::string(argv[i]) == "--only" && i + 1 < argc) g_only = argv[++i];
  }
  const uint64_t keys = 1000000;
  std::printf("hit ratio | byte-hit ratio, %%, same capacity: LRU, W-TinyLFU fixed 1%% window, W-TinyLFU adaptive window\n");
  std::printf("%-25s %-5s %6s %6s %6s %6s %6s | %6s %6s %6s %6s %6s\n", "trace", "cache", "LRU", "fixed", "delta",
              "adapt", "delta", "LRU", "fixed", "delta", "adapt", "delta");
  for (double s : {0.9, 1.0, 1.1}) {
    auto t = zipf_trace(keys, s, n, false, 42);
    for (double frac : {0.01, 0.05, 0.10}) {
      const uint64_t cap = uint64_t(keys * frac) * 4096;
      char name[64], size[16];
      std::snprintf(name, sizeof name, "zipf %.1f, 1M keys", s);
      std::snprintf(size, sizeof size, "%.0f%%", frac * 100);
      row(name, size, t, cap, keys);
    }
  }
  {
    auto t = zipf_trace(keys, 1.0, n, true, 43);
    for (double frac : {0.01, 0.05, 0.10}) {
      const uint64_t cap = uint64_t(keys * frac * 8.5 * 4096);
      char size[24];
      std::snprintf(size, sizeof size, "%.0f%%", frac * 100);
      row("zipf 1.0, sizes 4-64 KiB", size, t, cap, keys);
    }
  }
  {
    auto t = scan_trace(n, 44);
    for (uint64_t entries : {5000, 10000}) {
      char size[24];
      std::snprintf(size, sizeof size, "%lluk", (unsigned long long)entries / 1000);
      row("hot set + scans", size, t, entries * 4096, 100000);
    }
  }
  {
    uint64_t distinct = 0;
    auto t = llm_trace(n, 45, &distinct);
    for (double frac : {0.01, 0.02, 0.05, 0.10, 0.20}) {
      const uint64_t cap = uint64_t(distinct * frac) * 4718592;
      char size[24];
      std::snprintf(size, sizeof size, "%.0f%%", frac * 100);
      row("LLM multi-turn prefix", size, t, cap, distinct);
    }
    std::printf("(LLM trace: %llu distinct 4.5 MiB pages in %zu page reads)\n", (unsigned long long)distinct,
                t.size());
  }
  if (g_only.empty() || std::string("LLM prefix hits").find(g_only) != std::string::npos) {
    // The same trace counted as restores count it (a request's pages hit up to its first miss):
    // LRU, the bounded W-TinyLFU, the owner's resident tier (unbounded W-TinyLFU, evict_some_if),
    // and that tier with prefix-aware eviction (leaves first). Seeds 45-49: the median, min, max.
    std::printf("\nLLM multi-turn prefix, prefix byte-hit ratio %% (hits up to a request's first miss), seeds 45-49 median [min, max];"
                " depth order stale A = %g, B = %g capacities (0: none):\n", g_stale[0], g_stale[1]);
    std::printf("%-6s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %s\n", "cache", "LRU", "W-TinyLFU",
                "owner tier", "owner, prefix-aware", "..., leaves by recency", "depth order, stale A",
                "depth order, stale B", "depth order, auto", "Belady MIN, any hit", "prefix-aware - LRU",
                "depth order A - LRU", "depth order auto - LRU, points");
    std::vector<std::vector<Request>> traces;
    std::vector<uint64_t> distincts;
    for (uint64_t seed : {45, 46, 47, 48, 49}) {
      uint64_t distinct = 0;
      traces.push_back(llm_requests(n, seed, &distinct));
      distincts.push_back(distinct);
    }
    for (double frac : {0.01, 0.02, 0.05, 0.10, 0.20}) {
      std::vector<double> col[9], delta, depth_delta, auto_delta;
      for (size_t i = 0; i < traces.size(); ++i) {
        const uint64_t cap = uint64_t(double(distincts[i]) * frac) * kLlmPage;
        LruCache lru{Lru(cap)};
        TinyLfuCache tl{WeightedCache<uint64_t, uint32_t>(tier_options(cap, distincts[i], true))};
        using O = WeightedCache<uint64_t, uint32_t>::Order;
        OwnerTier owner{WeightedCache<uint64_t, uint32_t>(tier_options(cap, distincts[i], false)), cap, false, O::kPolicy, {}, 0};
        OwnerTier prefix{WeightedCache<uint64_t, uint32_t>(tier_options(cap, distincts[i], false)), cap, true, O::kPolicy, {}, 0};
        OwnerTier recency{WeightedCache<uint64_t, uint32_t>(tier_options(cap, distincts[i], false)), cap, true, O::kRecency, {}, 0};
        col[0].push_back(prefix_byte_hits(traces[i], lru));
        col[1].push_back(prefix_byte_hits(traces[i], tl));
        col[2].push_back(prefix_byte_hits(traces[i], owner));
        col[3].push_back(prefix_byte_hits(traces[i], prefix));
        col[4].push_back(prefix_byte_hits(traces[i], recency));
        auto horizon = [&](double t) { return t > 0 ? uint64_t(t * double(cap)) : UINT64_MAX; };
        DepthTier depth{DepthOrder(horizon(g_stale[0])), cap}, depth_only{DepthOrder(horizon(g_stale[1])), cap};
        col[5].push_back(prefix_byte_hits(traces[i], depth));
        col[6].push_back(prefix_byte_hits(traces[i], depth_only));
        DepthTier depth_auto{DepthOrder(DepthOrder::kAdaptive), cap};
        col[7].push_back(prefix_byte_hits(traces[i], depth_auto));
        col[8].push_back(belady_byte_hits(traces[i], cap));
        delta.push_back(col[3].back() - col[0].back());
        depth_delta.push_back(col[5].back() - col[0].back());
        auto_delta.push_back(col[7].back() - col[0].back());
      }
      auto med = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        char b[64];
        std::snprintf(b, sizeof b, "%6.2f [%6.2f, %6.2f]", v[v.size() / 2], v.front(), v.back());
        return std::string(b);
      };
      std::printf("%-6.0f%% %-22s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %-22s %s\n", frac * 100,
                  med(col[0]).c_str(), med(col[1]).c_str(), med(col[2]).c_str(), med(col[3]).c_str(),
                  med(col[4]).c_str(), med(col[5]).c_str(), med(col[6]).c_str(), med(col[7]).c_str(),
                  med(col[8]).c_str(), med(delta).c_str(), med(depth_delta).c_str(), med(auto_delta).c_str());
      std::fflush(stdout);
    }
  }
  if (g_only.empty() || std::string("LLM multi-turn prefix").find(g_only) != std::string::npos) {
    // The small caches, where LRU is not optimal and the window moves, on other draws of the trace.
    std::printf("LLM trace, other seeds: adaptive byte-hit ratio - LRU's, points, at 1%% | 2%%:");
    for (uint64_t seed : {46, 47, 48, 49}) {
      uint64_t distinct = 0;
      auto t = llm_trace(n, seed, &distinct);
      double d[2];
      for (int i = 0; i < 2; ++i) {
        const uint64_t cap = uint64_t(distinct * (i + 1) / 100) * 4718592;
        d[i] = run_tinylfu(t, cap, distinct, true).byte_hit - run_lru(t, cap).byte_hit;
      }
      std::printf("  %+.3f | %+.3f", d[0], d[1]);
    }
    std::printf("\n");
  }

  if (!g_only.empty()) return 0;
  // get throughput on both cores, all hits, against a tbb::concurrent_hash_map lookup.
  const uint64_t tkeys = 1 << 20;
  const size_t ops = 4000000;
  WeightedCache<uint64_t, uint64_t>::Options o;
  o.max_capacity = tkeys * 64;
  o.shards = 64;
  o.estimated_entries = tkeys;
  WeightedCache<uint64_t, uint64_t> cache(o);
  tbb::concurrent_hash_map<uint64_t, uint64_t> map;
  for (uint64_t k = 0; k < tkeys; ++k) {
    (void)cache.insert(k, k, 1);
    map.insert({k, k});
  }
  std::vector<uint64_t> probe(ops);
  std::mt19937_64 rng(7);
  for (auto& p : probe) p = rng() % tkeys;
  const int threads = 2;
  std::vector<double> cr, mr;
  for (int rep = 0; rep < 5; ++rep) {
    mr.push_back(mops(
        [&](int t) {
          uint64_t sum = 0;
          for (size_t i = 0; i < ops; ++i) {
            tbb::concurrent_hash_map<uint64_t, uint64_t>::const_accessor a;
            if (map.find(a, probe[(i + t * 7919) % ops])) sum += a->second;
          }
          if (sum == 42) std::printf(" ");
        },
        threads, ops));
    cr.push_back(mops(
        [&](int t) {
          uint64_t sum = 0;
          for (size_t i = 0; i < ops; ++i) sum += *cache.get(probe[(i + t * 7919) % ops]);
          if (sum == 42) std::printf(" ");
        },
        threads, ops));
  }
  std::sort(cr.begin(), cr.end());
  std::sort(mr.begin(), mr.end());
  std::printf("\nget throughput, %d threads, 1M keys, all hits (median of 5):\n", threads);
  std::printf("  tbb::concurrent_hash_map find   %7.2f Mops/s\n", mr[2]);
  std::printf("  WeightedCache::get              %7.2f Mops/s   (%.2fx slower than the map)\n", cr[2], mr[2] / cr[2]);
  return 0;
}
