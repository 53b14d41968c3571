#include "fluxon/runtime/status.hpp"

namespace fluxon {

std::string_view code_name(Code c) {
  switch (c) {
#define FLUXON_CODE_NAME(name, value, doc) \
  case Code::k##name:                      \
    return #name;
    FLUXON_STATUS_CODES(FLUXON_CODE_NAME)
#undef FLUXON_CODE_NAME
  }
  return "Unknown";
}

std::string Status::to_string() const {
  std::string s(code_name(code_));
  if (!message_.empty()) s += ": " + message_;
  return s;
}

}  // namespace fluxon
