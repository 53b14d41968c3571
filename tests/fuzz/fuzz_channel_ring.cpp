// The shared-memory channel's entry parser (Consumer::pop) on a ring the other process wrote: the
// input is the producer's tail (8 bytes) and the ring's bytes. Entries must stay within what was
// published; anything else is refused as corrupt.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fluxon/runtime/channel.hpp"

using namespace fluxon::channel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr uint32_t kCap = 4096;
  if (size < 16) return 0;
  static RingCtl ctl;
  uint64_t head = 0, tail = 0;
  std::memcpy(&head, data, 8);
  std::memcpy(&tail, data + 8, 8);
  head %= 1u << 20;  // any start: positions count bytes and never wrap
  std::vector<uint8_t> ring(kCap);
  std::memcpy(ring.data(), data + 16, std::min<size_t>(size - 16, kCap));
  ctl.head.store(head);
  ctl.tail.store(head + tail % (2 * kCap));
  Consumer c(&ctl, ring.data(), kCap);
  Entry e;
  std::string why;
  for (int i = 0; i < 1024; ++i) {
    const auto p = c.pop(e, &why);
    if (p != Consumer::Pop::kEntry) break;
    if (e.payload.size() > max_payload(kCap) || ctl.head.load() > ctl.tail.load()) std::abort();
  }
  return 0;
}
