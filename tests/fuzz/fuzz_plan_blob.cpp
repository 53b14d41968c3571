// The plan-blob reader and the page-copy checks the KV kernels run first, on any blob and layout:
// a blob is taken only with its magic and the count the caller expects.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fluxon/kv/kv_layout.hpp"

using namespace fluxon::kv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint64_t> words(2 + size / 8);
  std::memcpy(words.data(), data, size);
  const size_t room = words.size() - 2;  // the values the blob can hold
  const size_t expected = size % (room + 1);
  auto r = plan_value_ptrs(reinterpret_cast<uint64_t>(words.data()), expected);
  if (r.ok() && (words[1] != expected || *r != words.data() + 2)) std::abort();
  return 0;
}
