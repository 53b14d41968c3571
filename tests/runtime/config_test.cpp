#include <doctest/doctest.h>

#include <filesystem>

#include "fluxon/runtime/config.hpp"

using namespace fluxon;

static std::string err(const std::string& yaml) {
  auto r = parse_config_text(yaml);
  if (r.ok()) return "";
  CHECK(r.status().code() == Code::kInvalidArgument);
  return r.status().message();
}

TEST_CASE("config parses sizes and owners") {
  auto r = parse_config_text(R"(
cluster_name: t1
master: {port: 7700, metrics_port: 9700}
owners:
  - node_id: 1
    port: 7701
    contribute_to_cluster_pool_size: {dram: 2GiB}
    local_reserve_grant_bytes: 64MiB
    owner_local_reserve_expected_capacity: {value_len: 4718592, payload_capacity_bytes: 1GiB}
)");
  REQUIRE(r.ok());
  CHECK(r->cluster_name == "t1");
  CHECK(r->master.port == 7700);
  CHECK(r->master.metrics_port == 9700);
  REQUIRE(r->owners.size() == 1);
  CHECK(r->owners[0].dram_bytes == 2ull << 30);
  CHECK(r->owners[0].grant_bytes == 64ull << 20);
  CHECK(r->owners[0].expected_capacity->value_len == 4718592);
  CHECK(r->embedded());
}

TEST_CASE("empty config is the embedded laptop profile") {
  auto r = parse_config_text("");
  REQUIRE(r.ok());
  CHECK(r->embedded());
  REQUIRE(r->owners.size() == 1);
  CHECK(r->owners[0].dram_bytes == 1ull << 30);
}

TEST_CASE("external client config") {
  auto r = parse_config_text(R"({"owner_address": "127.0.0.1:7610"})");
  REQUIRE(r.ok());
  CHECK_FALSE(r->embedded());
  CHECK(r->client.owner_address == "127.0.0.1:7610");
}

TEST_CASE("validation rejects with the field named") {
  CHECK(err("owners: [{local_reserve_hard_timeout_ms: 10, local_reserve_soft_wait_ms: 10}]")
            .find("local_reserve_hard_timeout_ms") != std::string::npos);
  CHECK(err("owners: [{get_handle_ttl_ms: 0}]").find("get_handle_ttl_ms") != std::string::npos);
  CHECK(err("owners: [{contribute_to_cluster_pool_size: {dram: -5}}]").find("dram") != std::string::npos);
  CHECK(err("owners: [{local_reserve_grant_bytes: 4GiB, contribute_to_cluster_pool_size: {dram: 1GiB}}]")
            .find("local_reserve_grant_bytes") != std::string::npos);
  // value larger than a grant
  CHECK(err("owners: [{local_reserve_grant_bytes: 1MiB, owner_local_reserve_expected_capacity: "
            "{value_len: 2MiB, payload_capacity_bytes: 10MiB}}]")
            .find("owner_local_reserve_expected_capacity") != std::string::npos);
  // warm-up larger than the owner's DRAM
  CHECK(err("owners: [{contribute_to_cluster_pool_size: {dram: 64MiB}, local_reserve_grant_bytes: 16MiB, "
            "owner_local_reserve_expected_capacity: {value_len: 1MiB, payload_capacity_bytes: 1GiB}}]")
            .find("exceeds") != std::string::npos);
  // owner-only keys on the master and the client
  CHECK(err("master: {contribute_to_cluster_pool_size: {dram: 1GiB}}").find("owner-only") != std::string::npos);
  CHECK(err("client: {owner_local_reserve_expected_capacity: {value_len: 1, payload_capacity_bytes: 1}}")
            .find("owner-only") != std::string::npos);
  CHECK(err("owners: [{colour: red}]").find("owners[0].colour") != std::string::npos);
  CHECK(err("owners: [{node_id: 1}, {node_id: 1}]").find("duplicate") != std::string::npos);
  CHECK(err("cluster_name: 'a b'").find("cluster_name") != std::string::npos);
  CHECK(err("owners: [{fault_injection: {drop: 1.5}}]").find("fault_injection.drop") != std::string::npos);
  CHECK(err("owners: [{fault_injection: {jitter: 1}}]").find("fault_injection.jitter") != std::string::npos);
  CHECK(err("master: [1, 2").find("config") != std::string::npos);
  CHECK(err("owners: [{replica_writeback_hot_capacity_ratio: 1.0}]").find("replica_writeback_hot_capacity_ratio") !=
        std::string::npos);
  CHECK(err("owners: [{eviction_free_watermark: -0.1}]").find("eviction_free_watermark") != std::string::npos);
  CHECK(err("owners: [{writeback_demote: maybe}]").find("writeback_demote") != std::string::npos);
  CHECK(err("master: {eviction_free_watermark: 0.1}").find("owner-only") != std::string::npos);
}

