// fluxon_master_bench: the master's route table at scale — memory per route and PutDone/Lookup/
// BatchGetStart throughput through MasterCore, against a bare std::unordered_map<std::string,
// uint64_t> of the same keys in the same run. The master's side of each message is timed: decoding
// the request as it came off the wire, handling it and encoding the reply (the client built and
// encoded the request before, untimed). Every reply is checked.
//   build/tools/fluxon_master_bench [--keys N] [--kv-event-log N] [--json]   (default 2,000,000 keys;
//   the KV-event log at the master's default bound, 131,072 events; 0: off)
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <malloc.h>
#include <string>
#include <unordered_map>
#include <vector>

#include "fluxon/master/master_core.hpp"
#include "fluxon/runtime/config.hpp"

using namespace fluxon;

namespace {
bool g_json = false;
void say(const char* fmt, ...) {
  if (g_json) return;
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
}
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fluxon_master_bench: %s\n", what);
  std::exit(1);
}
// Bytes the allocator has handed out now (not RSS: freed memory stays in the heap and is reused).
uint64_t heap_bytes() {
  const auto mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}
using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
std::string key_of(uint64_t i) {  // SGLang-shaped: prefix, 64-hex page hash, model + rank + geometry suffix
  char buf[160];
  std::snprintf(buf, sizeof buf, "sglang:%016llx%016llx%016llx%016llx_Qwen-Qwen3-8B_0_2_layer_first_bfloat16_p64",
                (unsigned long long)(i * 0x9e3779b97f4a7c15ull), (unsigned long long)i,
                (unsigned long long)(i ^ 0xabcdef), (unsigned long long)(i * 31));
  return buf;
}
// ns per dependent load at random over 512 MiB (a pointer chase).
double random_load_ns() {
  const size_t lines = (size_t(512) << 20) / 64;
  std::vector<uint64_t> mem(lines * 8);
  std::vector<uint32_t> order(lines);
  for (size_t i = 0; i < lines; ++i) order[i] = uint32_t(i);
  uint64_t x = 88172645463325252ull;
  for (size_t i = lines - 1; i > 0; --i) {  // Fisher-Yates with xorshift
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::swap(order[i], order[x % (i + 1)]);
  }
  for (size_t i = 0; i < lines; ++i) mem[size_t(order[i]) * 8] = uint64_t(order[(i + 1) % lines]) * 8;
  const size_t steps = 3000000;
  uint64_t at = uint64_t(order[0]) * 8;
  const auto t = Clock::now();
  for (size_t i = 0; i < steps; ++i) at = mem[at];
  const double ns = secs(Clock::now() - t) * 1e9 / steps;
  if (at == ~0ull) std::puts("");  // keeps the chase
  return ns;
}
// The master's side of one request: decode, handle, encode the reply; returns the decoded reply.
std::unique_ptr<Envelope> serve(MasterCore& m, const Bytes& req, Clock::duration& spent) {
  const auto t = Clock::now();
  auto in = decode(req);
  if (!in.ok()) fail("a request did not decode");
  Bytes out = encode(m.handle(**in));
  spent += Clock::now() - t;
  auto rep = decode(out);
  if (!rep.ok()) fail("a reply did not decode");
  if ((*rep)->body.AsError()) fail(("the master answered an error: " + (*rep)->body.AsError()->message).c_str());
  return std::move(*rep);
}
}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 2000000, events = MasterConfig{}.kv_event_log_capacity;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--keys" && i + 1 < argc) n = std::stoull(argv[++i]);
    else if (std::string(argv[i]) == "--kv-event-log" && i + 1 < argc) events = std::stoull(argv[++i]);
    else if (std::string(argv[i]) == "--json") g_json = true;
    else fail("usage: fluxon_master_bench [--keys N] [--kv-event-log N] [--json]");
  }
  const uint64_t batch = 1024;
  say("master route table, %llu keys of %zu bytes, batches of %llu\n", (unsigned long long)n, key_of(0).size(),
      (unsigned long long)batch);

  // Baseline: a bare hash map of the same keys.
  uint64_t r0 = heap_bytes();
  double baseline_bytes = 0;
  {
    const auto t = Clock::now();
    std::unordered_map<std::string, uint64_t> m;
    m.reserve(n);
    for (uint64_t i = 0; i < n; ++i) m.emplace(key_of(i), i);
    baseline_bytes = double(heap_bytes() - r0) / n;
    say("  baseline unordered_map<string,u64>: %6.1f bytes/key, %6.2f M inserts/s\n", baseline_bytes,
        n / secs(Clock::now() - t) / 1e6);
  }

  MasterCore m;
  m.set_kv_events(events, 1);
  {
    wire::RegisterOwnerT r;
    r.node_id = 1;
    r.generation = 1;
    r.role = "sglang_owner";
    m.handle(*decode(encode(make_envelope(std::move(r)))).value());
  }
  r0 = heap_bytes();
  Clock::duration put_t{};
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
    auto rep = serve(m, encode(make_envelope(std::move(pd))), put_t);
    for (auto r : rep->body.AsPutDoneReply()->results)
      if (r != wire::PutItemResult::Live) fail("a route was not published");
  }
  const uint64_t mem = heap_bytes() - r0;
  if (m.route_count() != n) fail("routes missing after the publications");
  const double bytes_per_route = double(mem) / n, routes_per_s = n / secs(put_t);
  say("  MasterCore routes:                  %6.1f bytes/route (%.2fx the baseline), %6.2f M routes/s published\n",
      bytes_per_route, bytes_per_route / baseline_bytes, routes_per_s / 1e6);
  say("  projected for 100M routes: %.1f GiB\n", bytes_per_route * 1e8 / (1ull << 30));

  Clock::duration lookup_t{};
  uint64_t found = 0;
  for (uint64_t b = 0; b < n; b += batch) {
    wire::LookupT lk;
    for (uint64_t i = b; i < std::min(n, b + batch); ++i) lk.keys.push_back(key_of((i * 7919) % n));
    auto rep = serve(m, encode(make_envelope(std::move(lk))), lookup_t);
    for (auto& r : rep->body.AsLookupReply()->routes) found += r->found;
  }
  if (found != n) fail("a published route was not found");
  const double lookups_per_s = n / secs(lookup_t);
  say("  Lookup:                             %6.2f M keys/s (%llu found)\n", lookups_per_s / 1e6,
      (unsigned long long)found);
  // Churn: a tenth of the routes removed (RemoveRoutes: each leaves a tombstone) and as many new
  // ones published, batch by batch - a full master's steady state.
  Clock::duration churn_t{};
  const uint64_t churn = n / 10 / batch * batch;
  for (uint64_t b = 0; b < churn; b += batch) {
    wire::RemoveRoutesT rr;
    for (uint64_t i = b; i < b + batch; ++i) {
      auto it = std::make_unique<wire::RemoveRouteT>();
      it->key = key_of(i);
      it->node_id = 1;
      it->generation = 1;
      it->put_id = b / batch + 1;
      rr.items.push_back(std::move(it));
    }
    auto rrep = serve(m, encode(make_envelope(std::move(rr))), churn_t);
    for (bool removed : rrep->body.AsRemoveRoutesReply()->removed)
      if (!removed) fail("a route was not removed");
    wire::PutDoneT pd;
    pd.node_id = 1;
    pd.generation = 1;
    pd.put_id = (n + b) / batch + 1;
    for (uint64_t i = n + b; i < n + b + batch; ++i) {
      auto it = std::make_unique<wire::RouteItemT>();
      it->key = key_of(i);
      it->offset = i * 4096;
      it->len = 4718592;
      pd.items.push_back(std::move(it));
    }
    auto prep = serve(m, encode(make_envelope(std::move(pd))), churn_t);
    for (auto r : prep->body.AsPutDoneReply()->results)
      if (r != wire::PutItemResult::Live) fail("a route was not published while churning");
  }
  if (m.route_count() != n || m.tombstone_count() != churn) fail("the churn left the wrong routes or tombstones");
  const double churn_per_s = churn / secs(churn_t);
  say("  churn (RemoveRoutes + PutDone):     %6.2f M routes/s replaced (%llu tombstones now)\n", churn_per_s / 1e6,
      (unsigned long long)m.tombstone_count());
  // Remote gets from a second owner: BatchGetStart + BatchGetDone for every key.
  {
    wire::RegisterOwnerT r;
    r.node_id = 2;
    r.generation = 1;
    r.role = "sglang_owner";
    m.handle(make_envelope(std::move(r)));
  }
  Clock::duration get_t{};
  const uint64_t gets = std::min<uint64_t>(n - churn, 500000);
  for (uint64_t b = churn; b < churn + gets; b += batch) {
    wire::BatchGetStartT gs;
    wire::BatchGetDoneT gd;
    gs.node_id = gd.node_id = 2;
    gs.generation = gd.generation = 1;
    for (uint64_t i = b; i < std::min(churn + gets, b + batch); ++i) {
      gs.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, key_of(i), i + 1}));
      gd.items.push_back(std::make_unique<wire::GetDoneItemT>(wire::GetDoneItemT{{}, key_of(i), i + 1, i * 4096}));
    }
    serve(m, encode(make_envelope(std::move(gs))), get_t);
    serve(m, encode(make_envelope(std::move(gd))), get_t);
  }
  if (m.replica_count() != n + gets) fail("a remote get's replica was not published");
  const double gets_per_s = gets / secs(get_t);
  say("  BatchGetStart + BatchGetDone:       %6.2f M keys/s (%llu replicas now)\n", gets_per_s / 1e6,
      (unsigned long long)m.replica_count());
  // What one memory miss costs here: the table's work is mostly misses (the 2-core VM's are slow).
  const double miss_ns = random_load_ns();
  say("  baseline dependent random load over 512 MiB: %.0f ns\n", miss_ns);
  if (g_json)
    std::printf("{\"keys\": %llu, \"key_bytes\": %zu, \"bytes_per_route\": %.1f, \"baseline_bytes_per_key\": %.1f, "
                "\"routes_per_s\": %.0f, \"lookups_per_s\": %.0f, \"churn_routes_per_s\": %.0f, "
                "\"get_keys_per_s\": %.0f, \"random_load_ns\": %.0f}\n",
                (unsigned long long)n, key_of(0).size(), bytes_per_route, baseline_bytes, routes_per_s,
                lookups_per_s, churn_per_s, gets_per_s, miss_ns);
  return 0;
}
