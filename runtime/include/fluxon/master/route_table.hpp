// The master's route table, sized for 100M keys (≤ 160 bytes a route with SGLang's keys):
// - keys are stored compact (KeyCodec): SGLang's keys are an affix, a 64-hex page hash and an affix
//   (`prefix:` + hash + `_model_rank_geometry`); the hash is packed two digits a byte and the pair of
//   affixes is interned once for the whole table, so an 87-byte key takes 35 bytes;
// - each key and its value live in one node carved from an arena (NodeArena: size classes of 8
//   bytes in 1 MiB chunks, no allocator header a node);
// - a slot is 8 bytes: the node's address and 16 bits of its hash (linear probing; an erased slot
//   becomes a deleted marker, or empty when the next one is: erasing reads no other node; a node's
//   full hash is computed again from its key when the table is rebuilt);
// - a value's first replica is inline (InlineList): most routes have one or two copies.
// Lookups speak std::string_view; `it->first` (the key, decoded when read) / `it->second` read like
// std::unordered_map's so the master's code stays plain. Not thread-safe, lookups included (they
// encode into a scratch buffer): the master's core is single-threaded.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>


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

// Compact keys. A key's longest run of lowercase hex digits (at least kMinRun, an even number of
// them) is packed two digits a byte, and what comes before and after it (its affixes) is interned as
// a pair: [kPacked][pair id, 2 bytes][packed digits]. Any other key is [kRaw][its bytes]. The
// encoding is a function of the key and the dictionary, and the dictionary only grows (at most
// kMaxAffixes pairs; past that new pairs' keys stay raw): a key encodes the same on every call, so
// encoded keys compare and hash like the keys.
class KeyCodec {
 public:
  static constexpr size_t kMinRun = 16;
  static constexpr uint32_t kMaxAffixes = 1u << 16;
  static constexpr char kRaw = 0, kPacked = 1;
  static constexpr uint32_t kNone = ~0u;

  // key's encoding into out. intern: a new affix pair is added (room permitting); without it a key
  // whose pair is not known is encoded raw - it is in no table then (inserting it would have
  // interned its pair, or stored it raw when the dictionary was full). Returns whether the encoding
  // is the one an insertion makes (false only for that raw one).
  bool encode(std::string_view key, std::string& out, bool intern) {
    size_t at = 0, len = 0;
    const auto* k = reinterpret_cast<const uint8_t*>(key.data());
    for (size_t i = 0; i < key.size();) {
      if (kNibble[k[i]] < 0) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < key.size() && kNibble[k[j]] >= 0) ++j;
      if (j - i > len) at = i, len = j - i;
      i = j + 1;  // key[j] is no digit
    }
    len &= ~size_t(1);
    out.clear();
    if (len >= kMinRun) {
      const uint32_t id = pair_id(key.substr(0, at), key.substr(at + len), intern);
      if (id != kNone) {
        out.resize(3 + len / 2);
        out[0] = kPacked;
        out[1] = char(id & 0xff);
        out[2] = char(id >> 8);
        for (size_t k = 0; k < len / 2; ++k)
          out[3 + k] = char((kNibble[uint8_t(key[at + 2 * k])] << 4) | kNibble[uint8_t(key[at + 2 * k + 1])]);
        return true;
      }
    }
    out.reserve(key.size() + 1);
    out.push_back(kRaw);
    out.append(key);
    return len < kMinRun || intern || affixes_.size() >= kMaxAffixes;
  }
  std::string decode(std::string_view enc) const {
    if (enc.empty() || enc[0] == kRaw) return std::string(enc.substr(enc.empty() ? 0 : 1));
    const auto& [head, tail] = affixes_[uint8_t(enc[1]) | (uint32_t(uint8_t(enc[2])) << 8)];
    std::string key;
    key.reserve(head.size() + 2 * (enc.size() - 3) + tail.size());
    key += head;
    static constexpr char kDigits[] = "0123456789abcdef";
    for (size_t k = 3; k < enc.size(); ++k) {
      key.push_back(kDigits[uint8_t(enc[k]) >> 4]);
      key.push_back(kDigits[uint8_t(enc[k]) & 15]);
    }
    key += tail;
    return key;
  }
  size_t affix_count() const { return affixes_.size(); }

 private:
  // A byte's value as a lowercase hex digit, -1 if it is none.
  static constexpr std::array<int8_t, 256> kNibble = [] {
    std::array<int8_t, 256> t{};
    for (auto& v : t) v = -1;
    for (int c = 0; c < 10; ++c) t['0' + c] = int8_t(c);
    for (int c = 0; c < 6; ++c) t['a' + c] = int8_t(10 + c);
    return t;
  }();
  uint32_t pair_id(std::string_view head, std::string_view tail, bool intern) {
    // The keys of a batch share their affixes: the last pair first.
    if (last_ != kNone && affixes_[last_].first == head && affixes_[last_].second == tail) return last_;
    probe_.clear();
    const uint32_t hl = uint32_t(head.size());
    probe_.append(reinterpret_cast<const char*>(&hl), sizeof hl);
    probe_.append(head);
    probe_.append(tail);
    if (auto it = ids_.find(probe_); it != ids_.end()) return last_ = it->second;
    if (!intern || affixes_.size() >= kMaxAffixes) return kNone;
    const uint32_t id = uint32_t(affixes_.size());
    affixes_.emplace_back(std::string(head), std::string(tail));
    ids_.emplace(probe_, id);
    return last_ = id;
  }
  std::vector<std::pair<std::string, std::string>> affixes_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::string probe_;
  uint32_t last_ = kNone;
};

