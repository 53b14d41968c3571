#include "fluxon/client/cuda_registration.hpp"

#ifdef FLUXON_HAVE_CUDA
#include "fluxon/kv/kv_cuda.hpp"
#endif

namespace fluxon {

Result<std::vector<SegmentInfo>> register_segments_with_cuda(KvClient& client) {
#ifdef FLUXON_HAVE_CUDA
  std::string why;
  if (!kv::cuda_device_available(&why)) return Status(Code::kInternal, "CUDA is not usable here: " + why);
  auto segs = client.wait_local_segments_ready();
  if (!segs.ok()) return segs.status();
  for (const auto& s : *segs) {
    Status st = kv::cuda_register_host(reinterpret_cast<void*>(s.write_ptr), s.len);
    if (!st.is_ok()) return Status(Code::kInternal, "segment " + s.segment_label + ": " + st.message());
  }
  return segs;
#else
  (void)client;
  return Status(Code::kInternal, "this build of Fluxon has no CUDA support (nvcc was not found at build time)");
#endif
}

}  // namespace fluxon
