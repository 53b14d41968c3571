#include "fluxon/kv/kv_layout.hpp"

#include <cstring>

namespace fluxon::kv {

constexpr uint64_t kPlanMagic = 0x4658504C414E5631ull;  // the plan blob ABI (SPEC.md §3)

Status KvLayout::validate() const {
  if (layer_num == 0) return invalid_argument("layout.layer_num: must be > 0");
  if (page_size == 0) return invalid_argument("layout.page_size: must be > 0");
  if (item_bytes == 0) return invalid_argument("layout.item_bytes: must be > 0");
  return Status::ok();
}

Result<const uint64_t*> plan_value_ptrs(uint64_t plan_ptr, size_t expected_count) {
  if (plan_ptr == 0) return invalid_argument("plan_ptr: null");
  const auto* blob = reinterpret_cast<const uint64_t*>(plan_ptr);
  if (blob[0] != kPlanMagic) return invalid_argument("plan_ptr: not a Fluxon plan blob (bad magic)");
  if (blob[1] != expected_count)
    return invalid_argument("plan_ptr: plan holds " + std::to_string(blob[1]) + " values, " +
                            std::to_string(expected_count) + " page indices given");
  return blob + 2;
}

Status validate(const PageCopy& c) {
  if (Status s = c.layout.validate(); !s.is_ok()) return s;
  if (c.page_count == 0) return invalid_argument("page_indices: empty");
  if (!c.k_ptrs || (c.layout.kv_count() == 2 && !c.v_ptrs))
    return invalid_argument("k_ptrs/v_ptrs: missing per-layer base pointers");
  if (!c.page_indices) return invalid_argument("page_indices: null");
  if (c.layer >= int(c.layout.layer_num)) return invalid_argument("layer: out of range");
  // The plan's count first: page_count must agree with it before page_indices is read.
  if (auto p = plan_value_ptrs(c.plan_ptr, c.page_count); !p.ok()) return p.status();
  for (size_t i = 0; i < c.page_count; ++i)
    if (c.page_indices[i] < 0) return invalid_argument("page_indices[" + std::to_string(i) + "]: negative");
  return Status::ok();
}

Status copy_pages_cpu(Direction dir, const PageCopy& c) {
  if (Status s = validate(c); !s.is_ok()) return s;
  auto ptrs = plan_value_ptrs(c.plan_ptr, c.page_count);
  if (!ptrs.ok()) return ptrs.status();
  const KvLayout& L = c.layout;
  const uint32_t l0 = c.layer < 0 ? 0 : uint32_t(c.layer);
  const uint32_t l1 = c.layer < 0 ? L.layer_num : l0 + 1;
  const uint64_t chunk = L.chunk_bytes();
  for (size_t i = 0; i < c.page_count; ++i) {
    auto* value = reinterpret_cast<uint8_t*>((*ptrs)[i]);
    const uint64_t gpu_off = uint64_t(c.page_indices[i]) * chunk;
    for (uint32_t layer = l0; layer < l1; ++layer) {
      for (uint32_t kv = 0; kv < L.kv_count(); ++kv) {
        auto* gpu = reinterpret_cast<uint8_t*>((kv == 0 ? c.k_ptrs : c.v_ptrs)[layer]) + gpu_off;
        uint8_t* val = value + L.chunk_offset(kv, layer);
        if (dir == Direction::kBackup) std::memcpy(val, gpu, chunk);
        else std::memcpy(gpu, val, chunk);
      }
    }
  }
  return Status::ok();
}

}  // namespace fluxon::kv
