#include "fluxon/runtime/status.hpp"

namespace fluxon {

std::string_view code_name(Code c) {
  switch (c) {
    case Code::kOk: return "Ok";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kKeyConflict: return "KeyConflict";
    case Code::kNoSpace: return "NoSpace";
    case Code::kLocalReserveTimeout: return "LocalReserveTimeout";
    case Code::kKeyNotFound: return "KeyNotFound";
    case Code::kGenerationMismatch: return "GenerationMismatch";
    case Code::kClosed: return "Closed";
    case Code::kTimeout: return "Timeout";
    case Code::kMalformedMessage: return "MalformedMessage";
    case Code::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  std::string s(code_name(code_));
  if (!message_.empty()) s += ": " + message_;
  return s;
}

}  // namespace fluxon
