#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "fluxon/kv/kv_layout.hpp"

using namespace fluxon;
using namespace fluxon::kv;

namespace {
constexpr uint64_t kMagic = 0x4658504C414E5631ull;

struct Fixture {
  KvLayout L;
  size_t gpu_pages;
  std::vector<std::vector<uint8_t>> k, v;  // per layer: [gpu_pages * P][item]
  std::vector<std::vector<uint8_t>> values;
  std::vector<uint64_t> blob, kp, vp;
  std::vector<int64_t> pages;

  Fixture(KvLayout l, size_t gpu_pages_, std::vector<int64_t> pg) : L(l), gpu_pages(gpu_pages_), pages(std::move(pg)) {
    std::mt19937 rng(5);
    for (uint32_t layer = 0; layer < L.layer_num; ++layer) {
      k.emplace_back(gpu_pages * L.chunk_bytes());
      v.emplace_back(gpu_pages * L.chunk_bytes());
      for (auto& b : k.back()) b = uint8_t(rng());
      for (auto& b : v.back()) b = uint8_t(rng());
      kp.push_back(reinterpret_cast<uint64_t>(k.back().data()));
      vp.push_back(reinterpret_cast<uint64_t>(v.back().data()));
    }
    blob = {kMagic, pages.size()};
    for (size_t i = 0; i < pages.size(); ++i) {
      values.emplace_back(L.value_bytes(), 0);
      blob.push_back(reinterpret_cast<uint64_t>(values.back().data()));
    }
  }
  PageCopy copy(int layer = -1) {
    PageCopy c;
    c.plan_ptr = reinterpret_cast<uint64_t>(blob.data());
    c.layout = L;
    c.k_ptrs = kp.data();
    c.v_ptrs = vp.data();
    c.page_indices = pages.data();
    c.page_count = pages.size();
    c.layer = layer;
    return c;
  }
  // The byte of (kv, layer, token, byte) of GPU page p.
  uint8_t gpu(uint32_t kv, uint32_t layer, int64_t p, uint32_t t, uint64_t b) {
    return (kv == 0 ? k : v)[layer][(p * L.page_size + t) * L.item_bytes + b];
  }
};
}  // namespace

TEST_CASE("kv layouts: value sizes and chunk offsets are the documented byte contract") {
  KvLayout pf{ValueLayout::kPageFirst, 4, 16, 256};
  CHECK(pf.value_bytes() == 2ull * 4 * 16 * 256);
  CHECK(pf.chunk_offset(1, 2) == (1ull * 4 + 2) * 16 * 256);  // [K|V][layer]
  KvLayout lf{ValueLayout::kLayerFirst, 4, 16, 256};
  CHECK(lf.chunk_offset(1, 2) == (2ull * 2 + 1) * 16 * 256);  // [layer][K|V]
  KvLayout mla{ValueLayout::kMla, 4, 64, 1152};
  CHECK(mla.value_bytes() == 4ull * 64 * 1152);
  CHECK(mla.chunk_offset(0, 3) == 3ull * 64 * 1152);
}

TEST_CASE("kv cpu reference: page_first backup puts token t of layer l at the documented offset") {
  Fixture f({ValueLayout::kPageFirst, 3, 4, 32}, 10, {7, 2, 9});
  REQUIRE(copy_pages_cpu(Direction::kBackup, f.copy()).is_ok());
  for (size_t i = 0; i < f.pages.size(); ++i)
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t layer = 0; layer < 3; ++layer)
        for (uint32_t t = 0; t < 4; ++t)
          for (uint64_t b = 0; b < 32; b += 7)
            CHECK(f.values[i][((kv * 3 + layer) * 4 + t) * 32 + b] == f.gpu(kv, layer, f.pages[i], t, b));
}

TEST_CASE("kv cpu reference: every layout round-trips, layerwise restore touches one layer") {
  for (auto layout : {ValueLayout::kPageFirst, ValueLayout::kLayerFirst, ValueLayout::kMla}) {
    Fixture f({layout, 4, 16, 64}, 20, {3, 17, 0, 11, 5});
    REQUIRE(copy_pages_cpu(Direction::kBackup, f.copy()).is_ok());
    auto k0 = f.k, v0 = f.v;
    for (auto& l : f.k) std::fill(l.begin(), l.end(), 0);
    for (auto& l : f.v) std::fill(l.begin(), l.end(), 0);
    REQUIRE(copy_pages_cpu(Direction::kRestore, f.copy(2)).is_ok());
    for (uint32_t layer = 0; layer < 4; ++layer) {
      for (int64_t p : f.pages) {
        const uint64_t off = uint64_t(p) * f.L.chunk_bytes();
        const bool same = std::memcmp(f.k[layer].data() + off, k0[layer].data() + off, f.L.chunk_bytes()) == 0;
        CHECK(same == (layer == 2));
      }
    }
    for (uint32_t layer = 0; layer < 4; ++layer) REQUIRE(copy_pages_cpu(Direction::kRestore, f.copy(int(layer))).is_ok());
    for (uint32_t layer = 0; layer < 4; ++layer)
      for (int64_t p : f.pages) {
        const uint64_t off = uint64_t(p) * f.L.chunk_bytes();
        CHECK(std::memcmp(f.k[layer].data() + off, k0[layer].data() + off, f.L.chunk_bytes()) == 0);
        if (layout != ValueLayout::kMla)
          CHECK(std::memcmp(f.v[layer].data() + off, v0[layer].data() + off, f.L.chunk_bytes()) == 0);
      }
  }
}

TEST_CASE("kv cpu reference: bad plans and arguments are rejected before any byte moves") {
  Fixture f({ValueLayout::kPageFirst, 2, 4, 16}, 4, {1, 2});
  auto c = f.copy();
  c.page_count = 3;
  CHECK(copy_pages_cpu(Direction::kBackup, c).code() == Code::kInvalidArgument);
  f.blob[0] = 1;
  CHECK(copy_pages_cpu(Direction::kBackup, f.copy()).code() == Code::kInvalidArgument);
  f.blob[0] = kMagic;
  auto bad = f.copy(5);
  CHECK(copy_pages_cpu(Direction::kBackup, bad).code() == Code::kInvalidArgument);
  f.pages[1] = -1;
  CHECK(copy_pages_cpu(Direction::kBackup, f.copy()).code() == Code::kInvalidArgument);
  for (auto& v : f.values)
    for (auto b : v) CHECK(b == 0);
}
