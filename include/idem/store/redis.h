// include/idem/store/redis.h — an optional accelerator in front of a Store: replays of finished
// operations are served from an in-process LRU and from Redis instead of the database, and
// concurrent duplicates of a running operation are turned away (a retryable 409) by a
// SET NX PX marker before they reach the database.
//
// The database decides. Only finished records (SUCCEEDED, FAILED_FINAL) are cached, and a cached
// record is used only while its expires_at is in the future by the store's clock: until then the
// database record cannot change (finished records are immutable until they expire), and after it
// the cache entry is ignored whatever Redis still holds. Every Redis error or timeout falls back
// to the database. The in-flight marker is a hint only: it may make a duplicate wait and retry,
// never give it a final answer. Transactions, claims and everything else pass straight through.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "include/idem/clock.h"
#include "include/idem/result.h"
#include "include/idem/store.h"

namespace idem {

struct RedisCacheOptions {
  std::string url;  // "redis://host:port"
  // Per command; a slower Redis is skipped (the database answers).
  Millis timeout{50};
  int pool_size = 8;
  // Entries of the in-process LRU in front of Redis (0 turns it off).
  std::size_t lru_entries = 10000;
  std::string key_prefix = "idem:rec:";
  // Called on every fallback to the database after a Redis failure (for metrics).
  std::function<void()> on_fallback;
};

// Wraps `inner`. Connecting to Redis is lazy: a Redis that is down at start-up only means
// fallbacks. Errors: kInvalidArgument for a malformed URL.
Result<std::unique_ptr<Store>> WrapWithRedisCache(std::unique_ptr<Store> inner,
                                                  const RedisCacheOptions& options, Clock& clock);

}  // namespace idem
