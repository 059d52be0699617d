// src/store/redis/redis_cache.cc — the replay cache decorator (see redis.h for the rule that keeps
// it from ever overriding the database), and redis.h's factories.
#include "idem/failpoint.h"
#include "idem/store/redis.h"
#include "src/core/wire.h"
#include "src/store/cache/replay_lru.h"
#include "src/store/redis/redis_client.h"

namespace idem {
namespace {

using redis_internal::RedisClient;
using redis_internal::Reply;

// ---- Record encoding for the cache ----------------------------------------------------------

using wire::PutBytes;
using wire::PutInt;

constexpr std::string_view kFormat = "r2";

std::string EncodeRecord(const Record& r) {
  std::string out;
  PutBytes(out, kFormat);
  PutBytes(out, r.scope);
  PutBytes(out, r.tenant);
  PutBytes(out, r.user);
  PutBytes(out, r.route);
  PutBytes(out, r.fingerprint.mac);
  PutInt(out, r.fingerprint.rules_version);
  PutInt(out, r.fingerprint.secret_id);
  PutInt(out, static_cast<int64_t>(r.state));
  PutBytes(out, r.recovery_point);
  PutBytes(out, r.resource_id);
  PutInt(out, r.status_code);
  PutBytes(out, r.response);
  PutBytes(out, r.lease.owner);
  PutInt(out, r.lease.fence);
  PutInt(out, ToUnixMillis(r.lease.until));
  PutInt(out, ToUnixMillis(r.created_at));
  PutInt(out, ToUnixMillis(r.updated_at));
  PutInt(out, ToUnixMillis(r.expires_at));
  PutInt(out, ToUnixMillis(r.sent_at));
  return out;
}

std::optional<Record> DecodeRecord(std::string_view bytes) {
  wire::Reader in(bytes);
  Record r;
  std::string format;
  int64_t rules, secret, state, status, fence, until, created, updated, expires, sent;
  if (!in.Bytes(&format) || format != kFormat || !in.Bytes(&r.scope) || !in.Bytes(&r.tenant) ||
      !in.Bytes(&r.user) || !in.Bytes(&r.route) || !in.Bytes(&r.fingerprint.mac) ||
      !in.Int(&rules) || !in.Int(&secret) || !in.Int(&state) || !in.Bytes(&r.recovery_point) ||
      !in.Bytes(&r.resource_id) || !in.Int(&status) || !in.Bytes(&r.response) ||
      !in.Bytes(&r.lease.owner) || !in.Int(&fence) || !in.Int(&until) || !in.Int(&created) ||
      !in.Int(&updated) || !in.Int(&expires) || !in.Int(&sent) || !in.Done()) {
    return std::nullopt;
  }
  if (state < 1 || state > 4) return std::nullopt;
  r.fingerprint.rules_version = static_cast<uint32_t>(rules);
  r.fingerprint.secret_id = static_cast<uint32_t>(secret);
  r.state = static_cast<RecordState>(state);
  r.status_code = static_cast<int>(status);
  r.lease.fence = fence;
  r.lease.until = FromUnixMillis(until);
  r.created_at = FromUnixMillis(created);
  r.updated_at = FromUnixMillis(updated);
  r.expires_at = FromUnixMillis(expires);
  r.sent_at = FromUnixMillis(sent);
  return r;
}

// ---- The decorator --------------------------------------------------------------------------

// The cache entry of KEYS[1] and how many milliseconds it still lives by Redis's clock, or nil.
constexpr std::string_view kReadScript =
    "local v = redis.call('GET', KEYS[1]) if not v then return nil end "
    "return {v, redis.call('PTTL', KEYS[1])}";

// Owns the store it wraps; only Read differs, everything else is forwarded.
class RedisCachedStore final : public StoreWrapper {
 public:
  RedisCachedStore(std::unique_ptr<Store> inner, std::shared_ptr<RedisClient> client, Clock& clock)
      : StoreWrapper(*inner),
        inner_(std::move(inner)),
        client_(std::move(client)),
        clock_(clock),
        lru_(client_->options().lru_entries, client_->options().lru_bytes) {
    caps_ = inner_->capabilities();
    caps_.name = "redis+" + caps_.name;
  }

  const StoreCapabilities& capabilities() const override { return caps_; }

