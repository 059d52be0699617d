// include/idem/store/redis.h — an optional accelerator in front of a Store: replays of finished
// operations are served from an in-process LRU and from Redis instead of the database, and
// concurrent duplicates of a running operation are turned away (a retryable 409) by in-flight
// markers (include/idem/inflight.h) kept in Redis, before they reach the database.
//
// The database decides. Only finished records (SUCCEEDED, FAILED_FINAL) are cached, and a cached
// record is used only while its expires_at is in the future by the store's clock: until then the
// database record cannot change (finished records are immutable until they expire). An entry
// lives for what the store said the record had left when it was read (Record::expires_at -
// Record::observed_at, less 2 % for a clock that runs slow), counted from before the read (a fill
// that comes late only shortens it) — its TTL in Redis, measured by Redis, and its deadline in the
// LRU, measured by the monotonic clock — so no instance's wall clock, however skewed, keeps one
// alive past its expiry; the instance's `clock` can only shorten an entry's use (a clock running
// ahead costs database reads, never a wrong answer). An entry answers only for its own scope (one
// holding another scope's record is a miss). Every Redis error or timeout falls back to the
// database. The in-flight marker is a hint only: it may make a duplicate wait and retry,
// never give it a final answer. Transactions, claims and everything else pass straight through.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "idem/clock.h"
#include "idem/inflight.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem {

// Options of the one Redis client that the replay cache and the in-flight markers share.
struct RedisCacheOptions {
  // redis://[[user]:password@]host[:port][/database]: AUTH (with a Redis 6 ACL user if named) and
  // SELECT on every connection. Percent-encode reserved characters of the password. rediss:// is
  // refused: Debian 12's hiredis has no TLS.
  std::string url;
  // Per command; a slower Redis is skipped (the database answers).
  Millis timeout{50};
  int pool_size = 8;
  // Entries and bytes of the in-process LRU in front of Redis (either 0 turns it off); it also
  // answers Store::ReadCached.
  std::size_t lru_entries = 10000;
  std::size_t lru_bytes = 64u << 20;
  // Cache entries are <prefix><hex scope hash>, markers <prefix>lock:<hex scope hash>.
  std::string key_prefix = "idem:rec:";
  // Called on every fallback to the database after a Redis failure, and for every cache entry
  // found to belong to another scope (for metrics).
  std::function<void()> on_fallback;
  // Called once per change of Redis's health, for logs: when it starts failing, with why (a
  // refused AUTH, a connection refused, a timeout, an error reply), and when it answers again
  // after failing, with "".
  std::function<void(std::string_view failure)> on_health;
  // After a Redis failure, how long Redis is left alone by the cache and the markers alike (the
  // database answers meanwhile), so a Redis that is down does not add its timeout to every call.
  Millis rest_after_failure{1000};
  // The clock of the rest period and of LRU entries' lifetimes; nullptr means the system's
  // monotonic clock. Must outlive the client.
  MonotonicClock* monotonic = nullptr;
};

// Wraps `inner` with the replay cache only. Connecting to Redis is lazy: a Redis that is down at
// start-up only means fallbacks. `clock` must outlive the store.
// Errors: kInvalidArgument for a malformed URL or a pool_size outside 1..256.
Result<std::unique_ptr<Store>> WrapWithRedisCache(std::unique_ptr<Store> inner,
                                                  const RedisCacheOptions& options, Clock& clock);

// The replay cache and the in-flight markers over one Redis client (one connection pool, one rest
// period after a failure). Give `markers` to the Engine with `store`. Either may outlive the other.
struct RedisFastPath {
  std::unique_ptr<Store> store;              // `inner` behind the replay cache
  std::unique_ptr<InFlightMarkers> markers;  // SET NX PX markers
};

// A marker's value carries 16 bytes from `random`, and is the token its placer releases it with:
// Release is a compare-and-delete (a Lua script: GET == token → DEL), so only the request that
// placed a marker removes it. `clock` and `random` must outlive both results.
// Errors: as WrapWithRedisCache.
Result<RedisFastPath> OpenRedisFastPath(std::unique_ptr<Store> inner,
                                        const RedisCacheOptions& options, Clock& clock,
                                        Random& random);

}  // namespace idem
