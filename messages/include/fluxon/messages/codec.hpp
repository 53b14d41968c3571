// Encoding and decoding of the wire Envelope (FlatBuffers, object API). decode() verifies the
// buffer first: a malformed or truncated message is an error value, never a crash.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "fluxon/runtime/status.hpp"
#include "fluxon_generated.h"

namespace fluxon {

using Envelope = wire::EnvelopeT;
using Bytes = std::vector<uint8_t>;

Bytes encode(const Envelope& env);
Result<std::unique_ptr<Envelope>> decode(const uint8_t* data, size_t len);
// decode()'s checks (verification, the wire version, a body) without unpacking: the message read in
// place. The pointer is into `data`, which must outlive it.
Result<const wire::Envelope*> verify_envelope(const uint8_t* data, size_t len);
inline Result<std::unique_ptr<Envelope>> decode(const Bytes& b) { return decode(b.data(), b.size()); }

template <class T>
Envelope make_envelope(T body, uint64_t session = 0, uint64_t generation = 0) {
  Envelope e;
  e.session_id = session;
  e.generation = generation;
  e.body.Set(std::move(body));
  return e;
}

wire::ErrorT to_wire(const Status& s);
Status from_wire(const wire::ErrorT& e);
Envelope error_envelope(const Status& s);
// The Status an envelope carries: ok unless its body is an Error.
Status envelope_status(const Envelope& e);
const char* body_name(const Envelope& e);

}  // namespace fluxon
