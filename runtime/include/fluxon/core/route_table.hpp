// The master's route table, sized for 100M keys: each key and its value live in one allocation
// (the key's bytes inline, no std::string), slots are (hash, node) pairs of an open-addressing table
// (linear probing, backward-shift deletion), and a value's first replica is inline
// (InlineList): most routes have one or two copies. Iterators and lookups speak std::string_view;
// `it->first` / `it->second` read like std::unordered_map's so the master's code stays plain.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string_view>
#include <utility>
#include <vector>

#include "fluxon/runtime/open_addressing.hpp"

namespace fluxon {

// A list whose first element is stored inline; the rest, if any, in one heap vector.
template <class T>
class InlineList {
 public:
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](size_t i) { return i == 0 ? first_ : (*rest_)[i - 1]; }
  const T& operator[](size_t i) const { return i == 0 ? first_ : (*rest_)[i - 1]; }
  void push_back(T v) {
    if (n_ == 0) {
      first_ = std::move(v);
    } else {
      if (!rest_) rest_ = std::make_unique<std::vector<T>>();
      rest_->push_back(std::move(v));
    }
    n_++;
  }
  void erase_at(size_t i) {
    if (i == 0 && n_ > 1) {
      first_ = std::move((*rest_)[0]);
      rest_->erase(rest_->begin());
    } else if (i > 0) {
      rest_->erase(rest_->begin() + std::ptrdiff_t(i - 1));
    }
    n_--;
    if (rest_ && rest_->empty()) rest_.reset();
  }
  template <class L>
  class Iter {
   public:
    Iter(L* l, size_t i) : l_(l), i_(i) {}
    auto& operator*() const { return (*l_)[i_]; }
    auto* operator->() const { return &(*l_)[i_]; }
    Iter& operator++() { return ++i_, *this; }
    bool operator!=(const Iter& o) const { return i_ != o.i_; }
    bool operator==(const Iter& o) const { return i_ == o.i_; }

   private:
    L* l_;
    size_t i_;
  };
  Iter<InlineList> begin() { return {this, 0}; }
  Iter<InlineList> end() { return {this, n_}; }
  Iter<const InlineList> begin() const { return {this, 0}; }
  Iter<const InlineList> end() const { return {this, n_}; }

 private:
  uint32_t n_ = 0;
  T first_{};
  std::unique_ptr<std::vector<T>> rest_;
};

template <class V>
class RouteTable {
  struct Node {
    V value;
    uint32_t len;
    char key[1];  // len bytes follow (allocated with the node)
    std::string_view k() const { return {key, len}; }
  };
  struct Slot {
    uint64_t hash = 0;
    Node* node = nullptr;
  };

 public:
  struct Ref {
    std::string_view first;
    V& second;
  };
  class iterator {
   public:
    iterator(const RouteTable* t, size_t i) : t_(t), i_(i) {}
    Ref operator*() const { return {t_->slots_[i_].node->k(), t_->slots_[i_].node->value}; }
    struct Arrow {
      Ref ref;
      Ref* operator->() { return &ref; }
    };
    Arrow operator->() const { return Arrow{**this}; }
    iterator& operator++() {
      do ++i_;
      while (i_ < t_->slots_.size() && !t_->slots_[i_].node);
      return *this;
    }
    bool operator==(const iterator& o) const { return i_ == o.i_; }
    bool operator!=(const iterator& o) const { return i_ != o.i_; }

   private:
    friend class RouteTable;
    const RouteTable* t_;
    size_t i_;
  };

  RouteTable() : slots_(16) {}
  ~RouteTable() { clear(); }
  RouteTable(const RouteTable&) = delete;
  RouteTable& operator=(const RouteTable&) = delete;
  RouteTable(RouteTable&& o) noexcept : slots_(16) { *this = std::move(o); }
  RouteTable& operator=(RouteTable&& o) noexcept {
    if (this != &o) {
      clear();
      slots_.swap(o.slots_);
      std::swap(size_, o.size_);
    }
    return *this;
  }

  size_t size() const { return size_; }
  iterator end() const { return {this, slots_.size()}; }
  iterator begin() const {
    iterator it{this, 0};
    if (!slots_.empty() && !slots_[0].node) ++it;
    return it;
  }
  iterator find(std::string_view key) const {
    const uint64_t h = hash(key);
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (!s.node) return end();
      if (s.hash == h && s.node->k() == key) return {this, i};
    }
  }
  size_t count(std::string_view key) const { return find(key) != end() ? 1 : 0; }
  // Inserts key -> value unless key is present; returns the entry and whether it was inserted.
  std::pair<iterator, bool> emplace(std::string_view key, V value) {
    if (auto it = find(key); it != end()) return {it, false};
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    void* mem = ::operator new(sizeof(Node) + key.size());
    Node* n = new (mem) Node{std::move(value), uint32_t(key.size()), {0}};
    std::memcpy(n->key, key.data(), key.size());
    const size_t i = place(hash(key), n);
    size_++;
    return {iterator{this, i}, true};
  }
  void erase(iterator it) {
    destroy(slots_[it.i_].node);
    backward_shift_erase(slots_, it.i_, [](const Slot& s) { return s.hash; }, [](const Slot& s) { return s.node != nullptr; });
    size_--;
  }
  void clear() {
    for (auto& s : slots_)
      if (s.node) destroy(s.node), s = Slot{};
    size_ = 0;
  }

 private:
  static uint64_t hash(std::string_view key) {
    uint64_t h = std::hash<std::string_view>{}(key);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
  }
  size_t mask() const { return slots_.size() - 1; }
  size_t place(uint64_t h, Node* n) {
    size_t i = h & mask();
    while (slots_[i].node) i = (i + 1) & mask();
    slots_[i] = Slot{h, n};
    return i;
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (auto& s : old)
      if (s.node) place(s.hash, s.node);
  }
  static void destroy(Node* n) {
    n->~Node();
    ::operator delete(n);
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace fluxon
