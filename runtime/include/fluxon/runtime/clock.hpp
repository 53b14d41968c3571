// The one monotonic millisecond clock of the I/O edges (actors, the etcd drivers): E1's lease bound
// is computed by one thread and checked by another, so both must read the same clock.
#pragma once
#include <chrono>
#include <cstdint>

namespace fluxon {

inline int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace fluxon
