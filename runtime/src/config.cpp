#include "fluxon/runtime/config.hpp"
#include "fluxon/runtime/etcd.hpp"

#include <algorithm>

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace fluxon {

namespace {

const std::set<std::string> kOwnerOnlyKeys = {
    "contribute_to_cluster_pool_size", "owner_local_reserve_expected_capacity",
    "local_reserve_grant_bytes", "local_reserve_soft_wait_ms", "local_reserve_hard_timeout_ms",
    "get_handle_ttl_ms", "node_id", "role", "data_host", "data_port", "data_transport", "data_threads",
    "data_timeout_ms", "get_start_wait_ms", "replica_writeback_hot_capacity_ratio", "writeback_demote",
    "writeback_timeout_ms", "eviction_free_watermark", "replica_task_max_inflight", "idle_grant_shrink_ms",
    "client_channel"};

const std::set<std::string> kMasterOnlyKeys = {
    "get_inflight_ttl_ms", "replica_target_roles", "replica_task_placement", "replica_cache_capacity_ratio",
    "replica_writeback_tier1_capacity_ratio"};

Status check_keys(const YAML::Node& n, const std::string& where, const std::set<std::string>& allowed) {
  if (!n.IsMap()) return invalid_argument(where + ": expected a mapping");
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (allowed.count(k)) continue;
    if (kOwnerOnlyKeys.count(k) && where.rfind("owners", 0) != 0)
      return invalid_argument(where + "." + k + ": owner-only key not allowed here");
    if (kMasterOnlyKeys.count(k) && where != "master" && where.rfind("masters[", 0) != 0)
      return invalid_argument(where + "." + k + ": master-only key not allowed here");
    return invalid_argument(where + "." + k + ": unknown key");
  }
  return Status::ok();
}

Status get_roles(const YAML::Node& r, const std::string& field, std::vector<std::string>& out) {
  if (!r.IsSequence()) return invalid_argument(field + ": expected a list of roles");
  out.clear();
  for (const auto& x : r) {
    const std::string role = x.as<std::string>();
    if (role != "sglang_owner" && role != "remote_cache")
      return invalid_argument(field + ": '" + role + "' is not sglang_owner or remote_cache");
    out.push_back(role);
  }
  return Status::ok();
}

// A share in [0, 1), or with open_low in (0, 1) (a ratio of the design's that is off unless given);
// absent: out unchanged.
Status get_fraction(const YAML::Node& n, const char* key, const std::string& where, double& out,
                    bool open_low = false) {
  if (!n[key]) return Status::ok();
  double v = -1;
  try {
    v = n[key].as<double>();
  } catch (const YAML::Exception&) {
  }
  if (!((open_low ? v > 0 : v >= 0) && v < 1))
    return invalid_argument(where + "." + key + (open_low ? ": must be in (0, 1)" : ": must be in [0, 1)"));
  out = v;
  return Status::ok();
}
Status get_ratio(const YAML::Node& n, const char* key, const std::string& where, double& out) {
  return get_fraction(n, key, where, out, true);
}

template <class T>
Status get_uint(const YAML::Node& n, const std::string& key, const std::string& where, T& out) {
  if (!n[key]) return Status::ok();
  const std::string field = where + "." + key;
  try {
    const auto s = n[key].as<std::string>();
    const bool ms = key.size() > 3 && key.compare(key.size() - 3, 3, "_ms") == 0;
    if (!s.empty() && s[0] == '-') return invalid_argument(field + ": must be > 0, got " + s);
    auto v = parse_bytes(s);
    if (!v.ok()) {
      // Sizes take units (64MiB); durations in ms and counts are plain whole numbers.
      if (ms) return invalid_argument(field + ": '" + s + "' is not a whole number of milliseconds");
      if (key.find("bytes") == std::string::npos && key.find("size") == std::string::npos)
        return invalid_argument(field + ": '" + s + "' is not a whole number");
      return invalid_argument(field + ": " + v.status().message());
    }
    if (*v == 0) return invalid_argument(field + ": must be > 0");
    if (*v > std::numeric_limits<T>::max()) return invalid_argument(field + ": out of range");
    out = static_cast<T>(*v);
  } catch (const YAML::Exception& e) {
    return invalid_argument(field + ": " + e.what());
  }
  return Status::ok();
}

Status get_str(const YAML::Node& n, const std::string& key, const std::string& where, std::string& out) {
  if (!n[key]) return Status::ok();
  if (!n[key].IsScalar()) return invalid_argument(where + "." + key + ": expected a string");
  out = n[key].as<std::string>();
  if (out.empty()) return invalid_argument(where + "." + key + ": empty");
  return Status::ok();
}

#define FLX_TRY(expr)              \
  do {                             \
    Status _s = (expr);            \
    if (!_s.is_ok()) return _s;    \
  } while (0)

Status parse_master(const YAML::Node& n, MasterConfig& m, const std::string& where = "master") {
  FLX_TRY(check_keys(n, where, {"listen_host", "port", "metrics_port", "get_inflight_ttl_ms", "kv_event_log_capacity",
                                   "replica_target_roles", "replica_task_placement", "replica_cache_capacity_ratio",
                                   "replica_writeback_tier1_capacity_ratio"}));
  if (n["replica_target_roles"] && n["replica_task_placement"])
    return invalid_argument(where + ".replica_target_roles: the old name of replica_task_placement.remote_only_node_roles; "
                            "give one of them");
  if (auto r = n["replica_target_roles"]) FLX_TRY(get_roles(r, where + ".replica_target_roles", m.remote_only_node_roles));
  if (auto p = n["replica_task_placement"]) {
    const std::string w = where + ".replica_task_placement";
    FLX_TRY(check_keys(p, w, {"remote_only_node_roles", "restrict_to_remote_only_node_roles"}));
    if (auto r = p["remote_only_node_roles"]) FLX_TRY(get_roles(r, w + ".remote_only_node_roles", m.remote_only_node_roles));
    if (auto s = p["restrict_to_remote_only_node_roles"]) {
      try {
        m.restrict_to_remote_only_node_roles = s.as<bool>();
      } catch (const YAML::Exception&) {
        return invalid_argument(w + ".restrict_to_remote_only_node_roles: expected true or false");
      }
    }
  }
  if (m.remote_only_node_roles.empty())
    return invalid_argument(where + ".replica_task_placement.remote_only_node_roles: empty");
  // The master's two tiers (T1 hot route metadata, T2 resident), as the design checks them.
  double& t2 = m.replica_cache_capacity_ratio;
  double& t1 = m.replica_writeback_tier1_capacity_ratio;
  FLX_TRY(get_ratio(n, "replica_cache_capacity_ratio", where, t2));
  FLX_TRY(get_ratio(n, "replica_writeback_tier1_capacity_ratio", where, t1));
  if (t1 > 0 && t1 >= (t2 > 0 ? t2 : 1))
    return invalid_argument(where + ".replica_writeback_tier1_capacity_ratio: must be below replica_cache_capacity_ratio");
  if (t1 > 0 && !m.restrict_to_remote_only_node_roles)
    return invalid_argument(where + ".replica_writeback_tier1_capacity_ratio: needs "
                            "replica_task_placement.restrict_to_remote_only_node_roles: true");
  FLX_TRY(get_uint(n, "get_inflight_ttl_ms", where, m.get_inflight_ttl_ms));
  FLX_TRY(get_uint(n, "kv_event_log_capacity", where, m.kv_event_log_capacity));
  if (m.kv_event_log_capacity > (uint64_t(1) << 24))
    return invalid_argument(where + ".kv_event_log_capacity: " + std::to_string(m.kv_event_log_capacity) +
                            " is above the limit of 16777216 events");
  FLX_TRY(get_str(n, "listen_host", where, m.listen_host));
  FLX_TRY(get_uint(n, "port", where, m.port));
  if (n["metrics_port"] && n["metrics_port"].as<std::string>() == "0") m.metrics_port = 0;
  else FLX_TRY(get_uint(n, "metrics_port", where, m.metrics_port));
  return Status::ok();
}

// etcd: {endpoints, lease_ttl_ms, poll_ms} and masters: [...] (the HA mode), or neither.
Status parse_ha(const YAML::Node& root, ClusterConfig& c) {
  if (auto e = root["etcd"]) {
    FLX_TRY(check_keys(e, "etcd", {"endpoints", "lease_ttl_ms", "poll_ms"}));
    auto eps = e["endpoints"];
    if (!eps || !eps.IsSequence() || eps.size() == 0)
      return invalid_argument("etcd.endpoints: expected a list of http://host:port");
    for (size_t i = 0; i < eps.size(); ++i) {
      const std::string ep = eps[i].as<std::string>();
      auto hp = parse_http_endpoint(ep);
      if (!hp.ok()) return invalid_argument("etcd.endpoints[" + std::to_string(i) + "]: " + hp.status().message());
      c.etcd.endpoints.push_back(ep);
    }
    FLX_TRY(get_uint(e, "lease_ttl_ms", "etcd", c.etcd.lease_ttl_ms));
    if (c.etcd.lease_ttl_ms < 1000 || c.etcd.lease_ttl_ms % 1000 != 0)
      return invalid_argument("etcd.lease_ttl_ms: must be a whole number of seconds, at least 1000 (etcd grants "
                              "leases in seconds), not " + std::to_string(c.etcd.lease_ttl_ms));
    if (e["poll_ms"]) {
      FLX_TRY(get_uint(e, "poll_ms", "etcd", c.etcd.poll_ms_set));
      if (c.etcd.poll_ms_set < 20)
        return invalid_argument("etcd.poll_ms: at least 20 (a read of the leadership key that often while it cannot be "
                                "watched), not " + std::to_string(c.etcd.poll_ms_set));
    }
  }
  auto ms = root["masters"];
  if (!ms) {
    if (c.etcd.enabled()) return invalid_argument("etcd: only the HA mode uses it: list the masters in masters:");
    return Status::ok();
  }
  if (root["master"]) return invalid_argument("masters: give either master: (one master) or masters: (with etcd:), not both");
  if (!c.etcd.enabled()) return invalid_argument("masters: the HA mode needs etcd: {endpoints: [http://host:port]}");
  if (!ms.IsSequence() || ms.size() == 0) return invalid_argument("masters: expected a list of masters");
  for (size_t i = 0; i < ms.size(); ++i) {
    MasterConfig m;
    m.port = uint16_t(7600 + i);
    FLX_TRY(parse_master(ms[i], m, "masters[" + std::to_string(i) + "]"));
    for (size_t j = 0; j < c.masters.size(); ++j)
      if (c.masters[j].port == m.port && c.masters[j].listen_host == m.listen_host)
        return invalid_argument("masters[" + std::to_string(i) + "].port: " + std::to_string(m.port) +
                                " is masters[" + std::to_string(j) + "]'s too");
    c.masters.push_back(m);
  }
  c.master = c.masters[0];
  return Status::ok();
}

Status parse_owner(const YAML::Node& n, const std::string& where, OwnerConfig& o) {
  FLX_TRY(check_keys(n, where,
                     {"node_id", "role", "listen_host", "port", "metrics_port",
                      "contribute_to_cluster_pool_size", "local_reserve_grant_bytes",
                      "owner_local_reserve_expected_capacity", "local_reserve_soft_wait_ms",
                      "local_reserve_hard_timeout_ms", "get_handle_ttl_ms", "publish_retry_ms",
                      "master_rpc_timeout_ms", "fault_injection", "eviction", "eviction_max_bytes_per_round",
                      "eviction_interval_ms",
                      "eviction_tp_cohorts", "data_host", "data_port", "data_transport", "data_threads",
                      "data_timeout_ms", "get_start_wait_ms", "replica_writeback_hot_capacity_ratio",
                      "writeback_demote", "writeback_timeout_ms", "eviction_free_watermark",
                      "replica_task_max_inflight", "idle_grant_shrink_ms", "spill_free_ratio",
                      "eviction_order", "eviction_stale_turnover", "client_channel"}));
  if (auto ch = n["client_channel"]) {
    const std::string w = where + ".client_channel";
    FLX_TRY(check_keys(ch, w, {"enabled", "ring_bytes", "max_sessions", "spin_us"}));
    bool enabled = true;
    if (ch["enabled"]) {
      try {
        enabled = ch["enabled"].as<bool>();
      } catch (const YAML::Exception&) {
        return invalid_argument(w + ".enabled: expected true or false");
      }
    }
    FLX_TRY(get_uint(ch, "ring_bytes", w, o.client_channel_ring_bytes));
    if (o.client_channel_ring_bytes < 4096 || o.client_channel_ring_bytes > (64u << 20) ||
        o.client_channel_ring_bytes % 4096)
      return invalid_argument(w + ".ring_bytes: must be a multiple of 4096 in [4KiB, 64MiB]");
    FLX_TRY(get_uint(ch, "max_sessions", w, o.client_channel_max_sessions));
    if (o.client_channel_max_sessions > 4096) return invalid_argument(w + ".max_sessions: must be in 1..4096");
    if (ch["spin_us"] && ch["spin_us"].as<std::string>() == "0") o.client_channel_spin_us = 0;
    else FLX_TRY(get_uint(ch, "spin_us", w, o.client_channel_spin_us));
    if (o.client_channel_spin_us > 10000) return invalid_argument(w + ".spin_us: must be <= 10000");
    if (!enabled) o.client_channel_ring_bytes = 0;
  }
  FLX_TRY(get_uint(n, "replica_task_max_inflight", where, o.replica_task_max_inflight));
  if (o.replica_task_max_inflight > 64)
    return invalid_argument(where + ".replica_task_max_inflight: must be in 1..64");
  FLX_TRY(get_str(n, "data_host", where, o.data_host));
  if (n["data_port"] && n["data_port"].as<std::string>() == "0") o.data_port = 0;
  else FLX_TRY(get_uint(n, "data_port", where, o.data_port));
  FLX_TRY(get_str(n, "data_transport", where, o.data_transport));
  if (o.data_transport != "auto" && o.data_transport != "tcp" && o.data_transport != "rdma")
    return invalid_argument(where + ".data_transport: must be auto, tcp or rdma");
  FLX_TRY(get_uint(n, "data_threads", where, o.data_threads));
  FLX_TRY(get_uint(n, "data_timeout_ms", where, o.data_timeout_ms));
  FLX_TRY(get_uint(n, "get_start_wait_ms", where, o.get_start_wait_ms));
  FLX_TRY(get_uint(n, "writeback_timeout_ms", where, o.writeback_timeout_ms));
  FLX_TRY(get_ratio(n, "replica_writeback_hot_capacity_ratio", where, o.hot_writeback_ratio));
  FLX_TRY(get_ratio(n, "spill_free_ratio", where, o.spill_free_ratio));
  FLX_TRY(get_fraction(n, "eviction_free_watermark", where, o.eviction_free_watermark));
  FLX_TRY(get_uint(n, "node_id", where, o.node_id));
  FLX_TRY(get_str(n, "role", where, o.role));
  FLX_TRY(get_str(n, "listen_host", where, o.listen_host));
  FLX_TRY(get_uint(n, "port", where, o.port));
  if (n["metrics_port"] && n["metrics_port"].as<std::string>() == "0") o.metrics_port = 0;
  else FLX_TRY(get_uint(n, "metrics_port", where, o.metrics_port));
  if (auto p = n["contribute_to_cluster_pool_size"]) {
    FLX_TRY(check_keys(p, where + ".contribute_to_cluster_pool_size", {"dram"}));
    FLX_TRY(get_uint(p, "dram", where + ".contribute_to_cluster_pool_size", o.dram_bytes));
  }
  FLX_TRY(get_uint(n, "local_reserve_grant_bytes", where, o.grant_bytes));
  if (auto e = n["owner_local_reserve_expected_capacity"]) {
    const std::string w = where + ".owner_local_reserve_expected_capacity";
    FLX_TRY(check_keys(e, w, {"value_len", "payload_capacity_bytes"}));
    if (!e["value_len"] || !e["payload_capacity_bytes"])
      return invalid_argument(w + ": needs value_len and payload_capacity_bytes");
    ExpectedCapacity cap;
    FLX_TRY(get_uint(e, "value_len", w, cap.value_len));
    FLX_TRY(get_uint(e, "payload_capacity_bytes", w, cap.payload_capacity_bytes));
    o.expected_capacity = cap;
  }
  FLX_TRY(get_uint(n, "local_reserve_soft_wait_ms", where, o.soft_wait_ms));
  FLX_TRY(get_uint(n, "local_reserve_hard_timeout_ms", where, o.hard_timeout_ms));
  FLX_TRY(get_uint(n, "get_handle_ttl_ms", where, o.get_handle_ttl_ms));
  FLX_TRY(get_uint(n, "publish_retry_ms", where, o.publish_retry_ms));
  FLX_TRY(get_uint(n, "master_rpc_timeout_ms", where, o.master_rpc_timeout_ms));
  FLX_TRY(get_uint(n, "eviction_max_bytes_per_round", where, o.eviction_max_bytes_per_round));
  FLX_TRY(get_uint(n, "eviction_interval_ms", where, o.eviction_interval_ms));
  FLX_TRY(get_uint(n, "idle_grant_shrink_ms", where, o.idle_grant_shrink_ms));
  if (n["eviction_order"]) {
    std::string order;
    FLX_TRY(get_str(n, "eviction_order", where, order));
    if (order != "tier" && order != "prefix_depth")
      return invalid_argument(where + ".eviction_order: must be tier or prefix_depth, not '" + order + "'");
    o.eviction_prefix_depth = order == "prefix_depth";
  }
  if (n["eviction_stale_turnover"]) {
    double v = 0;
    const bool is_auto = n["eviction_stale_turnover"].IsScalar() && n["eviction_stale_turnover"].Scalar() == "auto";
    try {
      if (!is_auto) v = n["eviction_stale_turnover"].as<double>();
    } catch (const YAML::Exception&) {
    }
    if (!is_auto && !(v >= 0.5 && v <= 1000))
      return invalid_argument(where + ".eviction_stale_turnover: must be auto or a number of segments in [0.5, 1000]");
    if (!o.eviction_prefix_depth)
      return invalid_argument(where + ".eviction_stale_turnover: only with eviction_order: prefix_depth");
    o.eviction_stale_turnover = v;
  }
  for (auto [name, flag] : {std::pair<const char*, bool*>{"eviction", &o.eviction},
                             std::pair<const char*, bool*>{"eviction_tp_cohorts", &o.eviction_tp_cohorts},
                             std::pair<const char*, bool*>{"writeback_demote", &o.writeback_demote}}) {
    if (!n[name]) continue;
    try {
      *flag = n[name].as<bool>();
    } catch (const YAML::Exception&) {
      return invalid_argument(where + "." + name + ": expected true or false");
    }
  }
  if (auto f = n["fault_injection"]) {
    const std::string w = where + ".fault_injection";
    FLX_TRY(check_keys(f, w, {"seed", "drop", "duplicate", "fetch_fail", "max_delay_ms"}));
    FLX_TRY(get_uint(f, "seed", w, o.fault_injection.seed));
    FLX_TRY(get_uint(f, "max_delay_ms", w, o.fault_injection.max_delay_ms));
    FLX_TRY(get_fraction(f, "drop", w, o.fault_injection.drop));
    FLX_TRY(get_fraction(f, "duplicate", w, o.fault_injection.duplicate));
    FLX_TRY(get_fraction(f, "fetch_fail", w, o.fault_injection.fetch_fail));
  }
  return Status::ok();
}

}  // namespace

