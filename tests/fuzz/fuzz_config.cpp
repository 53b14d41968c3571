// The cluster config loader on any text: an error naming a field, never a crash or an exception.
#include "fluxon/runtime/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c = fluxon::parse_config_text(std::string(reinterpret_cast<const char*>(data), size));
  if (c.ok()) (void)fluxon::describe(*c);  // what parses also prints
  return 0;
}
