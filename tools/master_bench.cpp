// fluxon_master_bench: the master's route table at scale — memory per route and PutDone/Lookup/
// BatchGetStart throughput through MasterCore (codec included: messages are encoded and decoded as on
// the wire), against a bare std::unordered_map<std::string, uint64_t> of the same keys in the same run.
//   build/tools/fluxon_master_bench [--keys N]   (default 2,000,000)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <malloc.h>
#include <string>
#include <unordered_map>

#include "fluxon/core/master_core.hpp"

using namespace fluxon;

namespace {
// Bytes the allocator has handed out now (not RSS: freed memory stays in the heap and is reused).
uint64_t rss_bytes() { return mallinfo2().uordblks + mallinfo2().hblkhd; }
double secs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
std::string key_of(uint64_t i) {  // SGLang-shaped: prefix, 64-hex page hash, model + TP suffix
  char buf[128];
  std::snprintf(buf, sizeof buf, "sglang:%016llx%016llx%016llx%016llx_agent-model_0_2", (unsigned long long)(i * 0x9e3779b97f4a7c15ull),
                (unsigned long long)i, (unsigned long long)(i ^ 0xabcdef), (unsigned long long)(i * 31));
  return buf;
}
}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 2000000;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--keys" && i + 1 < argc) n = std::stoull(argv[++i]);
  const uint64_t batch = 1024;
  std::printf("master route table, %llu keys of %zu bytes, PutDone batches of %llu\n", (unsigned long long)n,
              key_of(0).size(), (unsigned long long)batch);

  // Baseline: a bare hash map of the same keys.
  uint64_t r0 = rss_bytes();
  auto t = std::chrono::steady_clock::now();
  {
    std::unordered_map<std::string, uint64_t> m;
    m.reserve(n);
    for (uint64_t i = 0; i < n; ++i) m.emplace(key_of(i), i);
    const double s = secs(t);
    const uint64_t mem = rss_bytes() - r0;
    std::printf("  baseline unordered_map<string,u64>: %6.1f bytes/key, %6.2f M inserts/s\n", double(mem) / n,
                n / s / 1e6);
  }

  MasterCore m;
  {
    wire::RegisterOwnerT r;
    r.node_id = 1;
    r.generation = 1;
    r.role = "sglang_owner";
    m.handle(*decode(encode(make_envelope(std::move(r)))).value());
  }
  r0 = rss_bytes();
  t = std::chrono::steady_clock::now();
  for (uint64_t b = 0; b < n; b += batch) {
    wire::PutDoneT pd;
    pd.node_id = 1;
    pd.generation = 1;
    pd.put_id = b / batch + 1;
    for (uint64_t i = b; i < std::min(n, b + batch); ++i) {
      auto it = std::make_unique<wire::RouteItemT>();
      it->key = key_of(i);
      it->offset = i * 4096;
      it->len = 4718592;
      pd.items.push_back(std::move(it));
    }
    auto req = decode(encode(make_envelope(std::move(pd))));
    auto rep = m.handle(**req);
    (void)encode(rep);
  }
  const double put_s = secs(t);
  const uint64_t mem = rss_bytes() - r0;
  std::printf("  MasterCore routes:                  %6.1f bytes/route, %6.2f M routes/s published (PutDone)\n",
              double(mem) / n, n / put_s / 1e6);
  std::printf("  projected for 100M routes: %.1f GiB\n", double(mem) / n * 1e8 / (1ull << 30));

  t = std::chrono::steady_clock::now();
  uint64_t found = 0;
  for (uint64_t b = 0; b < n; b += batch) {
    wire::LookupT lk;
    for (uint64_t i = b; i < std::min(n, b + batch); ++i) lk.keys.push_back(key_of((i * 7919) % n));
    auto rep = m.handle(**decode(encode(make_envelope(std::move(lk)))));
    for (auto& r : rep.body.AsLookupReply()->routes) found += r->found;
  }
  std::printf("  Lookup:                             %6.2f M keys/s (%llu found)\n", n / secs(t) / 1e6,
              (unsigned long long)found);
  // Remote gets from a second owner: BatchGetStart + BatchGetDone for every key.
  {
    wire::RegisterOwnerT r;
    r.node_id = 2;
    r.generation = 1;
    r.role = "sglang_owner";
    m.handle(make_envelope(std::move(r)));
  }
  t = std::chrono::steady_clock::now();
  const uint64_t gets = std::min<uint64_t>(n, 500000);
  for (uint64_t b = 0; b < gets; b += batch) {
    wire::BatchGetStartT gs;
    wire::BatchGetDoneT gd;
    gs.node_id = gd.node_id = 2;
    gs.generation = gd.generation = 1;
    for (uint64_t i = b; i < std::min(gets, b + batch); ++i) {
      gs.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, key_of(i), i + 1}));
      gd.items.push_back(std::make_unique<wire::GetDoneItemT>(wire::GetDoneItemT{{}, key_of(i), i + 1, i * 4096}));
    }
    m.handle(**decode(encode(make_envelope(std::move(gs)))));
    m.handle(**decode(encode(make_envelope(std::move(gd)))));
  }
  std::printf("  BatchGetStart + BatchGetDone:       %6.2f M keys/s (%llu replicas now)\n", gets / secs(t) / 1e6,
              (unsigned long long)m.replica_count());
  return 0;
}