TEST_CASE("config: every shipped file in configs/ is valid") {
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(std::string(FLUXON_SOURCE_DIR) + "/configs")) {
    if (f.path().extension() != ".yaml") continue;
    auto c = load_config_file(f.path().string());
    CHECK_MESSAGE(c.ok(), f.path().string(), ": ", c.status().to_string());
    n++;
  }
  CHECK(n >= 7);
  auto ref = load_config_file(std::string(FLUXON_SOURCE_DIR) + "/configs/reference-3host.yaml");
  REQUIRE(ref.ok());
  CHECK(ref->owners[0].hot_writeback_ratio == doctest::Approx(0.75));
  CHECK(ref->owners[2].role == "remote_cache");
}

TEST_CASE("config: owner-hot write-back and the free-slot watermark") {
  auto c = parse_config_text(
      "owners: [{replica_writeback_hot_capacity_ratio: 0.75, writeback_demote: false, writeback_timeout_ms: 5000, "
      "eviction_free_watermark: 0.05}, {node_id: 2}]\n");
  REQUIRE(c.ok());
  CHECK(c->owners[0].hot_writeback_ratio == doctest::Approx(0.75));
  CHECK_FALSE(c->owners[0].writeback_demote);
  CHECK(c->owners[0].writeback_timeout_ms == 5000);
  CHECK(c->owners[0].eviction_free_watermark == doctest::Approx(0.05));
  CHECK(c->owners[1].hot_writeback_ratio == 0);  // off unless asked for
  CHECK(c->owners[1].writeback_demote);
  CHECK(c->owners[1].eviction_free_watermark == doctest::Approx(0.02));
}

TEST_CASE("parse_bytes") {
  CHECK(*parse_bytes("4096") == 4096);
  CHECK(*parse_bytes("4KiB") == 4096);
  CHECK(*parse_bytes("1.5GiB") == 1610612736ull);
  CHECK(*parse_bytes("2 MB") == 2000000);
  CHECK_FALSE(parse_bytes("lots").ok());
  CHECK_FALSE(parse_bytes("5 parsecs").ok());
}

