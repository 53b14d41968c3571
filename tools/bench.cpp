// `fluxon bench CONFIG`: control-path and data-path figures through an external client (this
// process) against an owner process, each printed beside a baseline measured in the same run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "cluster.hpp"
#include "fluxon/actors/client.hpp"
#include "fluxon/client/kv_client.hpp"
#include "fluxon/runtime/channel.hpp"
#include "fluxon/runtime/segment.hpp"
#include "fluxon/runtime/transport.hpp"

namespace fluxon::tools {

namespace {

using Clock = std::chrono::steady_clock;

// The figures of this run (printed as one JSON object with --json; the text then goes to stderr).
std::map<std::string, double> g_fig;
FILE* g_out = stdout;
void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(g_out, fmt, ap);
  va_end(ap);
  std::fflush(g_out);  // a log file shows each line when it is measured, not at exit
}

// Baseline: a 1-byte ping-pong over a loopback TCP connection between two processes, p50 in µs.
double tcp_ping_pong_p50_us(int iters) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof(a);
  if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &al) != 0)
    return -1;
  pid_t child = ::fork();
  if (child == 0) {
    int c = ::accept(ls, nullptr, nullptr);
    int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char b;
    while (::recv(c, &b, 1, 0) == 1 && ::send(c, &b, 1, 0) == 1) {
    }
    ::_exit(0);
  }
  ::close(ls);
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<double> us;
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    char b = 1;
    for (int i = 0; i < iters; ++i) {
      auto t = Clock::now();
      if (::send(s, &b, 1, 0) != 1 || ::recv(s, &b, 1, 0) != 1) break;
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
    }
  }
  ::close(s);
  int st = 0;
  ::waitpid(child, &st, 0);
  if (us.empty()) return -1;
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}


double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

struct Pct {
  double p50, p99, mean;
};
Pct pct(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double sum = std::accumulate(v.begin(), v.end(), 0.0);
  return {v[v.size() / 2], v[std::min(v.size() - 1, size_t(v.size() * 0.99))], sum / v.size()};
}

struct BenchFailed {};  // a call failed: said on stderr, the bench ends with status 1

