// `fluxon demo`: a short hostless workload that prints what it did.
#include <chrono>
#include <cstdio>
#include <cstring>

#include "cluster.hpp"
#include "fluxon/actors/client.hpp"
#include "fluxon/client/kv_client.hpp"

namespace fluxon::tools {

static int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "demo: %s failed: %s\n", what, s.to_string().c_str());
  return 1;
}

int run_demo(const ClusterConfig& cfg, bool all_stats) {
  auto client = open_client(cfg);
  if (!client.ok()) return fail("connect", client.status());
  auto& c = **client;
  auto segs = c.wait_local_segments_ready();
  if (!segs.ok()) return fail("wait_local_segments_ready", segs.status());
  for (auto& s : *segs)
    std::printf("segment %s: %llu bytes at 0x%llx, node %u, generation %llu\n", s.segment_label.c_str(),
                (unsigned long long)s.len, (unsigned long long)s.write_ptr, s.node_id,
                (unsigned long long)s.generation);

  // Three radix nodes of 4 pages each, one atomic group per node, 64 KiB per page.
  const int64_t value_len = 64 << 10;
  const std::string session = "demo-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  std::vector<std::string> all;
  for (int node = 0; node < 3; ++node) {
    std::vector<std::string> keys;
    for (int p = 0; p < 4; ++p) keys.push_back(session + ":page-" + std::to_string(node * 4 + p));
    PutOptionalArgs opts;
    opts.atomic_group_lens = std::vector<uint32_t>{4};
    auto plan = c.local_fast_put_start(keys, value_len, opts);
    if (!plan.ok()) return fail("local_fast_put_start", plan.status());
    auto* blob = reinterpret_cast<uint64_t*>(*plan);
    for (uint64_t i = 0; i < blob[1]; ++i)
      std::memset(reinterpret_cast<void*>(blob[2 + i]), int('A' + node * 4 + i), value_len);
    auto fut = c.local_fast_put_commit(*plan);
    if (!fut.ok()) return fail("local_fast_put_commit", fut.status());
    auto t0 = std::chrono::steady_clock::now();
    Status live = fut->result(10);
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    if (!live.is_ok()) return fail("KvFuture", live);
    std::printf("put node %d: 4 pages x %lld bytes written through plan 0x%llx, routes live after %lld us\n", node,
                (long long)value_len, (unsigned long long)*plan, (long long)us);
    all.insert(all.end(), keys.begin(), keys.end());
  }
  // A request that extends the history by one node that was never written.
  for (int p = 12; p < 16; ++p) all.push_back(session + ":page-" + std::to_string(p));
  auto gs = c.get_start(all, true, std::vector<uint32_t>{4, 4, 4, 4});
  if (!gs.ok()) return fail("get_start", gs.status());
  auto& [handle, r] = *gs;
  std::printf("get_start 16 keys: raw_prefix_hit_len=%u transferable_len=%u prefix_hit_groups=%u "
              "first_miss_index=%d first_miss_group_index=%d all_hit=%s\n",
              r.raw_prefix_hit_len, r.transferable_len, r.prefix_hit_groups,
              r.first_miss_index ? int(*r.first_miss_index) : -1,
              r.first_miss_group_index ? int(*r.first_miss_group_index) : -1, r.all_hit ? "true" : "false");
  auto plan = c.get_transfer(handle, 8);
  if (!plan.ok()) return fail("get_transfer", plan.status());
  auto* blob = reinterpret_cast<uint64_t*>(*plan);
  uint64_t verified = 0;
  for (uint64_t i = 0; i < blob[1]; ++i) {
    auto* p = reinterpret_cast<const uint8_t*>(blob[2 + i]);
    for (int64_t b = 0; b < value_len; ++b)
      if (p[b] != uint8_t('A' + i)) return fail("verify", Status(Code::kInternal, "byte mismatch"));
    verified += value_len;
  }
  std::printf("get_transfer consumed 8 of 12 transferable pages (2 groups); verified %llu bytes; tail released\n",
              (unsigned long long)verified);
  if (Status s = c.release_views(*plan); !s.is_ok()) return fail("release_views", s);
  auto st = c.stats();
  if (!st.ok()) return fail("stats", st.status());
  auto at = [&](const char* k) -> unsigned long long {
    auto it = st->find(k);
    return it == st->end() ? 0 : it->second;
  };
  if (all_stats) {
    std::printf("stats:");
    for (auto& [k, v] : *st) std::printf(" %s=%llu", k.c_str(), (unsigned long long)v);
    std::printf("\n");
  } else {
    std::printf("owner: %llu keys put, %llu read (%llu hits), %llu slots committed, %llu free, %llu errors "
                "(every figure: fluxon demo --stats)\n",
                at("put_keys_total"), at("get_keys_total"), at("get_hit_keys_total"), at("slots_committed"),
                at("slots_free"), at("errors_total"));
  }
  std::printf("demo: ok\n");
  return 0;
}

}  // namespace fluxon::tools
