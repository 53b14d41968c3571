// Writes the fuzz targets' seed corpora: one real message of each kind a target takes, encoded as
// the daemons send them (fuzz_seeds OUT: OUT/owner_request, OUT/master_request, ...).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fluxon/master/master_core.hpp"
#include "fluxon/runtime/channel.hpp"
#include "fluxon/runtime/transport.hpp"

using namespace fluxon;

namespace {
std::filesystem::path g_out;
int g_n = 0;
void put(const std::string& target, const void* p, size_t n) {
  std::filesystem::create_directories(g_out / target);
  std::ofstream(g_out / target / ("seed-" + std::to_string(g_n++)), std::ios::binary)
      .write(static_cast<const char*>(p), std::streamsize(n));
}
void put(const std::string& target, const Envelope& e) {
  const Bytes b = encode(e);
  put(target, b.data(), b.size());
}
template <class T>
void owner(T body) {
  put("owner_request", make_envelope(std::move(body), /*session=*/1));
}
template <class T>
void master(T body) {
  put("master_request", make_envelope(std::move(body)));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUTDIR\n");
    return 2;
  }
  g_out = argv[1];
  const std::vector<std::string> keys{"model:layer0:page0", "model:layer0:page1", "model:layer0:page2"};
  owner(wire::HelloT{{}, 4242});
  owner(wire::PingT{{}, 1});
  owner(wire::StatsReqT{});
  wire::PutStartReqT ps;
  ps.keys = keys;
  ps.value_len = 4096;
  ps.atomic_group_lens = {2, 1};
  owner(ps);
  owner(wire::PutCommitReqT{{}, 1});
  owner(wire::PutAbortReqT{{}, 1});
  wire::GetStartReqT gs;
  gs.keys = keys;
  owner(gs);
  owner(wire::GetTransferReqT{{}, 1, 0, 0});
  wire::ExistsReqT ex;
  ex.keys = keys;
  owner(ex);
  owner(wire::RemovePrefixReqT{{}, "model:"});
  wire::AckBatchT ack;
  ack.release = {1, 2};
  owner(ack);
  owner(wire::KvEventsReqT{{}, "model:", 0, 0, 16});
  owner(wire::MasterStatsReqT{});

  wire::RegisterOwnerT reg;
  reg.node_id = 3;
  reg.generation = 1;
  reg.role = "sglang_owner";
  reg.segment_len = 1 << 24;
  master(reg);
  wire::PutDoneT pd;
  pd.node_id = 1;
  pd.generation = 1;
  pd.put_id = 1;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = std::make_unique<wire::RouteItemT>();
    it->key = keys[i];
    it->offset = 4096 * i;
    it->len = 4096;
    it->slot_size = 4096;
    it->replica = i == 0;
    pd.items.push_back(std::move(it));
  }
  master(pd);
  wire::RemoveRoutesT rr;
  auto r = std::make_unique<wire::RemoveRouteT>();
  r->key = keys[0];
  r->node_id = 1;
  r->generation = 1;
  r->put_id = 1;
  rr.items.push_back(std::move(r));
  master(rr);
  wire::LookupT lk;
  lk.keys = keys;
  master(lk);
  wire::BatchGetStartT bg;
  bg.node_id = 2;
  bg.generation = 1;
  for (const auto& k : keys) {
    auto gi = std::make_unique<wire::GetItemT>();
    gi->key = k;
    bg.items.push_back(std::move(gi));
  }
  master(bg);
  master(wire::ReplicaPollT{{}, 2, 1, 8, 1, -1});
  master(wire::TierPollT{{}, 1, 1});
  master(wire::KvEventsReqT{{}, "", 0, 0, 0});
  master(wire::MasterStatsReqT{});

  put("config", "cluster_name: c\nmaster: {port: 7600}\nowners:\n  - node_id: 1\n    port: 7611\n"
                "    contribute_to_cluster_pool_size: {dram: 64MiB}\n", 97);

  // A ring holding one call entry of a Ping, at head 0.
  {
    std::vector<uint8_t> img(16 + 4096);
    channel::RingCtl ctl;
    ctl.head.store(0);
    ctl.tail.store(0);
    channel::Producer p(&ctl, img.data() + 16, 4096);
    const Bytes ping = encode(make_envelope(wire::PingT{{}, 1}, 1));
    bool wake = false;
    (void)p.push(channel::Kind::kCall, 7, ping.data(), uint32_t(ping.size()), &wake);
    const uint64_t head = 0, tail = ctl.tail.load();
    std::memcpy(img.data(), &head, 8);
    std::memcpy(img.data() + 8, &tail, 8);
    put("channel_ring", img.data(), img.size());
  }
  // A data request: segment length, generation ok, header, two ranges.
  {
    std::vector<uint8_t> req(9 + 24 + 32);
    const uint64_t seg = 1 << 20;
    std::memcpy(req.data(), &seg, 8);
    req[8] = 1;
    const uint32_t head[6] = {kDataMagic, kDataVersion, 1, 0, 2, 0};
    std::memcpy(req.data() + 9, head, 24);
    const uint64_t ranges[4] = {0, 4096, 8192, 4096};
    std::memcpy(req.data() + 33, ranges, 32);
    put("data_request", req.data(), req.size());
  }
  {
    const uint64_t blob[4] = {0x4658504C414E5631ull, 2, 0x1000, 0x2000};
    std::vector<uint8_t> b(sizeof(blob));
    std::memcpy(b.data(), blob, sizeof(blob));
    // (the target expects size % (values + 1) values: 32 % 5 = 2)
    put("plan_blob", b.data(), b.size());
  }
  std::printf("fuzz_seeds: %d seeds in %s\n", g_n, argv[1]);
  return 0;
}
