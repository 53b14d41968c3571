// The data plane's request checks (DataServer) on any header and ranges: what is answered kOk reads
// only inside the segment, and its total is the sum of its ranges.
#include <cstdlib>
#include <cstring>

#include "fluxon/runtime/transport.hpp"

using namespace fluxon;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 24 + 9) return 0;
  uint64_t segment_len = 0;
  std::memcpy(&segment_len, data, 8);
  const bool generation_ok = data[8] & 1;
  data += 9, size -= 9;
  uint32_t count = 0;
  if (!data_header_ok(data, &count)) return 0;
  if (count == 0 || count > kDataMaxRanges) std::abort();
  const size_t have = (size - 24) / 16;
  if (count > have) count = uint32_t(have);  // the server reads exactly count ranges off the socket
  uint64_t total = 0;
  const DataStatus st = data_ranges_status(data + 24, count, generation_ok, segment_len, &total);
  if (st != DataStatus::kOk) return 0;
  if (!generation_ok) std::abort();
  unsigned __int128 sum = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t r[2];
    std::memcpy(r, data + 24 + size_t(i) * 16, 16);
    if (r[0] > segment_len || r[1] > segment_len - r[0]) std::abort();  // outside the segment
    sum += r[1];
  }
  if (sum != total) std::abort();
  return 0;
}
