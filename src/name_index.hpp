// src/name_index.hpp — params' indices by name: an open-addressing table of (hash, index)
// pairs whose names stay in the params. Registering 100k params made a node per name in a
// std::unordered_map and chased it on every lookup: a third of sa_optimizer_add_param's
// time (perf, 2-core VM). Here a lookup reads one slot (a few, after collisions) and
// compares a name only where the hashes agree.
#ifndef SHARDADAM_SRC_NAME_INDEX_HPP_
#define SHARDADAM_SRC_NAME_INDEX_HPP_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace sa {

class NameIndex {
 public:
  // The index inserted under `name`, or -1. name_of(i) is the name of index i.
  template <class NameOf>
  int64_t find(std::string_view name, const NameOf& name_of) const {
    if (slots_.empty()) return -1;
    const uint64_t hash = std::hash<std::string_view>{}(name);
    for (std::size_t s = hash & mask(); slots_[s].index >= 0; s = (s + 1) & mask())
      if (slots_[s].hash == hash && name_of(slots_[s].index) == name) return slots_[s].index;
    return -1;
  }

  // Makes room for one more name, so that the next insert cannot fail. Throws
  // std::bad_alloc (nothing changed then).
  void reserve_one() {
    if (2 * (size_ + 1) <= slots_.size()) return;  // at most half full: short probes
    std::vector<Slot> grown(slots_.empty() ? 64 : 2 * slots_.size());
    const std::size_t grown_mask = grown.size() - 1;
    for (const Slot& slot : slots_) {
      if (slot.index < 0) continue;
      std::size_t s = slot.hash & grown_mask;
      while (grown[s].index >= 0) s = (s + 1) & grown_mask;
      grown[s] = slot;
    }
    slots_.swap(grown);
  }

  // Adds `name` (not present) as `index`, after reserve_one(). No throw.
  void insert(std::string_view name, int64_t index) noexcept {
    const uint64_t hash = std::hash<std::string_view>{}(name);
    std::size_t s = hash & mask();
    while (slots_[s].index >= 0) s = (s + 1) & mask();
    slots_[s] = Slot{hash, index};
    ++size_;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    int64_t index = -1;  // -1: empty
  };
  std::size_t mask() const { return slots_.size() - 1; }  // the size is a power of two

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace sa

#endif  // SHARDADAM_SRC_NAME_INDEX_HPP_
