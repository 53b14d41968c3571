// PrefixChains<K>: the radix chains of the pages a cache holds. A KV page is worth nothing once a
// page before it in its prefix is gone — a restore stops at the first miss — so capacity eviction
// takes leaves (pages no held page continues) before the pages they continue: a chain is eaten from
// its tail, its prefix stays servable, and no orphaned suffix is kept over a live prefix.
//
// Each held key names its parent (the page before it; none for a root or when unknown); the parent
// need not be held. Plain state, no locks: one owner of it (an owner core, a benchmark).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <utility>

namespace fluxon {

template <class K>
class PrefixChains {
 public:
  // key is held now, continuing `parent` (has_parent false: a root, or no chain known). A key
  // linked again moves to its new parent.
  void link(const K& key, const K& parent, bool has_parent = true) {
    unlink(key);
    if (!has_parent) return;
    parent_.emplace(key, parent);
    children_[parent]++;
  }
  // key is no longer held: its parent has one child fewer. (Its own children keep naming it.)
  void unlink(const K& key) {
    auto p = parent_.find(key);
    if (p == parent_.end()) return;
    auto c = children_.find(p->second);
    if (c != children_.end() && --c->second == 0) children_.erase(c);
    parent_.erase(p);
  }
  // Held keys that continue key.
  uint32_t children(const K& key) const {
    auto c = children_.find(key);
    return c == children_.end() ? 0 : c->second;
  }
  bool is_leaf(const K& key) const { return children(key) == 0; }
  // key's parent, if it named one.
  const K* parent(const K& key) const {
    auto p = parent_.find(key);
    return p == parent_.end() ? nullptr : &p->second;
  }
  size_t linked() const { return parent_.size(); }

 private:
  std::unordered_map<K, K> parent_;
  std::unordered_map<K, uint32_t> children_;
};

}  // namespace fluxon
