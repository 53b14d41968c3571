// GPU copies between SGLang's KV cache and Fluxon values through plan blobs (CUDA). The values
// are Fluxon segment memory registered with CUDA in this process; no CPU loop touches bytes.
// Three paths behind one call: an SM kernel that reads the plan and copies every chunk (zero copy
// over the registered host memory) on every SM; the copy engines (cudaMemcpyBatchAsync), which
// leave the SMs to model compute; or a kernel on a few CTAs (kFewSm) that moves each chunk with
// Hopper's bulk copy engine (TMA: global -> shared -> global), leaving the other SMs to compute
// without the copy engines' per-descriptor cost at small pages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fluxon/kv/kv_layout.hpp"

namespace fluxon::kv {

enum class CopyPath : uint8_t { kSmKernel, kCopyEngine, kFewSm };

// kFewSm's default CTA count. Each CTA keeps 3 bulk loads of 16 KiB in flight (4 stages of 16 KiB
// of shared memory): 4 CTAs keep 192 KiB in flight, ~3x PCIe Gen5's bandwidth-delay product
// (~55 GB/s x ~1 us), on 4 of an H200's 132 SMs. Measured on the H200 (fluxon_kv_bench, 256 MiB of
// 16/64 KiB pages): 4 CTAs copy at the SM kernel's idle bandwidth (50-52 GB/s) and, beside a
// saturating bf16 GEMM, restore at 41-42 GB/s (49 on the highest-priority stream) and back up at
// 42-47 GB/s with the GEMM -6%..+7%; 8 CTAs back up no faster but slow the GEMM 50-70% (16: 120-130%);
// 2 CTAs lose idle bandwidth (33-45 GB/s). GpuCopier::set_few_sm_ctas changes it.
inline constexpr uint32_t kFewSmCtas = 4;

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

  // CTAs of the kFewSm path for the calls that follow (at least 1; default kFewSmCtas).
  void set_few_sm_ctas(uint32_t ctas);
  uint32_t few_sm_ctas() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon::kv
