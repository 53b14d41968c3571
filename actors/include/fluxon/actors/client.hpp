// A KvClient over the actor layer's link (CAF remote actors, or an embedded cluster in process).
#pragma once
#include "fluxon/actors/runtime.hpp"
#include "fluxon/client/kv_client.hpp"

namespace fluxon {

inline Result<std::unique_ptr<KvClient>> open_client(const ClusterConfig& cfg) {
  return KvClient::open(cfg, open_owner_link);
}

}  // namespace fluxon
