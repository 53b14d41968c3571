// KV page layouts: the byte contract between SGLang's GPU KV cache and Fluxon values.
//
// GPU side (one TP rank): per layer, a K buffer and a V buffer `[token_slot][item]` (MLA: one latent
// buffer per layer), addressed by per-layer base pointers (SGLang's k_data_ptrs / v_data_ptrs).
// A page is `page_size` consecutive token slots: page p is token slots [p*P, (p+1)*P).
// item = head_num * head_dim * dtype_size bytes (MLA: kv_cache_dim * dtype_size).
//
// Value side (one value per page key, at a plan's value_ptrs[i]):
//   page_first : [K|V][layer][token in page][item]   value = 2 * L * P * item bytes
//   layer_first: [layer][K|V][token in page][item]   value = 2 * L * P * item bytes
//   mla        : [layer][token in page][item]        value =     L * P * item bytes
// For any (kv, layer, page) the P*item bytes are contiguous on both sides: every copy is a set
// of such chunks.
#pragma once
#include <cstddef>
#include <cstdint>

#include "fluxon/runtime/status.hpp"

namespace fluxon::kv {

enum class ValueLayout : uint8_t { kPageFirst, kLayerFirst, kMla };
enum class Direction : uint8_t { kBackup, kRestore };  // backup: GPU -> values; restore: values -> GPU

struct KvLayout {
  ValueLayout layout = ValueLayout::kPageFirst;
  uint32_t layer_num = 0;
  uint32_t page_size = 0;   // tokens per page
  uint64_t item_bytes = 0;  // per token per layer (per K or V)

  uint32_t kv_count() const { return layout == ValueLayout::kMla ? 1 : 2; }
  uint64_t chunk_bytes() const { return uint64_t(page_size) * item_bytes; }
  uint64_t value_bytes() const { return uint64_t(kv_count()) * layer_num * chunk_bytes(); }
  // Byte offset of the (kv, layer) chunk inside one value.
  uint64_t chunk_offset(uint32_t kv, uint32_t layer) const {
    switch (layout) {
      case ValueLayout::kPageFirst: return (uint64_t(kv) * layer_num + layer) * chunk_bytes();
      case ValueLayout::kLayerFirst: return (uint64_t(layer) * 2 + kv) * chunk_bytes();
      case ValueLayout::kMla: return uint64_t(layer) * chunk_bytes();
    }
    return 0;
  }
  Status validate() const;
};

// The pages of one copy: plan (value_ptrs), GPU buffers and the GPU page indices, index i of the
// plan going with page_indices[i]. k_ptrs/v_ptrs hold layer_num base addresses (v_ptrs unused for
// MLA). layer < 0: every layer; otherwise that layer only (layerwise restore).
struct PageCopy {
  uint64_t plan_ptr = 0;
  KvLayout layout;
  const uint64_t* k_ptrs = nullptr;
  const uint64_t* v_ptrs = nullptr;
  const int64_t* page_indices = nullptr;
  size_t page_count = 0;
  int layer = -1;
};

// Reads and checks a plan blob: magic, count == page_count.
Result<const uint64_t*> plan_value_ptrs(uint64_t plan_ptr, size_t expected_count);
Status validate(const PageCopy& c);

// The CPU reference of every layout and direction (also the path of a machine without a GPU):
// plain memcpy of each chunk. The GPU results are checked against it bit for bit.
Status copy_pages_cpu(Direction dir, const PageCopy& c);

}  // namespace fluxon::kv
