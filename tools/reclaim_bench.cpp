// fluxon_reclaim_bench: capacity evictions per second through the fenced reclaim transaction
// (Fence, local Prepare and release, Commit: two master round trips per cohort) against the direct
// route removal the owner used before (one RemoveRoutes per key, the slot freed on its answer), in
// the same run, on the same owner and master cores. Every message is encoded and decoded as on the
// wire; the network itself is not in it (a loopback round trip is ~20-50 us: see `fluxon bench`).
//   build/tools/fluxon_reclaim_bench [--keys N] [--cohort G] [--reps R]   (defaults 16384, 4, 5)
//   build/tools/fluxon_reclaim_bench --puts [--keys N] [--reps R]: the put path alone (put_start,
//   commit, the publication and its answer; batches of 128 keys as `fluxon bench` puts them)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "fluxon/master/master_core.hpp"
#include "fluxon/owner/owner_core.hpp"

using namespace fluxon;

namespace {

double secs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

Envelope wire_copy(const Envelope& e) {
  auto bytes = encode(e);
  auto d = decode(bytes.data(), bytes.size());
  if (!d.ok()) {
    std::fprintf(stderr, "decode failed: %s\n", d.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(*d.value());
}

// One owner and the master; requests delivered at once, in order, through the codec.
struct Pair {
  MasterCore m;
  OwnerCore o;
  uint64_t session = 0, next = 1, master_requests = 0;
  Millis now = 0;
  std::vector<Envelope> replies;

  static OwnerCoreConfig config(uint64_t slots, double watermark) {
    OwnerCoreConfig c;
    c.node_id = 1;
    c.grant_bytes = 1 << 20;
    c.eviction_free_watermark = watermark;
    c.eviction_interval_ms = 0;
    c.eviction_max_bytes_per_round = slots * 4096;
    c.limits.reclaims = slots;
    c.limits.remove_jobs = slots;
    c.hard_timeout_ms = 1u << 30;
    return c;
  }
  explicit Pair(uint64_t slots, double watermark = 0) : o(config(slots, watermark), 1, "bench", ((slots * 4096 + (1 << 20) - 1) >> 20) << 20) {
    Outbox out;
    o.start(now, out);
    absorb(out);
    Envelope hello = make_envelope(wire::HelloT{});
    session = request(std::move(hello)).body.AsHelloReply()->session_id;
  }
  void absorb(Outbox& out) {
    // Breadth first: the replies a step causes are handled after the step's other requests.
    std::vector<OwnerOut> queue;
    for (auto& x : out) queue.push_back(std::move(x));
    for (size_t i = 0; i < queue.size(); ++i) {
      auto& x = queue[i];
      if (x.kind == OwnerOut::Kind::kReply) {
        replies.push_back(std::move(x.env));
        continue;
      }
      if (x.kind != OwnerOut::Kind::kMaster) continue;
      master_requests++;
      Envelope rep = wire_copy(m.handle(wire_copy(x.env), now));
      Outbox more;
      o.on_master_reply(x.token, rep, now, more);
      for (auto& y : more) queue.push_back(std::move(y));
    }
  }
  Envelope request(Envelope req) {
    req.session_id = session;
    replies.clear();
    Outbox out;
    o.on_client_request(next++, req, now, out);
    absorb(out);
    if (replies.empty()) {
      std::fprintf(stderr, "no reply to %s\n", body_name(req));
      std::exit(1);
    }
    return std::move(replies.back());
  }
  void fill(const std::string& prefix, uint64_t keys, uint32_t cohort, bool grouped = true) {
    for (uint64_t b = 0; b < keys / cohort; ++b) {
      wire::PutStartReqT p;
      for (uint32_t i = 0; i < cohort; ++i) p.keys.push_back(prefix + std::to_string(b * cohort + i));
      p.value_len = 4096;
      if (grouped) p.atomic_group_lens = {cohort};
      auto r = request(make_envelope(std::move(p)));
      if (!r.body.AsPutStartReply()) {
        std::fprintf(stderr, "put_start failed: %s\n", envelope_status(r).to_string().c_str());
        std::exit(1);
      }
      if (!request(make_envelope(wire::PutCommitReqT{{}, r.body.AsPutStartReply()->put_id})).body.AsPutCommitReply()) {
        std::fprintf(stderr, "put_commit failed\n");
        std::exit(1);
      }
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t keys = 16384, reps = 5;
  uint32_t cohort = 4;
  bool puts = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--puts") puts = true;
    else if (i + 1 == argc) break;
    else if (a == "--keys") keys = std::stoull(argv[++i]);
    else if (a == "--cohort") cohort = uint32_t(std::stoul(argv[++i]));
    else if (a == "--reps") reps = std::stoull(argv[++i]);
  }
  if (puts) {  // the owner's and master's cores for a put, codec included: no transport, no clock
    std::vector<double> rates;
    keys -= keys % 128;
    for (uint64_t rep = 0; rep < reps; ++rep) {
      Pair p(keys);
      const auto t = std::chrono::steady_clock::now();
      p.fill("bench:put:128:" + std::to_string(rep) + ":", keys, 128, false);
      const double s = secs(t);
      if (p.m.route_count() != keys || p.o.pool().counts().committed != keys) {
        std::fprintf(stderr, "put run incomplete: %zu routes\n", p.m.route_count());
        return 1;
      }
      rates.push_back(keys / s);
    }
    std::sort(rates.begin(), rates.end());
    std::printf("put path, batches of 128 x 4 KiB, owner + master cores with the codec: %.0f keys/s = %.2f us/key "
                "(median of %llu)\n", rates[rates.size() / 2], 1e6 / rates[rates.size() / 2], (unsigned long long)reps);
    return 0;
  }
  keys -= keys % cohort;
  std::printf("capacity eviction of %llu keys in cohorts of %u, owner and master cores, codec included\n",
              (unsigned long long)keys, cohort);
  std::vector<double> direct, txn;
  for (uint64_t rep = 0; rep < reps; ++rep) {
    {  // Baseline: direct removal, route first, one RemoveRoutes per key.
      Pair p(keys);
      p.fill("d", keys, cohort);
      const uint64_t before = p.m.route_count();
      const auto t = std::chrono::steady_clock::now();
      for (uint64_t i = 0; i < keys; ++i) {
        Outbox out;
        p.o.remove_key("d" + std::to_string(i), p.now, out);
        p.absorb(out);
      }
      const double s = secs(t);
      if (before != keys || p.m.route_count() != 0 || p.o.pool().counts().committed != 0) {
        std::fprintf(stderr, "direct removal left %zu routes\n", p.m.route_count());
        return 1;
      }
      direct.push_back(keys / s);
    }
    {  // The transaction: a pressure round whose watermark wants every slot free reclaims every cohort.
      Pair p(keys, 1.0);
      p.fill("t", keys, cohort);
      const auto t = std::chrono::steady_clock::now();
      Outbox tick;
      p.o.tick(++p.now, tick);  // the pressure round: selection, Fence, Prepare, release, Commit
      p.absorb(tick);
      const double s = secs(t);
      const auto& c = p.o.counters();
      if (p.m.route_count() != 0 || c.reclaim_committed_keys_total != keys || p.o.eviction_debt_bytes() != 0 ||
          p.o.pool().counts().committed != 0) {
        std::fprintf(stderr, "transaction run incomplete: %zu routes left, %llu committed\n", p.m.route_count(),
                     (unsigned long long)c.reclaim_committed_keys_total);
        return 1;
      }
      txn.push_back(keys / s);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double d = median(direct), x = median(txn);
  std::printf("  direct removal (RemoveRoutes per key):     %8.0f keys/s  (median of %llu)\n", d,
              (unsigned long long)reps);
  std::printf("  fenced reclaim (Fence + Commit per cohort): %8.0f keys/s  = %.2fx the direct removal\n", x, x / d);
  return 0;
}
