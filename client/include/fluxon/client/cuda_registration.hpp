#pragma once
#include <vector>

#include "fluxon/client/kv_client.hpp"

namespace fluxon {

// Registers every segment this client maps with CUDA (cudaHostRegister) in this process, so the
// KV kernels can copy to and from value_ptrs directly. Fails synchronously when CUDA or the
// registration is not available: the caller must not fall back to unregistered memory.
Result<std::vector<SegmentInfo>> register_segments_with_cuda(KvClient& client);

}  // namespace fluxon
