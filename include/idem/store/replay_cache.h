// include/idem/store/replay_cache.h — an in-process cache of finished records in front of any
// Store, so replays of finished operations are answered from memory, without the database and —
// through Store::ReadCached and Engine::ReplayFromMemory — without waiting on anything.
//
// The database decides, as with the Redis cache (redis.h), by the same rule: only finished
// records (SUCCEEDED, FAILED_FINAL) are kept, each for what the store said it had left when it
// was read (expires_at - observed_at, less 2 % for a monotonic clock that runs slow, counted from
// before the read, on the monotonic clock), and
// none is used once the local clock says it has expired. A finished record cannot change before
// its expiry, so a cached answer is the database's answer. Everything else passes through.
#pragma once

#include <cstddef>
#include <memory>

#include "idem/clock.h"
#include "idem/store.h"

namespace idem {

struct ReplayCacheOptions {
  // Bounds of the cache: records, and bytes (a record's strings, its sealed answer first, and a
  // fixed allowance each). Either 0 turns the cache off.
  std::size_t max_entries = 100000;
  std::size_t max_bytes = 64u << 20;
  // Entries' lifetimes; nullptr means the system's monotonic clock. Must outlive the store.
  MonotonicClock* monotonic = nullptr;
};

// Wraps `inner`: Read answers from the cache when it can, fills it from the database otherwise;
// ReadCached answers from the cache only. `clock` must outlive the store.
std::unique_ptr<Store> WrapWithReplayCache(std::unique_ptr<Store> inner,
                                           const ReplayCacheOptions& options, Clock& clock);

}  // namespace idem
