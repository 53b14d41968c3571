// Cluster configuration (YAML; JSON is valid YAML). Parsed and validated once, at the edge:
// every rejection names the field.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fluxon/owner/owner_config.hpp"
#include "fluxon/runtime/reserve_pool.hpp"
#include "fluxon/runtime/status.hpp"

namespace fluxon {

// Where to connect to a daemon that listens on `h` ("0.0.0.0" listens everywhere: this host's loopback).
inline std::string connect_host(const std::string& h) { return h == "0.0.0.0" ? "127.0.0.1" : h; }

struct MasterConfig {
  std::string listen_host = "127.0.0.1";
  uint16_t port = 7600;
  uint16_t metrics_port = 0;  // 0: no /metrics endpoint
  uint32_t get_inflight_ttl_ms = 60000;  // a prepared remote get not done or revoked by then expires
  // Route-change events the master keeps for readers (docs/events.md), with up to 128 bytes of key
  // each: 23 MiB at the default, taken as events come; 0: none.
  uint64_t kv_event_log_capacity = uint64_t(1) << 17;
  // replica_task_placement: replica tasks go to owners of remote_only_node_roles and, with
  // restrict_to_remote_only_node_roles (the default), only there: with none registered a task is
  // refused (NoSpace), never sent to another GPU owner. Not restricted: any owner may take one.
  // (replica_target_roles: the old name of remote_only_node_roles, strict.)
  std::vector<std::string> remote_only_node_roles{"remote_cache"};
  bool restrict_to_remote_only_node_roles = true;
  // The master's route tiers (MasterCore::set_tiers), shares of each owner's segment; 0 = off.
  // replica_cache_capacity_ratio: T2; replica_writeback_tier1_capacity_ratio: T1 (below T2, and only
  // with strict placement: a write-back must not land on another GPU owner).
  double replica_cache_capacity_ratio = 0;
  double replica_writeback_tier1_capacity_ratio = 0;
  // "host:port" an owner connects to (the HA mode's leader record holds it).
  std::string address() const { return connect_host(listen_host) + ":" + std::to_string(port); }
  // The roles a replica target may have (what the master uses).
  std::vector<std::string> replica_target_roles() const {
    if (restrict_to_remote_only_node_roles) return remote_only_node_roles;
    return {"remote_cache", "sglang_owner"};
  }
};

// An owner's whole configuration: its core's slice (fluxon/owner/owner_config.hpp) and the I/O
// around it — where it listens, its segment, its data plane and the faults it injects.
struct OwnerConfig : OwnerCoreConfig {
  std::string listen_host = "127.0.0.1";
  uint16_t port = 7610;
  uint16_t metrics_port = 0;
  uint64_t dram_bytes = 1ull << 30;                 // contribute_to_cluster_pool_size.dram
  // Data plane: peers fetch this owner's bytes from data_host:data_port (0: any free port).
  // data_host defaults to listen_host (127.0.0.1 when that is 0.0.0.0).
  std::string data_host;
  uint16_t data_port = 0;
  std::string data_transport = "auto";  // auto | tcp | rdma (rdma fails at start without a device)
  uint32_t data_threads = 2;            // fetch threads (one peer batch each at a time)
  uint32_t data_timeout_ms = 10000;     // a fetch that moves no byte for this long fails
  // client_channel: same-host clients talk to this owner through shared memory (channel.hpp).
  // ring_bytes 0: off (every client goes over CAF). Daemons only: an embedded owner shares its process.
  uint32_t client_channel_ring_bytes = 1u << 20;
  uint32_t client_channel_max_sessions = 256;
  uint32_t client_channel_spin_us = 20;
  std::string advertised_data_host() const {
    if (!data_host.empty()) return data_host;
    return connect_host(listen_host);
  }
  // Faults injected on this owner's requests to the master (tests of T1 with real processes):
  // each request is dropped, duplicated or delayed with these odds, from one seed; and each
  // data-plane fetch batch fails with odds fetch_fail after its bytes arrived (a peer reset late).
  struct FaultInjection {
    uint64_t seed = 0;
    double drop = 0, duplicate = 0, fetch_fail = 0;
    uint32_t max_delay_ms = 0;
    bool enabled() const { return drop > 0 || duplicate > 0 || max_delay_ms > 0; }
  } fault_injection;
};

struct ClientConfig {
  std::string owner_address;        // host:port; empty = embedded mode
  uint32_t rpc_timeout_ms = 60000;
  // > 0: no call waits longer than this for slots, the master or a remote fetch (the owner answers
  // Timeout / LocalReserveTimeout / a local-only prefix by then), and no call waits longer than
  // this plus 1 s for any answer. For callers with a deadline of their own (SGLang's threads).
  uint32_t max_wait_ms = 0;
  // channel: how an external client reaches its owner. auto: the shared-memory channel when the
  // owner is on this host (its listener answers), else CAF; shm: the channel or an error; caf: CAF.
  std::string channel = "auto";
  uint32_t channel_spin_us = 50;  // a caller spins this long for its reply before it sleeps
};

// The HA mode's coordination: etcd's v3 API (its JSON gateway) at these endpoints.
struct EtcdConfig {
  std::vector<std::string> endpoints;  // "http://host:port"
  // The leader's lease: a killed leader is replaced within about this long (etcd grants whole seconds).
  uint32_t lease_ttl_ms = 2000;
  bool enabled() const { return !endpoints.empty(); }
  // How often a standby master reads the leadership key besides its watch (which brings every change
  // at once; a follower that cannot watch retries every min(poll_ms, 200 ms)): etcd.poll_ms, or TTL/10
  // within [20, 200] ms.
  uint32_t poll_ms_set = 0;
  uint32_t poll_ms() const {
    return poll_ms_set ? poll_ms_set : std::max<uint32_t>(20, std::min<uint32_t>(lease_ttl_ms / 10, 200));
  }
};

// auth: {key_file: PATH} (runtime/auth.hpp, docs/security.md). Without it every daemon listens on
// loopback only: validate() refuses another address.
struct AuthConfig {
  std::string key_file;
  bool enabled() const { return !key_file.empty(); }
};

// Whether `host` names this machine's loopback only (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);

struct ClusterConfig {
  std::string cluster_name = "fluxon";
  AuthConfig auth;
  std::string run_dir;              // pid files and logs of `fluxon cluster`; default /tmp/fluxon-<name>
  // The single-master mode's master; in the HA mode, masters[0] (what tools that need one read).
  MasterConfig master;
  // The HA mode: these masters campaign through etcd; the one elected serves (`fluxon master --index N`).
  std::vector<MasterConfig> masters;
  EtcdConfig etcd;
  bool ha() const { return !masters.empty(); }
  std::vector<OwnerConfig> owners;
  ClientConfig client;
  bool embedded() const { return client.owner_address.empty(); }
  // The owner section with this node id (or the first when node_id == 0).
  Result<OwnerConfig> owner(uint32_t node_id) const;
};

// The embedded profile when no config is given: sized for a laptop.
ClusterConfig default_embedded_config();

Result<ClusterConfig> parse_config_text(const std::string& yaml_text);
Result<ClusterConfig> load_config_file(const std::string& path);
Status validate(const ClusterConfig& c);
// The resolved configuration, every field with its value (defaults included), as YAML that
// parse_config_text reads back to the same configuration (`fluxon config check`).
std::string describe(const ClusterConfig& c);
// "4GiB", "512MiB", "4096", "1.5GB" -> bytes.
Result<uint64_t> parse_bytes(const std::string& s);

}  // namespace fluxon