  // Every cache path answers only with a record of the scope asked for: an entry of another
  // scope is a miss, counted as a fallback, and the database answers. An entry lives for what
  // the store said the record had left when it was read (set as its TTL in Redis and as its
  // deadline in the LRU) and comes back with observed_at moved on by the time it has spent in
  // the cache. That life is counted from before the read: whatever time passes between the
  // read and the fill (a slow Redis, a descheduled or stalled thread) comes off it, never on top.
  // This instance's clock can only shorten that: a clock running behind keeps no entry alive past
  // its expiry; one running ahead only costs database reads.
  std::optional<Record> ReadCached(const ScopeHash& scope) override {
    auto hit = lru_.Get(scope, client_->Now());
    if (hit && OfScope(*hit, scope) && cache::Usable(*hit, clock_.Now())) return hit;
    return std::nullopt;
  }

  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    const Timestamp local = clock_.Now();
    const SteadyTime asked = client_->Now();
    if (auto hit = lru_.Get(scope, asked);
        hit && OfScope(*hit, scope) && cache::Usable(*hit, local)) {
      return hit;
    }
    const std::string key = client_->options().key_prefix + ToHex(scope);
    if (auto cached = FromRedis(key);
        cached && OfScope(*cached, scope) && cache::Usable(*cached, local)) {
      lru_.Put(scope, *cached, asked + cache::Left(*cached));
      return cached;
    }
    IDEM_ASSIGN_OR_RETURN(std::optional<Record> record, inner_->Read(scope));
    // The database answered and the cache does not know yet (a failpoint's `error` skips the
    // fill, as a Redis failure would).
    if (record && record->scope == scope && cache::Usable(*record, local) &&
        IDEM_FAILPOINT("cache_before_fill")) {
      const Millis left = cache::Left(*record);
      lru_.Put(scope, *record, asked + left);
      // Redis counts a TTL from the SET: what is left now, not what was left at the read.
      ToRedis(key, *record, left - std::chrono::ceil<Millis>(client_->Now() - asked));
    }
    return record;
  }

 private:
  // Whether a cache entry is the record of `scope`; counts a fallback when it is not.
  bool OfScope(const Record& r, const ScopeHash& scope) const {
    if (r.scope == scope) return true;
    client_->CountFallback();
    return false;
  }

  std::optional<Record> FromRedis(const std::string& key) {
    Reply reply = client_->Command({"EVAL", kReadScript, "1", key});
    // A failure or a miss.
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) return std::nullopt;
    const redisReply* value = reply->element[0];
    const redisReply* left = reply->element[1];
    // An entry without a TTL (-1) was not written by a cache: it says nothing.
    if (value->type != REDIS_REPLY_STRING || left->type != REDIS_REPLY_INTEGER ||
        left->integer <= 0) {
      return std::nullopt;
    }
    std::optional<Record> r = DecodeRecord(std::string_view(value->str, value->len));
    if (r) r->observed_at = r->expires_at - Millis(left->integer);
    return r;
  }

  void ToRedis(const std::string& key, const Record& r, Millis left) {
    if (left.count() <= 0 || client_->Resting()) return;
    const std::string value = EncodeRecord(r);
    const std::string ttl = std::to_string(left.count());
    (void)client_->Command({"SET", key, value, "PX", ttl});
  }

  std::unique_ptr<Store> inner_;
  std::shared_ptr<RedisClient> client_;
  Clock& clock_;
  cache::Lru lru_;
  StoreCapabilities caps_;
};

}  // namespace

namespace redis_internal {

std::unique_ptr<Store> MakeRedisCache(std::unique_ptr<Store> inner,
                                      std::shared_ptr<RedisClient> client, Clock& clock) {
  return std::make_unique<RedisCachedStore>(std::move(inner), std::move(client), clock);
}

}  // namespace redis_internal

Result<std::unique_ptr<Store>> WrapWithRedisCache(std::unique_ptr<Store> inner,
                                                  const RedisCacheOptions& options, Clock& clock) {
  IDEM_ASSIGN_OR_RETURN(std::shared_ptr<RedisClient> client, RedisClient::Create(options));
  return redis_internal::MakeRedisCache(std::move(inner), std::move(client), clock);
}

Result<RedisFastPath> OpenRedisFastPath(std::unique_ptr<Store> inner,
                                        const RedisCacheOptions& options, Clock& clock,
                                        Random& random) {
  IDEM_ASSIGN_OR_RETURN(std::shared_ptr<RedisClient> client, RedisClient::Create(options));
  RedisFastPath fast;
  fast.markers = redis_internal::MakeRedisMarkers(client, random);
  fast.store = redis_internal::MakeRedisCache(std::move(inner), std::move(client), clock);
  return fast;
}

}  // namespace idem
