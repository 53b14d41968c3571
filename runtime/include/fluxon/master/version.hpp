// A route's version: the copy's origin (node, generation, put_id), the identity a put keeps
// wherever its copies go (T1).
#pragma once
#include <cstdint>

namespace fluxon {

struct Version {
  uint32_t origin_node = 0;
  uint64_t origin_generation = 0;
  uint64_t put_id = 0;
  bool operator==(const Version&) const = default;
};

}  // namespace fluxon