// Memory for small objects that are freed one at a time: size classes of kGrain bytes carved from
// kChunk-byte chunks, a free list per class (a freed block holds the list's link), no header per
// block. Larger blocks go to operator new. Chunks are kept until the arena goes.
class NodeArena {
 public:
  static constexpr size_t kGrain = 8, kMaxPooled = 512, kChunk = size_t(1) << 20;
  NodeArena() = default;
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;
  void swap(NodeArena& o) noexcept {
    free_.swap(o.free_);
    chunks_.swap(o.chunks_);
    std::swap(cur_, o.cur_);
    std::swap(left_, o.left_);
  }
  void* allocate(size_t n) {
    if (n > kMaxPooled) return ::operator new(n);
    const size_t c = (n + kGrain - 1) / kGrain;
    if (void* p = free_[c]) {
      free_[c] = *static_cast<void**>(p);
      return p;
    }
    const size_t bytes = c * kGrain;
    if (left_ < bytes) {
      chunks_.emplace_back(new char[kChunk]);  // not zeroed: pages come in as nodes are written
      cur_ = chunks_.back().get();
      left_ = kChunk;
    }
    void* p = cur_;
    cur_ += bytes;
    left_ -= bytes;
    return p;
  }
  void deallocate(void* p, size_t n) {
    if (n > kMaxPooled) return ::operator delete(p);
    const size_t c = (n + kGrain - 1) / kGrain;
    *static_cast<void**>(p) = free_[c];
    free_[c] = p;
  }
  size_t chunk_bytes() const { return chunks_.size() * kChunk; }

 private:
  std::array<void*, kMaxPooled / kGrain + 1> free_{};
  std::vector<std::unique_ptr<char[]>> chunks_;
  char* cur_ = nullptr;
  size_t left_ = 0;
};

template <class V>
class RouteTable {
  // A node: [V][uint32 encoded key length][encoded key], in the arena.
  static constexpr size_t kLenAt = sizeof(V), kKeyAt = sizeof(V) + sizeof(uint32_t);
  static V& value_of(char* n) { return *std::launder(reinterpret_cast<V*>(n)); }
  static uint32_t len_of(const char* n) {
    uint32_t l;
    std::memcpy(&l, n + kLenAt, sizeof l);
    return l;
  }
  static std::string_view enc_of(const char* n) { return {n + kKeyAt, len_of(n)}; }
  // A slot: the node's address (48 bits) and the top 16 bits of its hash; 0 is empty.
  static constexpr uint64_t kPtrMask = (uint64_t(1) << 48) - 1;
  static char* node_of(uint64_t s) { return reinterpret_cast<char*>(s & kPtrMask); }
  static constexpr uint64_t kEmpty = 0, kDeleted = 1;  // no node is at address 1
  static bool live(uint64_t s) { return s > kDeleted; }
  static uint64_t tag_of(uint64_t h) { return h >> 48; }