#define BENCH_OK(expr)                                                          \
  ({                                                                            \
    auto _r = (expr);                                                           \
    if (!_r.ok()) {                                                             \
      std::fprintf(stderr, "bench: %s: %s\n", #expr, _r.status().to_string().c_str()); \
      throw BenchFailed{};                                                      \
    }                                                                           \
    std::move(_r.value());                                                      \
  })

#define BENCH_CHECK(expr)                                                     \
  do {                                                                          \
    if (Status _s = (expr); !_s.is_ok()) {                                      \
      std::fprintf(stderr, "bench: %s: %s\n", #expr, _s.to_string().c_str());   \
      throw BenchFailed{};                                                      \
    }                                                                           \
  } while (0)

// Remote gets (L3): keys written through owner 1, read through owner 2, whose owner fetches them over
// the TCP data plane. Baselines from the same run: the raw data plane (a DataServer and TcpFetcher
// in this process over loopback, no Fluxon control path) and a local get of the same batch.
int bench_remote(const ClusterConfig& cluster, KvClient& a, const std::string& run, int iters) {
  ClusterConfig cfg = cluster;
  cfg.client.owner_address = cfg.owners.at(1).listen_host + ":" + std::to_string(cfg.owners.at(1).port);
  auto bc = BENCH_OK(open_client(cfg));
  auto& b = *bc;
  BENCH_OK(b.wait_local_segments_ready());
  say("\nremote gets: written through owner %u, read through owner %u (%s)\n", cfg.owners[0].node_id,
              cfg.owners[1].node_id, cfg.client.owner_address.c_str());
  // Control path: one small key, remote first read vs local second read of the same key.
  std::vector<double> remote_us, local_us;
  for (int it = 0; it < iters; ++it) {
    const std::vector<std::string> keys{"bench:" + run + ":rsmall:" + std::to_string(it)};
    uint64_t plan = BENCH_OK(a.local_fast_put_start(keys, 4096));
    BENCH_CHECK(BENCH_OK(a.local_fast_put_commit(plan)).result(30));
    for (int pass = 0; pass < 2; ++pass) {
      auto t = Clock::now();
      auto [h, r] = BENCH_OK(b.get_start(keys));
      uint64_t rp = BENCH_OK(b.get_transfer(h));
      (pass == 0 ? remote_us : local_us).push_back(us_since(t));
      BENCH_CHECK(b.release_views(rp));
      if (r.transferable_len != 1 || (pass == 0) != (r.leader_keys == 1)) {
        std::fprintf(stderr, "bench: remote get of one key: transferable %u, leaders %u\n", r.transferable_len,
                     r.leader_keys);
        return 1;
      }
    }
  }
  Pct rp = pct(remote_us), lp = pct(local_us);
  g_fig["remote_get_p50_us_b1"] = rp.p50;
  g_fig["remote_get_p99_us_b1"] = rp.p99;
  say("  1 x 4 KiB get_start+get_transfer: remote p50 %.1f us (p99 %.1f), local p50 %.1f us: %.2fx local\n",
              rp.p50, rp.p99, lp.p50, rp.p50 / lp.p50);
  // Data path: 32 x 4 MiB per round, fresh keys each round (each is a remote miss on owner 2).
  const size_t n = 32, len = 4 << 20;
  std::vector<uint8_t> src(n * len), dst(n * len);
  std::vector<double> raw_gbs, remote_gbs;
  // The raw data plane over loopback, same bytes, same batch shape, warm buffers.
  auto server = DataServer::start("127.0.0.1", 0, src.data(), src.size(), 1);
  if (!server.ok()) {
    std::fprintf(stderr, "bench: the raw data plane's server: %s\n", server.status().to_string().c_str());
    return 1;
  }
  TcpFetcher fetcher(10000);
  std::vector<double> raw_fresh_gbs, start_ms_v, transfer_ms_v;
  double cold_gbs = 0;
  for (int round = 0; round < 6; ++round) {
    for (size_t i = 0; i < src.size(); i += 4096) src[i] = uint8_t(i >> 12) ^ uint8_t(round * 3);
    std::vector<ReadRange> ranges;
    for (size_t k = 0; k < n; ++k) ranges.push_back(ReadRange{k * len, len, dst.data() + k * len});
    auto t = Clock::now();
    BENCH_CHECK(fetcher.read("127.0.0.1", (*server)->port(), 1, ranges));
    const double raw = n * len / (us_since(t) * 1e3);
    // The same fetch landing in memory never written before (as a remote get's new slots are):
    // what first writes into fresh pages cost on this machine.
    {
      std::unique_ptr<uint8_t[]> fresh(new uint8_t[n * len]);  // allocated, not touched
      std::vector<ReadRange> fr;
      for (size_t k = 0; k < n; ++k) fr.push_back(ReadRange{k * len, len, fresh.get() + k * len});
      t = Clock::now();
      BENCH_CHECK(fetcher.read("127.0.0.1", (*server)->port(), 1, fr));
      if (round > 0) raw_fresh_gbs.push_back(n * len / (us_since(t) * 1e3));
    }
    std::vector<std::string> keys;
    for (size_t k = 0; k < n; ++k) keys.push_back("bench:" + run + ":rdata:" + std::to_string(round) + ":" + std::to_string(k));
    uint64_t plan = BENCH_OK(a.local_fast_put_start(keys, len));
    auto* blob = reinterpret_cast<uint64_t*>(plan);
    for (size_t k = 0; k < n; ++k) std::memcpy(reinterpret_cast<void*>(blob[2 + k]), src.data() + k * len, len);
    BENCH_CHECK(BENCH_OK(a.local_fast_put_commit(plan)).result(30));
    t = Clock::now();
    auto [h, r] = BENCH_OK(b.get_start(keys));
    const double start_ms = us_since(t) / 1e3;
    auto t2 = Clock::now();
    uint64_t rplan = BENCH_OK(b.get_transfer(h));
    const double transfer_ms = us_since(t2) / 1e3;
    const double remote = n * len / (us_since(t) * 1e3);
    auto* rb = reinterpret_cast<uint64_t*>(rplan);
    for (size_t k = 0; k < n; ++k) std::memcpy(dst.data() + k * len, reinterpret_cast<void*>(rb[2 + k]), len);
    BENCH_CHECK(b.release_views(rplan));
    if (r.leader_keys != n || std::memcmp(src.data(), dst.data(), n * len) != 0) {
      std::fprintf(stderr, "bench: remote data round %d: %u leaders or a byte mismatch\n", round, r.leader_keys);
      return 1;
    }
    // A cache at steady state lands remote bytes in slots it used before: the round's keys go, so
    // the next round's slots are this one's (the baseline too reads into the buffer it used before).
    for (KvClient* c : {&a, &b}) {
      const uint64_t gone = BENCH_OK(c->remove_prefix("bench:" + run + ":rdata:" + std::to_string(round) + ":"));
      if (gone != n) {
        std::fprintf(stderr, "bench: remote data round %d: %llu of %zu keys removed\n", round, (unsigned long long)gone, n);
        return 1;
      }
    }
    if (round == 0) {  // fresh slots on both owners, fresh memory for the baseline
      cold_gbs = remote;
    } else {
      raw_gbs.push_back(raw);
      remote_gbs.push_back(remote);
      start_ms_v.push_back(start_ms);
      transfer_ms_v.push_back(transfer_ms);
    }
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  g_fig["raw_tcp_gbps"] = med(raw_gbs);
  g_fig["remote_get_gbps"] = med(remote_gbs);
  g_fig["raw_tcp_fresh_gbps"] = med(raw_fresh_gbs);
  g_fig["remote_get_start_ms"] = med(start_ms_v);
  g_fig["remote_get_transfer_ms"] = med(transfer_ms_v);
  g_fig["remote_get_cold_gbps"] = cold_gbs;
  say("  32 x 4 MiB, median of 5 rounds:\n");
  say("  baseline raw TCP data plane (loopback)  %7.2f GB/s into a warm buffer, %.2f GB/s into fresh memory\n",
      med(raw_gbs), med(raw_fresh_gbs));
  say("  remote get_start + get_transfer         %7.2f GB/s  (%.2fx raw) into slots used before\n", med(remote_gbs),
      med(remote_gbs) / med(raw_gbs));
  say("  first round, into slots never used      %7.2f GB/s  (%.2fx raw into fresh memory)\n", cold_gbs,
      cold_gbs / med(raw_fresh_gbs));
  say("  time split: get_start (the master's route, flights begun) %.1f ms, get_transfer (fetch and landing) %.1f ms\n",
      med(start_ms_v), med(transfer_ms_v));
  return 0;
}

}  // namespace

namespace {
int bench_body(const ClusterConfig& cluster, int argc, char** argv);
}  // namespace

// A failed call ends the bench, never the process: the caller still stops the cluster it started.
int run_bench(const ClusterConfig& cluster, int argc, char** argv) {
  try {
    return bench_body(cluster, argc, argv);
  } catch (const BenchFailed&) {
    return 1;
  }
}

namespace {
int bench_body(const ClusterConfig& cluster, int argc, char** argv) {
  int iters = 200, get_rounds = 1;
  std::vector<int> batches;
  bool json = false;
  std::string channel = "auto";
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (std::string(argv[i]) == "--json") json = true;
    else if (std::string(argv[i]) == "--batch" && i + 1 < argc) batches.push_back(std::atoi(argv[++i]));
    else if (std::string(argv[i]) == "--get-rounds" && i + 1 < argc) get_rounds = std::max(1, std::atoi(argv[++i]));
    else if (std::string(argv[i]) == "--channel" && i + 1 < argc) channel = argv[++i];
  }
  if (json) g_out = stderr;
  ClusterConfig cfg = cluster;
  cfg.client.channel = channel;
  cfg.client.owner_address = cfg.owners.at(0).listen_host + ":" + std::to_string(cfg.owners.at(0).port);
  auto client = BENCH_OK(open_client(cfg));
  auto& c = *client;
  BENCH_OK(c.wait_local_segments_ready());
  const std::string run = std::to_string(Clock::now().time_since_epoch().count());
  say("fluxon bench: external client pid %d -> owner %s, %d iterations per batch size\n", getpid(),
              cfg.client.owner_address.c_str(), iters);

  // Baselines: a raw loopback TCP ping-pong and a futex ping-pong between two processes; the CAF
  // round trip of a second client that does not use the channel; this client's own round trip
  // (ping: the transport, no owner state touched).
  auto ping_pct = [&](KvClient& k) {
    std::vector<double> rtt;
    for (int i = 0; i < iters * 2; ++i) {
      auto t = Clock::now();
      if (Status s = k.ping(); !s.is_ok()) {
        std::fprintf(stderr, "bench: ping: %s\n", s.to_string().c_str());
        throw BenchFailed{};
      }
      rtt.push_back(us_since(t));
    }
    return pct(rtt);
  };
  g_fig["tcp_rtt_p50_us"] = tcp_ping_pong_p50_us(iters * 2);
  g_fig["futex_rtt_p50_us"] = channel::futex_ping_pong_p50_us(iters * 2);
  {
    ClusterConfig ccfg = cfg;
    ccfg.client.channel = "caf";
    auto caf = BENCH_OK(open_client(ccfg));
    g_fig["caf_rtt_p50_us"] = ping_pct(*caf).p50;
  }
  Pct base = ping_pct(c);
  g_fig["rtt_p50_us"] = base.p50;
  say("\nbaselines: loopback TCP ping-pong p50 %.1f us, futex ping-pong p50 %.1f us, CAF ping p50 %.1f us\n",
      g_fig["tcp_rtt_p50_us"], g_fig["futex_rtt_p50_us"], g_fig["caf_rtt_p50_us"]);
  say("this client's transport (client.channel: %s) round trip (ping): p50 %.1f us  p99 %.1f us\n", channel.c_str(),
      base.p50, base.p99);
  if (batches.empty()) batches = {1, 64, 128};
  {
    // Warm-up, as on an owner that has served a while: the slots the calls below use are carved,
    // written once and faulted in before they are timed (the owner faults a new grant in on a
    // thread of its own; on a 2-core VM that took the cores from the first thousands of calls).
    // The keys are removed again: their slots are what the measured puts get.
    const auto t = Clock::now();
    size_t n = 0;
    for (int b : batches) n += size_t(iters) * size_t(b);
    std::vector<KvFuture> warm;
    for (size_t done = 0; done < n;) {
      std::vector<std::string> keys;
      for (; keys.size() < 128 && done < n; ++done) keys.push_back("bench:" + run + ":warm:" + std::to_string(done));
      uint64_t plan = BENCH_OK(c.local_fast_put_start(keys, 4096));
      warm.push_back(BENCH_OK(c.local_fast_put_commit(plan)));
    }
    for (auto& f : warm)
      if (Status s = f.result(60); !s.is_ok()) {
        std::fprintf(stderr, "bench: warm-up put: %s\n", s.to_string().c_str());
        return 1;
      }
    BENCH_OK(c.remove_prefix("bench:" + run + ":warm:"));
    for (;;) {
      auto st = BENCH_OK(c.stats());
      if (st["populate_backlog_bytes"] == 0 && st["slots_committed"] == 0) break;
      if (us_since(t) > 120e6) {
        std::fprintf(stderr, "bench: the owner's warm-up did not end in 120 s (backlog %llu bytes)\n",
                     (unsigned long long)st["populate_backlog_bytes"]);
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    g_fig["warmup_s"] = us_since(t) / 1e6;
    say("warm-up: %zu slots of 4 KiB carved, written, removed and faulted in: %.1f s\n", n, g_fig["warmup_s"]);
  }
  say("\n%-6s %-34s %10s %10s %12s %10s\n", "batch", "call", "p50 us", "p99 us", "keys/s", "p50/rtt");
  for (int batch : batches) {
    // Per call, as the design reports them, and per pair (the unit of work of a put or a get).
    std::vector<double> ps, pc, gs, gt, rv, put, get;
    std::vector<KvFuture> futs;
    double put_total = 0, get_total = 0;
    // The puts first, then the gets of what they wrote once it is live: a hit reads a value stored
    // before, not one whose publication is still on its way through the owner and the master.
    std::vector<std::vector<std::string>> all_keys(static_cast<size_t>(iters));
    for (int it = 0; it < iters; ++it) {
      std::vector<std::string>& keys = all_keys[size_t(it)];
      for (int k = 0; k < batch; ++k)
        keys.push_back("bench:" + run + ":" + std::to_string(batch) + ":" + std::to_string(it) + ":" + std::to_string(k));
      auto t = Clock::now();
      uint64_t plan = BENCH_OK(c.local_fast_put_start(keys, 4096));
      ps.push_back(us_since(t));
      auto t2 = Clock::now();
      futs.push_back(BENCH_OK(c.local_fast_put_commit(plan)));
      pc.push_back(us_since(t2));
      put.push_back(us_since(t));
      put_total += put.back();
    }
    for (auto& f : futs)
      if (Status s = f.result(30); !s.is_ok()) {
        std::fprintf(stderr, "bench: future: %s\n", s.to_string().c_str());
        return 1;
      }
    for (int it = 0; it < iters * get_rounds; ++it) {  // hits read the same values again, round after round
      const std::vector<std::string>& keys = all_keys[size_t(it % iters)];
      auto t = Clock::now();
      auto [h, r] = BENCH_OK(c.get_start(keys));
      gs.push_back(us_since(t));
      auto t2 = Clock::now();
      uint64_t rp = BENCH_OK(c.get_transfer(h));
      gt.push_back(us_since(t2));
      t2 = Clock::now();
      BENCH_CHECK(c.release_views(rp));
      rv.push_back(us_since(t2));
      get.push_back(us_since(t));
      get_total += get.back();
      if (r.transferable_len != uint32_t(batch)) {
        std::fprintf(stderr, "bench: local get missed (%u of %d)\n", r.transferable_len, batch);
        return 1;
      }
    }
    auto line = [&](const char* what, const std::vector<double>& v, double total) {
      Pct p = pct(v);
      say("%-6d %-34s %10.1f %10.1f %12s %10.2f\n", batch, what, p.p50, p.p99,
                  total > 0 ? std::to_string(int64_t(double(batch) * double(v.size()) / (total / 1e6))).c_str() : "", p.p50 / base.p50);
    };
    line("local_fast_put_start", ps, 0);
    line("local_fast_put_commit (local-ready)", pc, 0);
    line("  put pair", put, put_total);
    line("get_start", gs, 0);
    line("get_transfer (InlineLocal)", gt, 0);
    line("release_views (batched ack)", rv, 0);
    line("  get triple", get, get_total);
    const std::string b = std::to_string(batch);
    g_fig["local_get_p50_us_b" + b] = pct(get).p50;
    g_fig["local_get_p99_us_b" + b] = pct(get).p99;
    g_fig["put_p50_us_b" + b] = pct(put).p50;
    g_fig["put_p99_us_b" + b] = pct(put).p99;
    g_fig["put_keys_per_s_b" + b] = batch * iters / (put_total / 1e6);
    g_fig["get_keys_per_s_b" + b] = batch * iters * get_rounds / (get_total / 1e6);
  }

  // Data path: 64 x 4 MiB written into the put plan with memcpy, committed, read back via a get plan.
  // The same 64 keys are rewritten every round (reject_if_exist_same_key=false): each new version
  // supersedes the old one, whose slots return to the pool, as in a cache at steady state. Round 0
  // touches fresh memory (cold); rounds 1..5 reuse slots (warm).
  const size_t n = 64, len = 4 << 20;
  std::vector<uint8_t> src(n * len), dst(n * len);
  std::vector<std::string> keys;
  for (size_t k = 0; k < n; ++k) keys.push_back("bench:" + run + ":data:" + std::to_string(k));
  PutOptionalArgs overwrite;
  overwrite.reject_if_exist_same_key = false;
  std::vector<double> base_gbs, shm_gbs, shm_out_gbs, put_gbs, get_gbs;
  double cold_put = 0, cold_get = 0;
  // The same kind of memory as the segment: shared memory (shmem), mapped with MADV_HUGEPAGE as
  // segments are, written once before the rounds (warm, as the segment's reused slots are).
  void* shm = ::mmap(nullptr, n * len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) {
    std::perror("bench: mmap of the shared-memory baseline buffer");
    return 1;
  }
  (void)::madvise(shm, n * len, MADV_HUGEPAGE);
  std::memset(shm, 1, n * len);
  for (int round = 0; round < 6; ++round) {
    for (size_t i = 0; i < src.size(); i += 4096) src[i] = uint8_t(i >> 12) ^ uint8_t(round);
    auto t = Clock::now();
    std::memcpy(dst.data(), src.data(), n * len);
    const double base = n * len / (us_since(t) * 1e3);
    t = Clock::now();
    std::memcpy(shm, src.data(), n * len);
    const double base_shm = n * len / (us_since(t) * 1e3);
    t = Clock::now();
    std::memcpy(dst.data(), shm, n * len);
    const double base_shm_out = n * len / (us_since(t) * 1e3);
    t = Clock::now();
    uint64_t plan = BENCH_OK(c.local_fast_put_start(keys, len, overwrite));
    auto* blob = reinterpret_cast<uint64_t*>(plan);
    for (size_t k = 0; k < n; ++k) std::memcpy(reinterpret_cast<void*>(blob[2 + k]), src.data() + k * len, len);
    auto fut = BENCH_OK(c.local_fast_put_commit(plan));
    const double put = n * len / (us_since(t) * 1e3);
    BENCH_CHECK(fut.result(30));
    t = Clock::now();
    auto [h, r] = BENCH_OK(c.get_start(keys));
    uint64_t rp = BENCH_OK(c.get_transfer(h));
    auto* rb = reinterpret_cast<uint64_t*>(rp);
    for (size_t k = 0; k < n; ++k) std::memcpy(dst.data() + k * len, reinterpret_cast<void*>(rb[2 + k]), len);
    BENCH_CHECK(c.release_views(rp));
    const double get = n * len / (us_since(t) * 1e3);
    if (std::memcmp(src.data(), dst.data(), n * len) != 0) {
      std::fprintf(stderr, "bench: data mismatch in round %d\n", round);
      return 1;
    }
    if (round == 0) {
      cold_put = put;
      cold_get = get;
    } else {
      base_gbs.push_back(base);
      shm_gbs.push_back(base_shm);
      shm_out_gbs.push_back(base_shm_out);
      put_gbs.push_back(put);
      get_gbs.push_back(get);
    }
    // Let the superseded versions' routes go so that their slots are free for the next round.
    for (int w = 0; w < 1000; ++w) {
      auto st = BENCH_OK(c.stats());
      if (st["publish_jobs"] == 0 && st["holders"] == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  ::munmap(shm, n * len);
  g_fig["memcpy_gbps"] = med(base_gbs);
  g_fig["memcpy_shm_gbps"] = med(shm_gbs);
  g_fig["memcpy_from_shm_gbps"] = med(shm_out_gbs);
  g_fig["data_put_gbps"] = med(put_gbs);
  g_fig["data_get_gbps"] = med(get_gbs);
  {
    auto segs = BENCH_OK(c.wait_local_segments_ready());
    const MappingPages pg = mapping_pages(reinterpret_cast<void*>(segs.at(0).write_ptr));
    g_fig["segment_page_bytes"] = double(pg.effective_page_bytes(segs.at(0).len));
    g_fig["segment_huge_bytes"] = double(pg.huge_bytes);
  }
  say("\ndata path, 64 x 4 MiB, warm slots, median of 5 rounds:\n");
  say("  baseline single-thread memcpy         %7.2f GB/s\n", med(base_gbs));
  say("  baseline memcpy into / out of warm shared memory (the segment's kind) %.2f / %.2f GB/s\n", med(shm_gbs),
      med(shm_out_gbs));
  say("  put_start + memcpy in + commit        %7.2f GB/s  (%.2fx memcpy, %.2fx into shared memory)\n",
      med(put_gbs), med(put_gbs) / med(base_gbs), med(put_gbs) / med(shm_gbs));
  say("  get_start + transfer + memcpy out     %7.2f GB/s  (%.2fx memcpy, %.2fx out of shared memory)\n",
      med(get_gbs), med(get_gbs) / med(base_gbs), med(get_gbs) / med(shm_out_gbs));
  say("  cold round (fresh memory, page faults): put %.2f GB/s, get %.2f GB/s\n", cold_put, cold_get);
  say("  segment pages: %.0f bytes\n", g_fig["segment_page_bytes"]);
  int rc = cfg.owners.size() >= 2 ? bench_remote(cfg, c, run, iters) : 0;
  if (json && rc == 0) {
    std::printf("{");
    const char* sep = "";
    for (const auto& [k, v] : g_fig) {
      std::printf("%s\"%s\": %.6g", sep, k.c_str(), v);
      sep = ", ";
    }
    std::printf("}\n");
  }
  return rc;
}

}  // namespace
}  // namespace fluxon::tools
