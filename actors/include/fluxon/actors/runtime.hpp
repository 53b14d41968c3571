// The process-level entry points of the actor layer, free of CAF types so that the CLI, the client
// library and the Python binding do not pay CAF's compile cost.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/config.hpp"
#include "fluxon/runtime/owner_link.hpp"

namespace fluxon {

// Daemons: block until SIGINT/SIGTERM, then stop cleanly (the owner removes its segment).
// index: the master's entry in `masters:` (the HA mode); 0 with one master.
int run_master_daemon(const ClusterConfig& cfg, int index = 0);
int run_owner_daemon(const ClusterConfig& cfg, uint32_t node_id);

Result<std::unique_ptr<OwnerLink>> open_owner_link(const ClusterConfig& cfg, LinkCallbacks cb);

// `fluxon auth check HOST:PORT [--key FILE] [--json]` (auth_check.cpp): what a daemon's control
// port admits without the key, and with it.
int run_auth_check(const std::string& address, const std::string& key_file, bool json);

}  // namespace fluxon