 public:
  // An entry's key, decoded when it is read (a lookup that wants the value decodes nothing).
  class Key {
   public:
    Key(const RouteTable* t, const char* n) : t_(t), n_(n) {}
    std::string str() const { return t_->codec_.decode(enc_of(n_)); }
    operator std::string() const { return str(); }
    friend bool operator==(const Key& k, std::string_view s) { return k.str() == s; }

   private:
    const RouteTable* t_;
    const char* n_;
  };
  struct Ref {
    Key first;
    V& second;
  };
  class iterator {
   public:
    iterator(const RouteTable* t, size_t i) : t_(t), i_(i) {}
    Ref operator*() const {
      char* n = node_of(t_->slots_[i_]);
      return {Key{t_, n}, value_of(n)};
    }
    struct Arrow {
      Ref ref;
      Ref* operator->() { return &ref; }
    };
    Arrow operator->() const { return Arrow{**this}; }
    iterator& operator++() {
      do ++i_;
      while (i_ < t_->slots_.size() && !live(t_->slots_[i_]));
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
      std::swap(deleted_, o.deleted_);
      std::swap(codec_, o.codec_);
      arena_.swap(o.arena_);
    }
    return *this;
  }

  size_t size() const { return size_; }
  iterator end() const { return {this, slots_.size()}; }
  iterator begin() const {
    iterator it{this, 0};
    if (!slots_.empty() && !live(slots_[0])) ++it;
    return it;
  }
  // The last key encoded is remembered (a put finds a key, then inserts or erases it): the same
  // key again is not encoded again.
  iterator find(std::string_view key) const {
    if (!(memo_final_ && key == memo_)) {
      memo_final_ = codec_.encode(key, scratch_, false);
      memo_.assign(key);
      memo_hash_ = hash(scratch_);
    }
    return find_encoded(scratch_, memo_hash_);
  }
  size_t count(std::string_view key) const { return find(key) != end() ? 1 : 0; }
  // A key prepared for lookup: its encoding and hash, computed once. A batch is looked up in three
  // passes so that its memory misses overlap instead of following each other: prepare() every key
  // (it starts fetching the key's slot), prefetch() every key (the slot is read, the node it names
  // is fetched), then find() / emplace() each.
  struct Probe {
    std::string enc;
    uint64_t hash = 0;
    bool final = false;  // enc is the encoding an insertion makes
  };
  void prepare(std::string_view key, Probe& p) const {
    p.final = codec_.encode(key, p.enc, false);
    p.hash = hash(p.enc);
    __builtin_prefetch(&slots_[p.hash & mask()]);
  }
  void prefetch(const Probe& p) const {
    const uint64_t s = slots_[p.hash & mask()];
    if (live(s) && (s >> 48) == tag_of(p.hash)) {
      __builtin_prefetch(node_of(s));
      __builtin_prefetch(node_of(s) + kKeyAt);
    }
  }
  // A probe that is not final was made before its key's affixes were interned (by an insertion
  // since, maybe of the same key): its raw encoding holds the key, encoded again now.
  iterator find(const Probe& p) const {
    return p.final ? find_encoded(p.enc, p.hash) : find(std::string_view(p.enc).substr(1));
  }
  std::pair<iterator, bool> emplace(std::string_view key, const Probe& p, V value) {
    if (!p.final) return emplace(key, std::move(value));
    if (auto it = find_encoded(p.enc, p.hash); it != end()) return {it, false};
    return {iterator{this, insert(p.enc, p.hash, std::move(value))}, true};
  }
  // Inserts key -> value unless key is present; returns the entry and whether it was inserted.
  std::pair<iterator, bool> emplace(std::string_view key, V value) {
    // The usual sequence is find(key), then emplace(key): the find's encoding is reused.
    if (!(memo_final_ && key == memo_)) {
      memo_final_ = codec_.encode(key, scratch_, true);  // true: an insertion's encoding is final
      memo_.assign(key);
      memo_hash_ = hash(scratch_);
    }
    if (auto it = find_encoded(scratch_, memo_hash_); it != end()) return {it, false};
    return {iterator{this, insert(scratch_, memo_hash_, std::move(value))}, true};
  }
  void erase(iterator it) {
    destroy(node_of(slots_[it.i_]));
    size_t i = it.i_;
    if (slots_[(i + 1) & mask()] != kEmpty) {
      slots_[i] = kDeleted;  // a probe chain may pass through it
      deleted_++;
    } else {  // the end of a chain: it and the deleted markers just before it are empty now
      slots_[i] = kEmpty;
      for (i = (i - 1) & mask(); slots_[i] == kDeleted; i = (i - 1) & mask()) slots_[i] = kEmpty, deleted_--;
    }
    size_--;
  }
  void clear() {
    for (auto& s : slots_)
      if (live(s)) destroy(node_of(s)), s = kEmpty;
      else s = kEmpty;
    size_ = deleted_ = 0;
  }
  size_t capacity() const { return slots_.size(); }  // slots (tests)
  // Affix pairs interned so far (tests, the bench).
  size_t affix_count() const { return codec_.affix_count(); }

