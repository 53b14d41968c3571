#include "fluxon/messages/codec.hpp"

namespace fluxon {

Bytes encode(const Envelope& env) {
  flatbuffers::FlatBufferBuilder fbb(256);
  fbb.Finish(wire::Envelope::Pack(fbb, &env));
  return Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

Result<const wire::Envelope*> verify_envelope(const uint8_t* data, size_t len) {
  if (data == nullptr || len < 8)
    return Status(Code::kMalformedMessage, "message of " + std::to_string(len) + " bytes is truncated");
  flatbuffers::Verifier v(data, len, /*max_depth=*/16, /*max_tables=*/1u << 20);
  if (!v.VerifyBuffer<wire::Envelope>(nullptr))
    return Status(Code::kMalformedMessage, "message of " + std::to_string(len) + " bytes failed verification");
  const wire::Envelope* env = wire::GetEnvelope(data);
  if (env->version() != 1)
    return Status(Code::kMalformedMessage, "unsupported wire version " + std::to_string(env->version()));
  if (env->body_type() == wire::Body::NONE) return Status(Code::kMalformedMessage, "message without a body");
  return env;
}

Result<std::unique_ptr<Envelope>> decode(const uint8_t* data, size_t len) {
  auto env = verify_envelope(data, len);
  if (!env.ok()) return env.status();
  return std::unique_ptr<Envelope>((*env)->UnPack());
}

// The wire enum (fluxon.fbs) spells the same codes: same names, same values.
#define FLUXON_CHECK_WIRE_CODE(name, value, doc)                                         \
  static_assert(static_cast<int>(wire::ErrCode::name) == static_cast<int>(Code::k##name), \
                "fluxon.fbs ErrCode::" #name " differs from FLUXON_STATUS_CODES");
FLUXON_STATUS_CODES(FLUXON_CHECK_WIRE_CODE)
#undef FLUXON_CHECK_WIRE_CODE
static_assert(static_cast<int>(wire::ErrCode::MAX) == static_cast<int>(Code::kPermissionDenied),
              "fluxon.fbs ErrCode has a code FLUXON_STATUS_CODES lacks");

wire::ErrorT to_wire(const Status& s) {
  wire::ErrorT e;
  e.code = static_cast<wire::ErrCode>(s.code());
  e.message = s.message();
  e.indices = s.indices;
  for (auto r : s.reasons) e.reasons.push_back(static_cast<uint8_t>(r));
  e.stage = s.stage;
  return e;
}

Status from_wire(const wire::ErrorT& e) {
  auto code = static_cast<uint8_t>(e.code);
  if (code == 0 || code > static_cast<uint8_t>(Code::kPermissionDenied))
    return Status(Code::kInternal, "error with unknown code " + std::to_string(code) + ": " + e.message);
  Status s(static_cast<Code>(code), e.message);
  s.indices = e.indices;
  for (auto r : e.reasons) s.reasons.push_back(r ? ConflictReason::kInflight : ConflictReason::kExists);
  s.stage = e.stage;
  return s;
}

Envelope error_envelope(const Status& s) { return make_envelope(to_wire(s)); }

Status envelope_status(const Envelope& e) {
  if (auto* err = e.body.AsError()) return from_wire(*err);
  return Status::ok();
}

const char* body_name(const Envelope& e) { return wire::EnumNameBody(e.body.type); }

}  // namespace fluxon
