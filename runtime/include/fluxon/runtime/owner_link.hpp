// The client's transport seam: how a KvClient reaches its owner. The actor layer implements it over
// CAF (fluxon::open_owner_link in actors/); the client library sees only this interface, so
// client/ does not depend on actors/ and another transport (or a simulated one) can stand in.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/config.hpp"

namespace fluxon {

struct LinkInfo {
  uint32_t node_id = 0;
  uint64_t generation = 0;
  uint64_t session_id = 0;
  std::string segment_name;
  uint64_t segment_len = 0;
  uint32_t get_handle_ttl_ms = 0;
  uint64_t grant_bytes = 0;
  bool embedded = false;
};

struct LinkCallbacks {
  // One-way notes from the owner (PutLive). Called on an actor thread: keep it short.
  std::function<void(Envelope&)> on_note;
  // The owner went away (process died, connection lost).
  std::function<void()> on_down;
};

// The client's control channel to its owner. Embedded: master and owner actors run inside this
// process. External: a CAF remote actor over TCP.
class OwnerLink {
 public:
  virtual ~OwnerLink() = default;
  virtual const LinkInfo& info() const = 0;
  virtual Result<std::unique_ptr<Envelope>> call(const Envelope& req, uint32_t timeout_ms) = 0;
  // Sends raw bytes as a request (tests: malformed messages must be answered with an error).
  virtual Result<std::unique_ptr<Envelope>> call_raw(Bytes bytes, uint32_t timeout_ms) = 0;
  virtual void notify(const Envelope& note) = 0;
  // A request to the master this process reaches (embedded: in-process; external: none).
  virtual Result<std::unique_ptr<Envelope>> call_master(const Envelope& req, uint32_t timeout_ms) = 0;
};

// Opens a link to the owner a client config names (or to an embedded cluster).
using OwnerLinkFactory = std::function<Result<std::unique_ptr<OwnerLink>>(const ClusterConfig&, LinkCallbacks)>;

}  // namespace fluxon