Result<uint64_t> parse_bytes(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return invalid_argument("'" + s + "' is not a size");
  double num = 0;
  try {
    num = std::stod(s.substr(0, i));
  } catch (...) {
    return invalid_argument("'" + s + "' is not a size");
  }
  std::string unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double mul = 1;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "KiB") mul = 1024.0;
  else if (unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else if (unit == "TiB") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else return invalid_argument("'" + s + "': unknown unit '" + unit + "'");
  double v = std::floor(num * mul);
  if (v < 0 || v > 1.8e19) return invalid_argument("'" + s + "' out of range");
  return static_cast<uint64_t>(v);
}

Result<OwnerConfig> ClusterConfig::owner(uint32_t node_id) const {
  if (owners.empty()) return invalid_argument("owners: no owner configured");
  for (const auto& o : owners)
    if (node_id == 0 || o.node_id == node_id) {
      OwnerConfig r = o;
      r.alone_in_cluster = owners.size() == 1;  // every owner of a cluster is in its config
      return r;
    }
  return invalid_argument("owners: no owner with node_id " + std::to_string(node_id));
}

ClusterConfig default_embedded_config() {
  ClusterConfig c;
  c.cluster_name = "embedded";
  OwnerConfig o;
  o.dram_bytes = 1ull << 30;
  o.grant_bytes = 64ull << 20;
  c.owners.push_back(o);
  return c;
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

namespace {
// Without the cluster key, nothing listens beyond this machine: whoever reaches a port could read
// users' KV pages.
Status check_loopback_without_auth(const ClusterConfig& c) {
  if (c.auth.enabled()) return Status::ok();
  auto refuse = [](const std::string& field, const std::string& host) {
    return invalid_argument(field + ": '" + host +
                            "' is not a loopback address, and without auth every daemon listens on 127.0.0.1 "
                            "only (anyone reaching the port could read users' KV pages): write a key with `fluxon "
                            "keygen PATH` and name it in auth: {key_file: PATH}");
  };
  if (!c.ha() && !is_loopback_host(c.master.listen_host)) return refuse("master.listen_host", c.master.listen_host);
  for (size_t i = 0; i < c.masters.size(); ++i)
    if (!is_loopback_host(c.masters[i].listen_host))
      return refuse("masters[" + std::to_string(i) + "].listen_host", c.masters[i].listen_host);
  for (size_t i = 0; i < c.owners.size(); ++i) {
    const std::string w = "owners[" + std::to_string(i) + "]";
    if (!is_loopback_host(c.owners[i].listen_host)) return refuse(w + ".listen_host", c.owners[i].listen_host);
    if (!c.owners[i].data_host.empty() && !is_loopback_host(c.owners[i].data_host))
      return refuse(w + ".data_host", c.owners[i].data_host);
  }
  return Status::ok();
}
}  // namespace

Status validate(const ClusterConfig& c) {
  FLX_TRY(check_loopback_without_auth(c));
  for (size_t i = 0; i < c.owners.size(); ++i)
    if (c.owners[i].hot_writeback_ratio > 0 && !c.master.restrict_to_remote_only_node_roles)
      return invalid_argument("owners[" + std::to_string(i) +
                              "].replica_writeback_hot_capacity_ratio: needs "
                              "master.replica_task_placement.restrict_to_remote_only_node_roles: true (a write-back "
                              "must not land on another GPU owner)");
  for (size_t i = 0; i < c.owners.size(); ++i) {
    if (c.owners[i].spill_free_ratio > 0 && !c.master.restrict_to_remote_only_node_roles)
      return invalid_argument("owners[" + std::to_string(i) +
                              "].spill_free_ratio: needs master.replica_task_placement.restrict_to_remote_only_node_roles: "
                              "true (a spilled put must not land on another GPU owner)");
    const auto& roles = c.master.remote_only_node_roles;
    if (c.owners[i].spill_free_ratio > 0 && std::find(roles.begin(), roles.end(), c.owners[i].role) != roles.end())
      return invalid_argument("owners[" + std::to_string(i) + "].spill_free_ratio: owner " +
                              std::to_string(c.owners[i].node_id) + " has the role '" + c.owners[i].role +
                              "', where spills go: it cannot spill");
  }
  if (c.cluster_name.empty()) return invalid_argument("cluster_name: empty");
  for (char ch : c.cluster_name)
    if (!isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_')
      return invalid_argument("cluster_name: only [A-Za-z0-9_-] allowed");
  std::set<uint32_t> ids;
  for (size_t i = 0; i < c.owners.size(); ++i) {
    const auto& o = c.owners[i];
    const std::string w = "owners[" + std::to_string(i) + "]";
    if (!ids.insert(o.node_id).second) return invalid_argument(w + ".node_id: duplicate");
    if (o.role != "sglang_owner" && o.role != "remote_cache")
      return invalid_argument(w + ".role: must be sglang_owner or remote_cache");
    if (o.grant_bytes % kMinSlotBytes != 0)
      return invalid_argument(w + ".local_reserve_grant_bytes: must be a multiple of 4096");
    if (o.grant_bytes > o.dram_bytes)
      return invalid_argument(w + ".local_reserve_grant_bytes: larger than contribute_to_cluster_pool_size.dram");
    if (o.hard_timeout_ms <= o.soft_wait_ms)
      return invalid_argument(w + ".local_reserve_hard_timeout_ms: must be > local_reserve_soft_wait_ms");
    // The owner answers every waiting call (a claim, a remote get_transfer) within its hard timeout;
    // a client giving up earlier would leave what the late answer hands it.
    if (c.client.rpc_timeout_ms <= o.hard_timeout_ms)
      return invalid_argument("client.rpc_timeout_ms: must be > " + w + ".local_reserve_hard_timeout_ms (" +
                              std::to_string(o.hard_timeout_ms) + ")");
    if (o.expected_capacity) {
      auto eg = expected_grants(*o.expected_capacity, o.grant_bytes);
      if (!eg.ok())
        return invalid_argument(w + ".owner_local_reserve_expected_capacity: " + eg.status().message());
      if (eg->expected_grants * o.grant_bytes > o.dram_bytes)
        return invalid_argument(w + ".owner_local_reserve_expected_capacity: warm-up of " +
                                std::to_string(eg->expected_grants) + " grants exceeds the owner's dram");
    }
  }
  return Status::ok();
}

Result<ClusterConfig> parse_config_text(const std::string& text) {
  ClusterConfig c;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return invalid_argument(std::string("config: ") + e.what());
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  try {
    FLX_TRY(check_keys(root, "config", {"cluster_name", "run_dir", "master", "masters", "etcd", "owners", "owner",
                                        "client", "owner_address", "auth"}));
    if (auto a = root["auth"]) {
      FLX_TRY(check_keys(a, "auth", {"key_file"}));
      FLX_TRY(get_str(a, "key_file", "auth", c.auth.key_file));
      if (c.auth.key_file.empty()) return invalid_argument("auth.key_file: required (a file written by `fluxon keygen`)");
    }
    FLX_TRY(get_str(root, "cluster_name", "config", c.cluster_name));
    FLX_TRY(get_str(root, "run_dir", "config", c.run_dir));
    if (root["master"]) FLX_TRY(parse_master(root["master"], c.master));
    FLX_TRY(parse_ha(root, c));
    if (root["owner"]) {
      OwnerConfig o;
      FLX_TRY(parse_owner(root["owner"], "owners[0]", o));
      c.owners.push_back(o);
    }
    if (auto owners = root["owners"]) {
      if (!owners.IsSequence()) return invalid_argument("owners: expected a list");
      for (size_t i = 0; i < owners.size(); ++i) {
        OwnerConfig o;
        o.node_id = uint32_t(c.owners.size() + 1);
        o.port = uint16_t(7610 + c.owners.size());
        FLX_TRY(parse_owner(owners[i], "owners[" + std::to_string(i) + "]", o));
        c.owners.push_back(o);
      }
    }
    if (auto cl = root["client"]) {
      FLX_TRY(check_keys(cl, "client", {"owner_address", "rpc_timeout_ms", "max_wait_ms", "channel", "channel_spin_us"}));
      FLX_TRY(get_str(cl, "channel", "client", c.client.channel));
      if (c.client.channel != "auto" && c.client.channel != "shm" && c.client.channel != "caf")
        return invalid_argument("client.channel: must be auto, shm or caf, not '" + c.client.channel + "'");
      if (cl["channel_spin_us"] && cl["channel_spin_us"].as<std::string>() == "0") c.client.channel_spin_us = 0;
      else FLX_TRY(get_uint(cl, "channel_spin_us", "client", c.client.channel_spin_us));
      if (c.client.channel_spin_us > 10000) return invalid_argument("client.channel_spin_us: must be <= 10000");
      FLX_TRY(get_uint(cl, "max_wait_ms", "client", c.client.max_wait_ms));
      FLX_TRY(get_str(cl, "owner_address", "client", c.client.owner_address));
      FLX_TRY(get_uint(cl, "rpc_timeout_ms", "client", c.client.rpc_timeout_ms));
    }
    FLX_TRY(get_str(root, "owner_address", "config", c.client.owner_address));
  } catch (const YAML::Exception& e) {
    return invalid_argument(std::string("config: ") + e.what());
  }
  if (c.owners.empty() && c.embedded()) c.owners = default_embedded_config().owners;
  FLX_TRY(validate(c));
  return c;
}

std::string describe(const ClusterConfig& c) {
  std::ostringstream o;
  auto roles = [](const std::vector<std::string>& r) {
    std::string s = "[";
    for (size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + r[i];
    return s + "]";
  };
  auto b = [](bool v) { return v ? "true" : "false"; };
  o << "cluster_name: " << c.cluster_name << "\n";
  if (!c.run_dir.empty()) o << "run_dir: " << c.run_dir << "\n";
  if (c.auth.enabled()) o << "auth: {key_file: " << c.auth.key_file << "}\n";
  // A master's keys, each line after the first led by `in` (the first by `first`).
  auto master = [&](const MasterConfig& m, const std::string& first, const std::string& in) {
    o << first << "listen_host: " << m.listen_host << "\n" << in << "port: " << m.port << "\n" << in
      << "metrics_port: " << m.metrics_port << "\n" << in << "get_inflight_ttl_ms: " << m.get_inflight_ttl_ms << "\n"
      << in << "kv_event_log_capacity: " << m.kv_event_log_capacity << "\n"
      << in << "replica_task_placement:\n" << in << "  remote_only_node_roles: " << roles(m.remote_only_node_roles)
      << "\n" << in << "  restrict_to_remote_only_node_roles: " << b(m.restrict_to_remote_only_node_roles) << "\n";
    if (m.replica_cache_capacity_ratio > 0) o << in << "replica_cache_capacity_ratio: " << m.replica_cache_capacity_ratio << "\n";
    if (m.replica_writeback_tier1_capacity_ratio > 0)
      o << in << "replica_writeback_tier1_capacity_ratio: " << m.replica_writeback_tier1_capacity_ratio << "\n";
  };
  if (c.ha()) {
    o << "etcd:\n  endpoints: [";
    for (size_t i = 0; i < c.etcd.endpoints.size(); ++i) o << (i ? ", " : "") << c.etcd.endpoints[i];
    o << "]\n  lease_ttl_ms: " << c.etcd.lease_ttl_ms << "\n";
    if (c.etcd.poll_ms_set) o << "  poll_ms: " << c.etcd.poll_ms_set << "\n";
    o << "masters:\n";
    for (const auto& x : c.masters) master(x, "  - ", "    ");
  } else {
    o << "master:\n";
    master(c.master, "  ", "  ");
  }
  o << (c.owners.empty() ? "owners: []\n" : "owners:\n");
  for (const auto& w : c.owners) {
    o << "  - node_id: " << w.node_id << "\n    role: " << w.role << "\n    listen_host: " << w.listen_host
      << "\n    port: " << w.port << "\n    metrics_port: " << w.metrics_port
      << "\n    contribute_to_cluster_pool_size: {dram: " << w.dram_bytes << "}"
      << "\n    local_reserve_grant_bytes: " << w.grant_bytes;
    if (w.expected_capacity)
      o << "\n    owner_local_reserve_expected_capacity: {value_len: " << w.expected_capacity->value_len
        << ", payload_capacity_bytes: " << w.expected_capacity->payload_capacity_bytes << "}";
    o << "\n    local_reserve_soft_wait_ms: " << w.soft_wait_ms << "\n    local_reserve_hard_timeout_ms: "
      << w.hard_timeout_ms << "\n    get_handle_ttl_ms: " << w.get_handle_ttl_ms
      << "\n    publish_retry_ms: " << w.publish_retry_ms << "\n    master_rpc_timeout_ms: " << w.master_rpc_timeout_ms
      << "\n    eviction: " << b(w.eviction) << "\n    eviction_max_bytes_per_round: " << w.eviction_max_bytes_per_round
      << "\n    eviction_interval_ms: " << w.eviction_interval_ms << "\n    eviction_tp_cohorts: "
      << b(w.eviction_tp_cohorts) << "\n    eviction_free_watermark: " << w.eviction_free_watermark
      << "\n    idle_grant_shrink_ms: " << w.idle_grant_shrink_ms
      << "\n    eviction_order: " << (w.eviction_prefix_depth ? "prefix_depth" : "tier");
    if (w.eviction_prefix_depth) {
      o << "\n    eviction_stale_turnover: ";
      if (w.eviction_stale_turnover == 0)
        o << "auto";
      else
        o << w.eviction_stale_turnover;
    }
    if (w.hot_writeback_ratio > 0) o << "\n    replica_writeback_hot_capacity_ratio: " << w.hot_writeback_ratio;
    if (w.spill_free_ratio > 0) o << "\n    spill_free_ratio: " << w.spill_free_ratio;
    o << "\n    writeback_demote: " << b(w.writeback_demote) << "\n    writeback_timeout_ms: " << w.writeback_timeout_ms
      << "\n    get_start_wait_ms: " << w.get_start_wait_ms << "\n    replica_task_max_inflight: " << w.replica_task_max_inflight;
    if (!w.data_host.empty()) o << "\n    data_host: " << w.data_host;
    o << "\n    data_port: " << w.data_port << "\n    data_transport: " << w.data_transport
      << "\n    data_threads: " << w.data_threads << "\n    data_timeout_ms: " << w.data_timeout_ms
      << "\n    client_channel: {enabled: " << b(w.client_channel_ring_bytes > 0);
    if (w.client_channel_ring_bytes > 0) o << ", ring_bytes: " << w.client_channel_ring_bytes;
    o << ", max_sessions: " << w.client_channel_max_sessions << ", spin_us: " << w.client_channel_spin_us << "}\n";
    const auto& f = w.fault_injection;
    if (f.enabled() || f.fetch_fail > 0)
      o << "    fault_injection: {seed: " << f.seed << ", drop: " << f.drop << ", duplicate: " << f.duplicate
        << ", fetch_fail: " << f.fetch_fail << ", max_delay_ms: " << f.max_delay_ms << "}\n";
  }
  o << "client:\n";
  if (!c.client.owner_address.empty()) o << "  owner_address: " << c.client.owner_address << "\n";
  o << "  rpc_timeout_ms: " << c.client.rpc_timeout_ms << "\n";
  if (c.client.max_wait_ms) o << "  max_wait_ms: " << c.client.max_wait_ms << "\n";
  o << "  channel: " << c.client.channel << "\n  channel_spin_us: " << c.client.channel_spin_us << "\n";
  return o.str();
}

Result<ClusterConfig> load_config_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return invalid_argument("config: cannot read '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  auto c = parse_config_text(ss.str());
  // A relative key_file is the config file's neighbour, wherever the command runs.
  if (c.ok() && c->auth.enabled() && c->auth.key_file[0] != '/') {
    const auto slash = path.rfind('/');
    if (slash != std::string::npos) c->auth.key_file = path.substr(0, slash + 1) + c->auth.key_file;
  }
  return c;
}

}  // namespace fluxon
