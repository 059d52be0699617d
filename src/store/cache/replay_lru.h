// src/store/cache/replay_lru.h — the in-process LRU of finished records that the replay caches
// (replay_cache.cc, and the Redis cache's first tier) share, and the rule both apply.
#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>

#include "idem/clock.h"
#include "idem/mutex.h"
#include "idem/record.h"

namespace idem::cache {

// The rule: only finished records, only before their expiry by the store's clock (expires_at
// after observed_at) and by the local one, and never a held outcome (kOutcomeUnknownPoint): an
// operator may settle it, from another process.
inline bool Usable(const Record& r, Timestamp local) {
  return IsReplayable(r.state) && r.recovery_point != kOutcomeUnknownPoint &&
         r.expires_at > r.observed_at && r.expires_at > local;
}

// How much slower than the world a process's monotonic clock may run while its caches still
// never answer for a record past its expiry: an entry is kept for what the record had left less
// this share of it. 2 %, forty times what NTP lets a clock slew (500 ppm); the simulator drifts
// instances' clocks this far (docs/testing.md). A record with a day left is kept 23.5 hours.
inline constexpr int64_t kSlowClockPpm = 20'000;

// How long a cache may keep a record: what the store said it had left when it was read, less
// the kSlowClockPpm share of that, rounded up (so a clock exactly that slow ends it no later than
// the record expires).
inline Millis Left(const Record& r) {
  const auto left = std::chrono::duration_cast<Millis>(r.expires_at - r.observed_at);
  if (left <= Millis(0)) return left;
  return left - Millis((left.count() * kSlowClockPpm + 999'999) / 1'000'000);
}

// Entries live until a deadline on the monotonic clock, set from the store's own reckoning of
// how long the record has left (expires_at - observed_at, less Left's share): no wall clock
// decides. Bounded by
// entries and by bytes (a record's strings and a fixed overhead); the least recently used go
// first. A record larger than the byte bound is not kept. Thread-safe.
class Lru {
 public:
  Lru(std::size_t max_entries, std::size_t max_bytes)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}

  // The entry of `scope` alive at `now`, its observed_at moved on by the time it has spent here.
  std::optional<Record> Get(const ScopeHash& scope, SteadyTime now) {
    if (max_entries_ == 0 || max_bytes_ == 0) return std::nullopt;
    MutexLock lock(mu_);
    auto it = index_.find(Key(scope));
    if (it == index_.end()) return std::nullopt;
    const Entry& entry = it->second->second;
    if (entry.deadline <= now) {
      Drop(it);
      return std::nullopt;
    }
    order_.splice(order_.begin(), order_, it->second);
    Record r = entry.record;
    r.observed_at = r.expires_at - std::chrono::duration_cast<Millis>(entry.deadline - now);
    return r;
  }

  void Put(const ScopeHash& scope, const Record& record, SteadyTime deadline) {
    const std::size_t size = SizeOf(record);
    if (max_entries_ == 0 || size > max_bytes_) return;
    MutexLock lock(mu_);
    std::string key = Key(scope);
    if (auto it = index_.find(key); it != index_.end()) Drop(it);
    order_.emplace_front(key, Entry{record, deadline, size});
    index_[std::move(key)] = order_.begin();
    bytes_ += size;
    while (order_.size() > max_entries_ || bytes_ > max_bytes_)
      Drop(index_.find(order_.back().first));
  }

 private:
  struct Entry {
    Record record;
    SteadyTime deadline;
    std::size_t size;
  };
  using Order = std::list<std::pair<std::string, Entry>>;

  static std::string Key(const ScopeHash& s) {
    return std::string(reinterpret_cast<const char*>(s.data()), s.size());
  }
  // The strings a record holds, its key twice (list and index) and a fixed allowance for the
  // nodes and the record's other fields.
  static std::size_t SizeOf(const Record& r) {
    return r.tenant.size() + r.user.size() + r.route.size() + r.recovery_point.size() +
           r.resource_id.size() + r.response.size() + 2 * 32 + 256;
  }
  void Drop(std::unordered_map<std::string, Order::iterator>::iterator it) IDEM_REQUIRES(mu_) {
    bytes_ -= it->second->second.size;
    order_.erase(it->second);
    index_.erase(it);
  }

  const std::size_t max_entries_;
  const std::size_t max_bytes_;
  mutable Mutex mu_;
  Order order_ IDEM_GUARDED_BY(mu_);
  std::unordered_map<std::string, Order::iterator> index_ IDEM_GUARDED_BY(mu_);
  std::size_t bytes_ IDEM_GUARDED_BY(mu_) = 0;
};

}  // namespace idem::cache