 private:
  static uint64_t hash(std::string_view enc) {
    uint64_t h = std::hash<std::string_view>{}(enc);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
  }
  iterator find_encoded(std::string_view enc, uint64_t h) const {
    const uint64_t tag = tag_of(h);
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      const uint64_t s = slots_[i];
      if (s == kEmpty) return end();
      if (s != kDeleted && (s >> 48) == tag && enc_of(node_of(s)) == enc) return {this, i};
    }
  }
  size_t mask() const { return slots_.size() - 1; }
  // A new node for enc (absent): returns its slot.
  size_t insert(std::string_view enc, uint64_t h, V value) {
    // Live and deleted slots together stay under 3/4: past it the table is rebuilt (twice the size
    // when the live ones alone pass 3/8, else the same size without its markers).
    if ((size_ + deleted_ + 1) * 4 > slots_.size() * 3) rebuild((size_ + 1) * 8 > slots_.size() * 3);
    const uint32_t len = uint32_t(enc.size());
    char* n = static_cast<char*>(arena_.allocate(kKeyAt + len));
    new (n) V(std::move(value));
    std::memcpy(n + kLenAt, &len, sizeof len);
    std::memcpy(n + kKeyAt, enc.data(), len);
    size_++;
    return place(h, n);
  }
  size_t place(uint64_t h, char* n) {
    size_t i = h & mask();
    while (live(slots_[i])) i = (i + 1) & mask();
    if (slots_[i] == kDeleted) deleted_--;
    // User-space addresses fit in 47 bits on x86-64 and 48 on arm64 (a mapping above that is asked for).
    if (reinterpret_cast<uint64_t>(n) & ~kPtrMask) throw std::bad_alloc();
    slots_[i] = (tag_of(h) << 48) | reinterpret_cast<uint64_t>(n);
    return i;
  }
  void rebuild(bool twice) {
    std::vector<uint64_t> old(twice ? slots_.size() * 2 : slots_.size());
    old.swap(slots_);
    deleted_ = 0;
    // Each node is read again for its hash: a few nodes ahead are fetched while this one is placed.
    constexpr size_t kAhead = 8;
    for (size_t i = 0; i < old.size(); ++i) {
      if (i + kAhead < old.size() && live(old[i + kAhead])) __builtin_prefetch(node_of(old[i + kAhead]) + kKeyAt);
      if (live(old[i])) place(hash(enc_of(node_of(old[i]))), node_of(old[i]));
    }
  }
  void destroy(char* n) {
    const size_t bytes = kKeyAt + len_of(n);
    value_of(n).~V();
    arena_.deallocate(n, bytes);
  }

  std::vector<uint64_t> slots_;
  size_t size_ = 0, deleted_ = 0;
  // Lookups are const to their callers; they encode into scratch_ (the codec's last-pair cache
  // moves too).
  mutable KeyCodec codec_;
  mutable std::string scratch_;  // the last key encoded (memo_), its hash, and whether that encoding is final
  mutable std::string memo_;
  mutable uint64_t memo_hash_ = 0;
  mutable bool memo_final_ = false;
  NodeArena arena_;
};

}  // namespace fluxon
