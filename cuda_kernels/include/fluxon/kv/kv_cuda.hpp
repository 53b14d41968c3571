// GPU copies between SGLang's KV cache and Fluxon values through plan blobs (CUDA). The values
// are Fluxon segment memory registered with CUDA in this process; no CPU loop touches bytes.
// Two paths behind one call: an SM kernel that reads the plan and copies every chunk (zero copy
// over the registered host memory), or the copy engines (cudaMemcpyBatchAsync), which leave the
// SMs to model compute.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fluxon/kv/kv_layout.hpp"

namespace fluxon::kv {

enum class CopyPath : uint8_t { kSmKernel, kCopyEngine };

// True when a CUDA device is usable; otherwise `why` says what is missing.
bool cuda_device_available(std::string* why);

// cudaHostRegister of [ptr, ptr+len): a failure is a synchronous error, never a silent fallback to
// unregistered memory (design: "CUDA host registration 失败 → direct path 同步失败").
Status cuda_register_host(void* ptr, size_t len);
Status cuda_unregister_host(void* ptr);

// One per stream: device scratch for the plan's pointers and page indices, reused across calls.
class GpuCopier {
 public:
  GpuCopier();
  ~GpuCopier();
  GpuCopier(const GpuCopier&) = delete;
  GpuCopier& operator=(const GpuCopier&) = delete;

  // Enqueues the copy on `stream` (a cudaStream_t). k_ptrs/v_ptrs/page_indices are host arrays;
  // k_ptrs/v_ptrs hold *device* base addresses of the KV buffers; value_ptrs are registered host
  // addresses. Returns once the work is queued (synchronise on the stream to wait for it).
  Status copy(Direction dir, const PageCopy& c, void* stream, CopyPath path);

  // write_pages_to_values / restore_pages_from_values, all layers or one (c.layer).
  Status write_pages_to_values(const PageCopy& c, void* stream, CopyPath path = CopyPath::kSmKernel) {
    return copy(Direction::kBackup, c, stream, path);
  }
  Status restore_pages_from_values(const PageCopy& c, void* stream, CopyPath path = CopyPath::kSmKernel) {
    return copy(Direction::kRestore, c, stream, path);
  }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon::kv