TEST_CASE("config: the client's RPC timeout must outlast the owner's hard timeout (the owner answers within it)") {
  auto bad = parse_config_text(
      "owners: [{local_reserve_hard_timeout_ms: 30000}]\nclient: {rpc_timeout_ms: 30000}\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("client.rpc_timeout_ms") != std::string::npos);
  CHECK(parse_config_text("owners: [{local_reserve_hard_timeout_ms: 3000}]\nclient: {rpc_timeout_ms: 4000}\n").ok());
}

TEST_CASE("config: the design's placement and tier keys - replica_task_placement, its old name, the ratios and what they require") {
  auto c = parse_config_text(
      "master: {replica_task_placement: {remote_only_node_roles: [remote_cache], restrict_to_remote_only_node_roles: true}}\n");
  REQUIRE(c.ok());
  CHECK(c->master.replica_target_roles() == std::vector<std::string>{"remote_cache"});
  auto loose = parse_config_text("master: {replica_task_placement: {restrict_to_remote_only_node_roles: false}}\n");
  REQUIRE(loose.ok());
  CHECK(loose->master.replica_target_roles().size() == 2);  // any owner may take a replica task
  auto old = parse_config_text("master: {replica_target_roles: [sglang_owner]}\n");
  REQUIRE(old.ok());  // the old name stays
  CHECK(old->master.replica_target_roles() == std::vector<std::string>{"sglang_owner"});
  CHECK(err("master: {replica_target_roles: [remote_cache], replica_task_placement: {}}").find("give one of them") !=
        std::string::npos);
  CHECK(err("master: {replica_task_placement: {remote_only_node_roles: [gpu]}}")
            .find("replica_task_placement.remote_only_node_roles: 'gpu'") != std::string::npos);
  CHECK(err("master: {replica_task_placement: {strict: true}}").find("replica_task_placement.strict: unknown key") !=
        std::string::npos);
  // T1 below T2, both in (0, 1), T1 only with strict placement.
  CHECK(err("master: {replica_cache_capacity_ratio: 0.95, replica_writeback_tier1_capacity_ratio: 0.95}")
            .find("replica_writeback_tier1_capacity_ratio: must be below replica_cache_capacity_ratio") != std::string::npos);
  CHECK(err("master: {replica_cache_capacity_ratio: 1.5}").find("replica_cache_capacity_ratio: must be in (0, 1)") !=
        std::string::npos);
  CHECK(err("master: {replica_task_placement: {restrict_to_remote_only_node_roles: false}, "
            "replica_cache_capacity_ratio: 0.95, replica_writeback_tier1_capacity_ratio: 0.75}")
            .find("needs replica_task_placement.restrict_to_remote_only_node_roles: true") != std::string::npos);
  auto tiers = parse_config_text("master: {replica_cache_capacity_ratio: 0.95, replica_writeback_tier1_capacity_ratio: 0.75}\n");
  REQUIRE(tiers.ok());
  CHECK(tiers->master.replica_cache_capacity_ratio == doctest::Approx(0.95));
  CHECK(tiers->master.replica_writeback_tier1_capacity_ratio == doctest::Approx(0.75));
  // The resolved config prints them, and reads back the same.
  const std::string printed = describe(*tiers);
  CHECK(printed.find("replica_writeback_tier1_capacity_ratio: 0.75") != std::string::npos);
  auto again = parse_config_text(printed);
  REQUIRE(again.ok());
  CHECK(again->master.replica_cache_capacity_ratio == doctest::Approx(0.95));
  // Spill: a ratio in (0, 1), strict placement, never on the role spills go to; printed back.
  auto spill = parse_config_text("owners: [{spill_free_ratio: 0.25}]\n");
  REQUIRE(spill.ok());
  CHECK(spill->owners[0].spill_free_ratio == doctest::Approx(0.25));
  CHECK(describe(*spill).find("spill_free_ratio: 0.25") != std::string::npos);
  CHECK(err("owners: [{spill_free_ratio: 1}]").find("owners[0].spill_free_ratio: must be in (0, 1)") != std::string::npos);
  CHECK(err("master: {replica_task_placement: {restrict_to_remote_only_node_roles: false}}\n"
            "owners: [{spill_free_ratio: 0.25}, {node_id: 2}]")
            .find("owners[0].spill_free_ratio: needs master.replica_task_placement") != std::string::npos);
  CHECK(err("owners: [{role: remote_cache, spill_free_ratio: 0.25}]").find("where spills go: it cannot spill") !=
        std::string::npos);
  // eviction_order: tier (the default) or prefix_depth; the stale turnover only with prefix_depth.
  auto depth = parse_config_text("owners: [{eviction_order: prefix_depth, eviction_stale_turnover: 2.5}]\n");
  REQUIRE(depth.ok());
  CHECK(depth->owners[0].eviction_prefix_depth);
  CHECK(depth->owners[0].eviction_stale_turnover == doctest::Approx(2.5));
  CHECK(describe(*depth).find("eviction_order: prefix_depth\n    eviction_stale_turnover: 2.5") != std::string::npos);
  auto tier = parse_config_text("owners: [{node_id: 1}]\n");
  REQUIRE(tier.ok());
  CHECK_FALSE(tier->owners[0].eviction_prefix_depth);
  CHECK(describe(*tier).find("eviction_order: tier") != std::string::npos);
  CHECK(err("owners: [{eviction_order: lru}]").find("owners[0].eviction_order: must be tier or prefix_depth, not 'lru'") !=
        std::string::npos);
  CHECK(err("owners: [{eviction_stale_turnover: 2}]").find("owners[0].eviction_stale_turnover: only with") !=
        std::string::npos);
  CHECK(err("owners: [{eviction_order: prefix_depth, eviction_stale_turnover: 0.1}]")
            .find("owners[0].eviction_stale_turnover: must be auto or a number of segments in [0.5, 1000]") !=
        std::string::npos);
  CHECK(err("owners: [{eviction_order: prefix_depth, eviction_stale_turnover: automatic}]")
            .find("owners[0].eviction_stale_turnover: must be auto or") != std::string::npos);
  // auto (the default): the horizon follows the re-read intervals (0 in the resolved config, printed
  // as auto).
  auto depth_default = parse_config_text("owners: [{eviction_order: prefix_depth}]\n");
  REQUIRE(depth_default.ok());
  CHECK(depth_default->owners[0].eviction_stale_turnover == 0);
  CHECK(describe(*depth_default).find("eviction_stale_turnover: auto") != std::string::npos);
  auto adaptive = parse_config_text("owners: [{eviction_order: prefix_depth, eviction_stale_turnover: auto}]\n");
  REQUIRE(adaptive.ok());
  CHECK(adaptive->owners[0].eviction_stale_turnover == 0);
  CHECK(describe(*adaptive).find("eviction_stale_turnover: auto") != std::string::npos);
  // Owner-hot write-back: a ratio in (0, 1), and only with strict placement.
  CHECK(err("owners: [{replica_writeback_hot_capacity_ratio: 0}]").find("must be in (0, 1)") != std::string::npos);
  CHECK(err("master: {replica_task_placement: {restrict_to_remote_only_node_roles: false}}\n"
            "owners: [{replica_writeback_hot_capacity_ratio: 0.75}, {node_id: 2}]")
            .find("owners[0].replica_writeback_hot_capacity_ratio: needs master.replica_task_placement") != std::string::npos);
  // Master-only keys elsewhere.
  CHECK(err("owners: [{replica_task_placement: {}}]").find("owners[0].replica_task_placement: master-only") !=
        std::string::npos);
  CHECK(err("client: {replica_cache_capacity_ratio: 0.9}").find("master-only") != std::string::npos);
}

TEST_CASE("config: describe() prints every resolved field, and what it prints reads back to the same configuration") {
  for (const auto& f : std::filesystem::directory_iterator(std::string(FLUXON_SOURCE_DIR) + "/configs")) {
    if (f.path().extension() != ".yaml") continue;
    CAPTURE(f.path().string());
    auto c = load_config_file(f.path().string());
    REQUIRE(c.ok());
    const std::string text = describe(*c);
    auto back = parse_config_text(text);
    REQUIRE_MESSAGE(back.ok(), back.status().to_string(), "\n", text);
    CHECK(describe(*back) == text);
    CHECK(text.find("restrict_to_remote_only_node_roles") != std::string::npos);
    if (!c->owners.empty()) CHECK(text.find("eviction_interval_ms") != std::string::npos);
  }
}

TEST_CASE("config: replica_task_max_inflight is 1..64 on owners only") {
  auto c = parse_config_text("owners: [{replica_task_max_inflight: 16}]\n");
  REQUIRE(c.ok());
  CHECK(c->owners[0].replica_task_max_inflight == 16);
  CHECK(err("owners: [{replica_task_max_inflight: 65}]").find("replica_task_max_inflight: must be in 1..64") !=
        std::string::npos);
  CHECK(err("owners: [{replica_task_max_inflight: 0}]").find("replica_task_max_inflight: must be > 0") != std::string::npos);
  CHECK(err("master: {replica_task_max_inflight: 4}").find("owner-only") != std::string::npos);
}

TEST_CASE("config: the HA mode (etcd + masters) parses, and its description reads back the same") {
  auto r = parse_config_text(R"(
cluster_name: h
auth: {key_file: /etc/fluxon/h.key}
etcd: {endpoints: [http://127.0.0.1:2379, http://10.0.0.2:2379], lease_ttl_ms: 3000}
masters:
  - {port: 7700, metrics_port: 9700, get_inflight_ttl_ms: 5000}
  - {listen_host: 0.0.0.0, port: 7701}
owners:
  - {node_id: 1, contribute_to_cluster_pool_size: {dram: 64MiB}, local_reserve_grant_bytes: 16MiB}
)");
  REQUIRE(r.ok());
  CHECK(r->ha());
  CHECK(r->etcd.endpoints.size() == 2);
  CHECK(r->etcd.lease_ttl_ms == 3000);
  REQUIRE(r->masters.size() == 2);
  CHECK(r->masters[0].get_inflight_ttl_ms == 5000);
  CHECK(r->masters[1].listen_host == "0.0.0.0");
  CHECK(r->masters[1].port == 7701);
  CHECK(r->master.port == 7700);  // masters[0], for tools that need one
  CHECK(r->auth.key_file == "/etc/fluxon/h.key");
  auto again = parse_config_text(describe(*r));
  REQUIRE(again.ok());
  CHECK(describe(*again) == describe(*r));
  CHECK(again->masters.size() == 2);
  CHECK(again->etcd.endpoints == r->etcd.endpoints);
  CHECK(err("masters: [{port: 1}]") == "masters: the HA mode needs etcd: {endpoints: [http://host:port]}");
  CHECK(err("etcd: {endpoints: [http://h:1]}\nmasters: [{port: 1, replica_target_roles: [remote_cache], x: 1}]") ==
        "masters[0].x: unknown key");
}

TEST_CASE("config: without auth every daemon listens on loopback only, and the refusal names the field and the fix") {
  auto err = [](const std::string& t) {
    auto r = parse_config_text(t);
    return r.ok() ? std::string() : r.status().message();
  };
  const std::string owner = "owners: [{node_id: 1, contribute_to_cluster_pool_size: {dram: 64MiB}, "
                            "local_reserve_grant_bytes: 16MiB";
  CHECK(err("master: {listen_host: 0.0.0.0}\n" + owner + "}]").find("master.listen_host: '0.0.0.0' is not a loopback") !=
        std::string::npos);
  CHECK(err(owner + ", listen_host: 10.1.2.3}]").find("owners[0].listen_host: '10.1.2.3'") != std::string::npos);
  CHECK(err(owner + ", data_host: 10.1.2.3}]").find("owners[0].data_host") != std::string::npos);
  CHECK(err(owner + ", listen_host: 10.1.2.3}]").find("fluxon keygen") != std::string::npos);
  // Loopback in every spelling is fine; with auth any address is.
  CHECK(err(owner + ", listen_host: 127.0.0.2}]").empty());
  CHECK(err(owner + ", listen_host: localhost}]").empty());
  CHECK(err("auth: {key_file: k}\nmaster: {listen_host: 0.0.0.0}\n" + owner + ", listen_host: 10.1.2.3}]").empty());
  // auth: {key_file} is required and alone.
  CHECK(err("auth: {}").find("auth.key_file: required") != std::string::npos);
  CHECK(err("auth: {key_file: k, mode: x}").find("auth.mode: unknown key") != std::string::npos);
}

TEST_CASE("config: a negative or malformed duration or count is named as what it is, not as a size") {
  CHECK(err("owners: [{local_reserve_hard_timeout_ms: -5}]") ==
        "owners[0].local_reserve_hard_timeout_ms: must be > 0, got -5");
  CHECK(err("owners: [{local_reserve_hard_timeout_ms: soon}]") ==
        "owners[0].local_reserve_hard_timeout_ms: 'soon' is not a whole number of milliseconds");
  CHECK(err("master: {kv_event_log_capacity: many}") == "master.kv_event_log_capacity: 'many' is not a whole number");
  CHECK(err("owners: [{local_reserve_grant_bytes: big}]") == "owners[0].local_reserve_grant_bytes: 'big' is not a size");
}
