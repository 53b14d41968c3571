#include "fluxon/runtime/page_mapper.hpp"

#include <algorithm>

#include "fluxon/runtime/segment.hpp"

namespace fluxon {

PageMapper::PageMapper(std::shared_ptr<Segment> mapping, uint64_t grant_bytes)
    : mapping_(std::move(mapping)), grant_bytes_(grant_bytes) {
  state_.assign((mapping_->size() + kChunk - 1) / kChunk, kUnmapped);
}

PageMapper::~PageMapper() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool PageMapper::queue(uint64_t chunk) {
  if (state_[chunk] != kUnmapped) return false;
  state_[chunk] = kQueued;
  queue_.push_back(chunk);
  stats_.chunks_queued++;
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  return true;
}

void PageMapper::touch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  if (grant_bytes_ == 0) return;
  std::vector<std::pair<uint64_t, uint64_t>> now;
  bool queued = false;
  {
    std::lock_guard<std::mutex> l(m_);
    if (stop_) return;
    for (auto [offset, len] : ranges) {
      if (len == 0 || offset >= mapping_->size()) continue;
      len = std::min(len, mapping_->size() - offset);
      const uint64_t first = offset / kChunk, last = (offset + len - 1) / kChunk;
      for (uint64_t c = first; c <= last; ++c) {
        if (state_[c] == kMapped) continue;
        const uint64_t from = std::max(offset, c * kChunk), to = std::min(offset + len, (c + 1) * kChunk);
        if (!now.empty() && now.back().first + now.back().second == from)
          now.back().second += to - from;
        else
          now.emplace_back(from, to - from);
        stats_.now_bytes += to - from;
        queued |= queue(c);  // the rest of the chunk
      }
      // Slots are carved upward through a grant: the next chunks of this one are the next used.
      const uint64_t grant_end =
          std::min(last * kChunk / grant_bytes_ * grant_bytes_ + grant_bytes_, mapping_->size());
      for (uint64_t c = last + 1; c <= last + kAhead && c * kChunk < grant_end; ++c) queued |= queue(c);
    }
  }
  if (queued) cv_.notify_one();
  for (auto [o, n] : now) mapping_->populate(o, n);
}

void PageMapper::run() {
  std::unique_lock<std::mutex> l(m_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    const uint64_t c = queue_.front();
    queue_.pop_front();
    stats_.chunks_queued--;
    busy_ = true;
    l.unlock();
    const uint64_t from = c * kChunk, n = std::min(kChunk, mapping_->size() - from);
    mapping_->populate(from, n);
    l.lock();
    busy_ = false;
    state_[c] = kMapped;
    stats_.behind_bytes += n;
    stats_.chunks_mapped++;
    if (queue_.empty()) idle_.notify_all();
  }
  idle_.notify_all();
}

PageMapper::Stats PageMapper::stats() const {
  std::lock_guard<std::mutex> l(m_);
  return stats_;
}

void PageMapper::drain() {
  std::unique_lock<std::mutex> l(m_);
  idle_.wait(l, [&] { return stop_ || (queue_.empty() && !busy_); });
}

}  // namespace fluxon
