// src/store/redis/redis_client.h — the one Redis client behind the replay cache and the in-flight
// markers: a bounded connection pool, a timeout on every command, and a rest period after a
// failure. Internal to the Redis target.
#pragma once

#include <hiredis/hiredis.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/mutex.h"
#include "idem/store/redis.h"
#include "src/store/pool.h"

namespace idem::redis_internal {

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// One connection of the pool. Used by one thread at a time.
class RedisConn {
 public:
  explicit RedisConn(redisContext* c) : ctx_(c) {}
  bool Broken() const { return ctx_->err != 0; }
  // A command with binary-safe arguments; nullptr on any failure, an error reply included (then
  // the connection may be broken, and the pool replaces it).
  Reply Command(const std::vector<std::string_view>& args);
  // Why the last Command returned nullptr.
  const std::string& LastError() const { return last_error_; }
  // A command whose answer must be a status (+OK): AUTH, SELECT. Otherwise false, with the
  // server's error or the connection's in *why.
  bool Expect(const std::vector<std::string_view>& args, std::string* why);

 private:
  Reply Send(const std::vector<std::string_view>& args);

  struct ContextFree {
    void operator()(redisContext* c) const { redisFree(c); }
  };
  std::unique_ptr<redisContext, ContextFree> ctx_;
  std::string last_error_;
};

// Where and as whom a connection logs in: redis://[[user]:password@]host[:port][/database].
struct Endpoint {
  std::string host;
  int port = 6379;
  std::string user;      // Redis 6 ACL user; empty: AUTH with the password alone
  std::string password;  // empty: no AUTH
  int database = 0;      // SELECTed after connecting
};

// Errors: kInvalidArgument naming what is wrong; rediss:// is refused (hiredis here has no TLS).
Result<Endpoint> ParseRedisUrl(const std::string& url);

// A connection to `endpoint`, logged in and its database selected, every command bounded by
// `timeout` (also the connect). Errors: kUnavailable naming what failed.
Result<std::unique_ptr<RedisConn>> ConnectRedis(const Endpoint& endpoint, Millis timeout);

// Thread-safe. Shared (std::shared_ptr) by every user, so a failure seen by one — the cache or
// the markers — rests Redis for all of them, and every fallback is counted once, in one place.
class RedisClient {
 public:
  // Errors: kInvalidArgument for a malformed URL or a pool size outside 1..256. Connecting is lazy:
  // a Redis that is down only means fallbacks.
  static Result<std::shared_ptr<RedisClient>> Create(const RedisCacheOptions& options);

  RedisClient(const RedisCacheOptions& options, Endpoint endpoint);

  // Runs one command. nullptr when Redis is resting after a recent failure, or when this command
  // failed (no connection, timeout, error reply): then options.on_fallback is called and Redis
  // rests for options.rest_after_failure, so a Redis that is down or slow does not add its
  // timeout to every request.
  Reply Command(const std::vector<std::string_view>& args);

  // Whether Redis is resting; callers may skip work that only feeds a command.
  bool Resting() const;

  // Counts a fallback to the database that was not Redis's failure (a reply that fails a check),
  // without resting.
  void CountFallback() const;

  const RedisCacheOptions& options() const { return options_; }

  // The client's monotonic clock (RedisCacheOptions::monotonic).
  SteadyTime Now() const { return monotonic_.Now(); }

 private:
  // Counts the fallback, rests, and reports Redis failing when it was not already.
  void Fallback(std::string_view why);
  // Reports Redis answering again when it was failing.
  void Answered();
  int64_t NowMs() const;

  RedisCacheOptions options_;
  MonotonicClock& monotonic_;
  store_internal::Pool<RedisConn> pool_;
  std::atomic<int64_t> resting_until_ms_{0};
  Mutex health_mu_;  // orders on_health's reports; guards no member (failing_ is atomic)
  std::atomic<bool> failing_{false};
};

// The two users of one client: the replay cache (redis_cache.cc) and the in-flight markers
// (redis_markers.cc). `clock` and `random` must outlive what they make.
std::unique_ptr<Store> MakeRedisCache(std::unique_ptr<Store> inner,
                                      std::shared_ptr<RedisClient> client, Clock& clock);
std::unique_ptr<InFlightMarkers> MakeRedisMarkers(std::shared_ptr<RedisClient> client,
                                                  Random& random);

}  // namespace idem::redis_internal
