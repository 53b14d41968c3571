// Linear-probing helpers shared by the open-addressing tables (WeightedCache's index, the master's
// RouteTable).
#pragma once
#include <cstddef>
#include <vector>

namespace fluxon {

// Empties slot i of a power-of-two linear-probing table and moves back the later entries whose
// probe chain passed through it (backward-shift deletion: no tombstones, every chain stays whole).
// home(slot) is the slot's hash; occupied(slot) says whether it holds an entry.
template <class Slot, class Home, class Occupied>
void backward_shift_erase(std::vector<Slot>& slots, size_t i, Home home, Occupied occupied) {
  const size_t mask = slots.size() - 1;
  size_t j = i;
  while (true) {
    j = (j + 1) & mask;
    if (!occupied(slots[j])) break;
    const size_t h = home(slots[j]) & mask;
    const bool movable = (j > i) ? (h <= i || h > j) : (h <= i && h > j);
    if (movable) {
      slots[i] = slots[j];
      i = j;
    }
  }
  slots[i] = Slot{};
}

}  // namespace fluxon
