// FlatMap: a hash map whose entries live inline in one power-of-two array (linear probing,
// backward-shift deletion: no deleted markers). For small keys and values looked up by the
// million: a lookup is one memory miss (none after prefetch()), where std::unordered_map takes a
// bucket's and a node's, and an entry carries no allocator header. Entries move when the table
// grows or shifts: pointers into it last until the next insertion or erasure.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "fluxon/runtime/open_addressing.hpp"

namespace fluxon {

// A hash for 64-bit ids, sequential or packed (splitmix64's finalizer): FlatMap's probes need the
// low bits mixed.
struct MixHash {
  size_t operator()(uint64_t x) const {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return size_t(x ^ (x >> 31));
  }
};

template <class K, class V, class H>
class FlatMap {
  struct Slot {  // the flag and the key first: a probe reads them, in the slot's first cache line
    bool used = false;
    K key{};
    V value{};
  };

 public:
  FlatMap() : slots_(16) {}
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Starts fetching the slot where key's probe begins, all of it: a slot wider than the space left
  // in its first cache line ends in the next one.
  void prefetch(const K& key) const {
    const Slot* s = &slots_[H{}(key) & mask()];
    __builtin_prefetch(s);
    if constexpr (sizeof(Slot) > 8) __builtin_prefetch(reinterpret_cast<const char*>(s) + sizeof(Slot) - 1);
  }
  V* find(const K& key) {
    const size_t i = index_of(key);
    return i == kNone ? nullptr : &slots_[i].value;
  }
  const V* find(const K& key) const { return const_cast<FlatMap*>(this)->find(key); }
  // Inserts key -> value unless key is present; returns the value and whether it was inserted.
  std::pair<V*, bool> try_emplace(const K& key, V value) {
    if (V* v = find(key)) return {v, false};
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    size_t i = H{}(key) & mask();
    while (slots_[i].used) i = (i + 1) & mask();
    slots_[i] = Slot{true, key, std::move(value)};
    size_++;
    return {&slots_[i].value, true};
  }
  bool erase(const K& key) {
    const size_t i = index_of(key);
    if (i == kNone) return false;
    backward_shift_erase(slots_, i, [](const Slot& s) { return H{}(s.key); }, [](const Slot& s) { return s.used; });
    size_--;
    return true;
  }
  void clear() {
    slots_.assign(16, Slot{});
    size_ = 0;
  }
  template <class F>
  void for_each(F f) const {
    for (const Slot& s : slots_)
      if (s.used) f(s.key, s.value);
  }

 private:
  static constexpr size_t kNone = ~size_t(0);
  size_t mask() const { return slots_.size() - 1; }
  size_t index_of(const K& key) const {
    for (size_t i = H{}(key) & mask();; i = (i + 1) & mask()) {
      if (!slots_[i].used) return kNone;
      if (slots_[i].key == key) return i;
    }
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (Slot& s : old)
      if (s.used) {
        size_t i = H{}(s.key) & mask();
        while (slots_[i].used) i = (i + 1) & mask();
        slots_[i] = std::move(s);
      }
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace fluxon
