// KeyIndex<V>: string keys -> V for tables read a batch at a time (the owner's local index). Each
// entry is a node of its own (its address lasts until it is erased); a power-of-two array of
// (hash, node) slots finds it (linear probing, backward-shift deletion). A lookup is three
// dependent memory misses - the slot, the node, the key's bytes - where std::unordered_map takes
// four (the bucket, the node before, the node, the key). find_many() looks up a whole batch in
// stages, prefetching every key's slot, then every candidate node, then every candidate's key
// bytes, so a batch pays about three miss latencies instead of three per key (measured on the owner's
// 128-key get_start: docs/measured.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fluxon/runtime/open_addressing.hpp"

namespace fluxon {

// A hash for std::unordered_map<std::string, ...> that also finds a std::string_view (no string
// built for the lookup): with std::equal_to<>.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Hash: of a std::string_view (a test gives one that collides).
template <class V, class Hash = std::hash<std::string_view>>
class KeyIndex {
 public:
  struct value_type {
    const std::string first;
    V second;
  };
  // The hash find() probes with (by default std::hash of the key's bytes: the value
  // std::hash<std::string> gives, so a caller can hand it on to a table keyed by std::string).
  static uint64_t hash(std::string_view key) { return Hash{}(key); }

  KeyIndex() : slots_(16) {}
  ~KeyIndex() { clear(); }
  KeyIndex(const KeyIndex&) = delete;
  KeyIndex& operator=(const KeyIndex&) = delete;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  value_type* find(std::string_view key) const { return find(key, hash(key)); }
  value_type* find(std::string_view key, uint64_t h) const {
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (!s.node) return nullptr;
      if (s.hash == h && s.node->first == key) return s.node;
    }
  }

  // out[i] = find(keys[i]) and hashes[i] = hash(keys[i]) for every i < n, in stages (see above).
  // keys: anything indexable by size_t that converts to std::string_view; Out: value_type* or
  // const value_type*.
  template <class Keys, class Out>
  void find_many(const Keys& keys, size_t n, Out* out, uint64_t* hashes) const {
    const Slot* base = slots_.data();
    const size_t m = mask();
    for (size_t i = 0; i < n; ++i) {
      hashes[i] = hash(std::string_view(keys[i]));
      __builtin_prefetch(base + (hashes[i] & m));
    }
    // The first slot of each probe whose hash matches (nearly always the entry itself), or null.
    for (size_t i = 0; i < n; ++i) {
      out[i] = nullptr;
      for (size_t j = hashes[i] & m;; j = (j + 1) & m) {
        if (!base[j].node) break;
        if (base[j].hash == hashes[i]) {
          out[i] = base[j].node;
          __builtin_prefetch(out[i]);
          break;
        }
      }
    }
    for (size_t i = 0; i < n; ++i)
      if (out[i]) __builtin_prefetch(out[i]->first.data());
    for (size_t i = 0; i < n; ++i)
      if (out[i] && out[i]->first != std::string_view(keys[i]))
        out[i] = find(std::string_view(keys[i]), hashes[i]);  // a 64-bit hash shared by two keys
  }

  // Sets key -> v; returns the node and whether it is new (a present key keeps its node).
  std::pair<value_type*, bool> insert_or_assign(std::string_view key, V v) {
    const uint64_t h = hash(key);
    if (value_type* n = find(key, h)) {
      n->second = std::move(v);
      return {n, false};
    }
    if ((size_ + 1) * 2 > slots_.size()) grow();
    auto* n = new value_type{std::string(key), std::move(v)};
    place(h, n);
    size_++;
    return {n, true};
  }

  void erase(value_type* n) {
    const uint64_t h = hash(n->first);
    size_t i = h & mask();
    while (slots_[i].node != n) i = (i + 1) & mask();
    backward_shift_erase(slots_, i, [](const Slot& s) { return s.hash; }, [](const Slot& s) { return s.node != nullptr; });
    size_--;
    delete n;
  }

  void clear() {
    for (Slot& s : slots_) delete s.node;
    slots_.assign(16, Slot{});
    size_ = 0;
  }

  // Iteration in slot order (stable while nothing is inserted or erased).
  class const_iterator {
   public:
    const_iterator(const KeyIndex* t, size_t i) : t_(t), i_(i) { skip(); }
    const value_type& operator*() const { return *t_->slots_[i_].node; }
    const value_type* operator->() const { return t_->slots_[i_].node; }
    const_iterator& operator++() {
      ++i_;
      skip();
      return *this;
    }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }

   private:
    void skip() {
      while (i_ < t_->slots_.size() && !t_->slots_[i_].node) ++i_;
    }
    const KeyIndex* t_;
    size_t i_;
  };
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, slots_.size()); }

 private:
  struct Slot {
    uint64_t hash = 0;
    value_type* node = nullptr;
  };
  size_t mask() const { return slots_.size() - 1; }
  void place(uint64_t h, value_type* n) {
    size_t i = h & mask();
    while (slots_[i].node) i = (i + 1) & mask();
    slots_[i] = Slot{h, n};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.node) place(s.hash, s.node);
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace fluxon
