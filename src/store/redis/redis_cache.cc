// src/store/redis/redis_cache.cc — the replay cache decorator (see redis.h for the rule that keeps
// it from ever overriding the database).
#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <list>
#include <mutex>
#include <unordered_map>

#include "include/idem/store/redis.h"
#include "src/core/wire.h"
#include "src/store/pool.h"

namespace idem {
namespace {

// ---- Record encoding for the cache ----------------------------------------------------------

using wire::PutBytes;
using wire::PutInt;

constexpr std::string_view kFormat = "r1";

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
  return out;
}

std::optional<Record> DecodeRecord(std::string_view bytes) {
  wire::Reader in(bytes);
  Record r;
  std::string format;
  int64_t rules, secret, state, status, fence, until, created, updated, expires;
  if (!in.Bytes(&format) || format != kFormat || !in.Bytes(&r.scope) || !in.Bytes(&r.tenant) ||
      !in.Bytes(&r.user) || !in.Bytes(&r.route) || !in.Bytes(&r.fingerprint.mac) ||
      !in.Int(&rules) || !in.Int(&secret) || !in.Int(&state) || !in.Bytes(&r.recovery_point) ||
      !in.Bytes(&r.resource_id) || !in.Int(&status) || !in.Bytes(&r.response) ||
      !in.Bytes(&r.lease.owner) || !in.Int(&fence) || !in.Int(&until) || !in.Int(&created) ||
      !in.Int(&updated) || !in.Int(&expires) || !in.done()) {
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
  return r;
}

std::string EncodeMarker(const InFlight& m) {
  std::string out;
  PutBytes(out, "m1");
  PutBytes(out, m.fingerprint.mac);
  PutInt(out, m.fingerprint.rules_version);
  PutInt(out, m.fingerprint.secret_id);
  PutInt(out, ToUnixMillis(m.lease_until));
  PutInt(out, ToUnixMillis(m.expires_at));
  return out;
}

std::optional<InFlight> DecodeMarker(std::string_view bytes) {
  wire::Reader in(bytes);
  InFlight m;
  std::string format;
  int64_t rules, secret, lease, expires;
  if (!in.Bytes(&format) || format != "m1" || !in.Bytes(&m.fingerprint.mac) || !in.Int(&rules) ||
      !in.Int(&secret) || !in.Int(&lease) || !in.Int(&expires) || !in.done()) {
    return std::nullopt;
  }
  m.fingerprint.rules_version = static_cast<uint32_t>(rules);
  m.fingerprint.secret_id = static_cast<uint32_t>(secret);
  m.lease_until = FromUnixMillis(lease);
  m.expires_at = FromUnixMillis(expires);
  return m;
}

// ---- Redis connections ----------------------------------------------------------------------

struct RedisFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

class RedisConn {
 public:
  explicit RedisConn(redisContext* c) : ctx_(c) {}
  bool broken() const { return ctx_->err != 0; }
  // A command with binary-safe arguments; nullptr on any failure (then the connection is
  // broken and the pool replaces it).
  Reply Command(const std::vector<std::string_view>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (std::string_view a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    void* r = redisCommandArgv(ctx_.get(), static_cast<int>(args.size()), argv.data(), lens.data());
    Reply reply(static_cast<redisReply*>(r));
    if (!reply || reply->type == REDIS_REPLY_ERROR) return nullptr;
    return reply;
  }

 private:
  std::unique_ptr<redisContext, RedisFree> ctx_;
};

struct Endpoint {
  std::string host;
  int port = 6379;
};

Result<Endpoint> ParseRedisUrl(const std::string& url) {
  constexpr std::string_view kScheme = "redis://";
  if (url.rfind(kScheme, 0) != 0) {
    return MakeError(Errc::kInvalidArgument, "redis URL must look like redis://host:port");
  }
  std::string rest = url.substr(kScheme.size());
  rest = rest.substr(0, rest.find('/'));
  Endpoint e;
  const std::size_t colon = rest.rfind(':');
  e.host = rest.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
        port.size() > 5) {
      return MakeError(Errc::kInvalidArgument, "bad port in redis URL '" + url + "'");
    }
    e.port = std::stoi(port);
  }
  if (e.host.empty()) return MakeError(Errc::kInvalidArgument, "no host in redis URL");
  return e;
}

// ---- In-process LRU -------------------------------------------------------------------------

class Lru {
 public:
  explicit Lru(std::size_t capacity) : capacity_(capacity) {}
  std::optional<Record> Get(const ScopeHash& scope) {
    if (capacity_ == 0) return std::nullopt;
    std::lock_guard lock(mu_);
    auto it = index_.find(Key(scope));
    if (it == index_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }
  void Put(const Record& record) {
    if (capacity_ == 0) return;
    std::lock_guard lock(mu_);
    const std::string key = Key(record.scope);
    if (auto it = index_.find(key); it != index_.end()) order_.erase(it->second);
    order_.emplace_front(key, record);
    index_[key] = order_.begin();
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  static std::string Key(const ScopeHash& s) {
    return std::string(reinterpret_cast<const char*>(s.data()), s.size());
  }
  std::size_t capacity_;
  std::mutex mu_;
  std::list<std::pair<std::string, Record>> order_;
  std::unordered_map<std::string, std::list<std::pair<std::string, Record>>::iterator> index_;
};

// ---- The decorator --------------------------------------------------------------------------

class RedisCachedStore final : public Store {
 public:
  RedisCachedStore(std::unique_ptr<Store> inner, RedisCacheOptions options, Endpoint endpoint,
                   Clock& clock)
      : inner_(std::move(inner)),
        options_(std::move(options)),
        clock_(clock),
        lru_(options_.lru_entries),
        pool_(
            "redis", {},
            [endpoint, timeout = options_.timeout]() { return Connect(endpoint, timeout); },
            options_.pool_size) {
    caps_ = inner_->capabilities();
    caps_.name = "redis+" + caps_.name;
  }

  const StoreCapabilities& capabilities() const override { return caps_; }

  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    const Timestamp now = clock_.Now();
    if (auto hit = lru_.Get(scope); hit && Usable(*hit, now)) return hit;
    const std::string key = options_.key_prefix + ToHex(scope);
    if (auto cached = FromRedis(key); cached && Usable(*cached, now)) {
      lru_.Put(*cached);
      return cached;
    }
    IDEM_ASSIGN_OR_RETURN(std::optional<Record> record, inner_->Read(scope));
    if (record && Usable(*record, now)) {
      lru_.Put(*record);
      ToRedis(key, *record, now);
    }
    return record;
  }

  // SET lock NX PX ttl: the first request of a scope takes the marker; a concurrent duplicate
  // gets the holder's marker back (and may be turned away with a retryable 409).
  std::optional<InFlight> Preclaim(const ScopeHash& scope, const InFlight& mine,
                                   Millis ttl) override {
    if (Resting() || ttl.count() <= 0) return std::nullopt;
    auto conn = store_internal::Borrow(pool_, options_.timeout);
    if (!conn) {
      Fallback();
      return std::nullopt;
    }
    const std::string key = LockKey(scope);
    const std::string ttl_ms = std::to_string(ttl.count());
    Reply set = (*conn)->Command({"SET", key, EncodeMarker(mine), "NX", "PX", ttl_ms});
    if (!set) {
      Fallback();
      return std::nullopt;
    }
    if (set->type == REDIS_REPLY_STATUS) return std::nullopt;  // "OK": the marker is ours
    Reply held = (*conn)->Command({"GET", key});
    if (!held) {
      Fallback();
      return std::nullopt;
    }
    if (held->type != REDIS_REPLY_STRING) return std::nullopt;  // expired in between
    return DecodeMarker(std::string_view(held->str, held->len));
  }

  void ReleasePreclaim(const ScopeHash& scope) override {
    if (Resting()) return;
    auto conn = store_internal::Borrow(pool_, options_.timeout);
    if (!conn) {
      Fallback();
      return;
    }
    if (!(*conn)->Command({"DEL", LockKey(scope)})) Fallback();
  }

  Result<std::unique_ptr<StoreTxn>> Begin() override { return inner_->Begin(); }
  Result<std::vector<SqlRow>> Query(std::string_view sql,
                                    const std::vector<SqlValue>& params) override {
    return inner_->Query(sql, params);
  }
  Result<std::vector<Record>> ListStale(int limit) override { return inner_->ListStale(limit); }
  Result<int> Sweep(int batch) override { return inner_->Sweep(batch); }
  Result<std::unique_ptr<Subscription>> SubscribeFinished(
      std::function<void(const ScopeHash&)> on_finished) override {
    return inner_->SubscribeFinished(std::move(on_finished));
  }

 private:
  std::string LockKey(const ScopeHash& scope) const {
    return options_.key_prefix + "lock:" + ToHex(scope);
  }

  // The rule: only finished records, only before their expiry by the store's clock.
  static bool Usable(const Record& r, Timestamp now) {
    return IsReplayable(r.state) && r.expires_at > now;
  }

  static Result<std::unique_ptr<RedisConn>> Connect(const Endpoint& e, Millis timeout) {
    timeval tv{static_cast<time_t>(timeout.count() / 1000),
               static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    redisContext* c = redisConnectWithTimeout(e.host.c_str(), e.port, tv);
    if (c == nullptr || c->err != 0) {
      const std::string why = c ? c->errstr : "out of memory";
      if (c) redisFree(c);
      return MakeError(Errc::kUnavailable, "redis connect: " + why);
    }
    redisSetTimeout(c, tv);
    return std::make_unique<RedisConn>(c);
  }

  // After a failure Redis is left alone for a second: a Redis that is down or slow must not add
  // its timeout to every request.
  void Fallback() {
    if (options_.on_fallback) options_.on_fallback();
    resting_until_ms_ = SteadyMs() + 1000;
  }
  bool Resting() const { return SteadyMs() < resting_until_ms_.load(); }
  static int64_t SteadyMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  std::optional<Record> FromRedis(const std::string& key) {
    if (Resting()) return std::nullopt;
    auto conn = store_internal::Borrow(pool_, options_.timeout);
    if (!conn) {
      Fallback();
      return std::nullopt;
    }
    Reply reply = (*conn)->Command({"GET", key});
    if (!reply) {
      Fallback();
      return std::nullopt;
    }
    if (reply->type != REDIS_REPLY_STRING) return std::nullopt;  // a miss
    return DecodeRecord(std::string_view(reply->str, reply->len));
  }

  void ToRedis(const std::string& key, const Record& r, Timestamp now) {
    const int64_t ttl_ms = ToUnixMillis(r.expires_at) - ToUnixMillis(now);
    if (ttl_ms <= 0 || Resting()) return;
    auto conn = store_internal::Borrow(pool_, options_.timeout);
    if (!conn) {
      Fallback();
      return;
    }
    const std::string value = EncodeRecord(r);
    const std::string ttl = std::to_string(ttl_ms);
    if (!(*conn)->Command({"SET", key, value, "PX", ttl})) Fallback();
  }

  std::unique_ptr<Store> inner_;
  RedisCacheOptions options_;
  Clock& clock_;
  Lru lru_;
  store_internal::Pool<RedisConn> pool_;
  StoreCapabilities caps_;
  std::atomic<int64_t> resting_until_ms_{0};
};

}  // namespace

Result<std::unique_ptr<Store>> WrapWithRedisCache(std::unique_ptr<Store> inner,
                                                  const RedisCacheOptions& options, Clock& clock) {
  IDEM_ASSIGN_OR_RETURN(Endpoint endpoint, ParseRedisUrl(options.url));
  if (options.pool_size < 1 || options.pool_size > 256) {
    return MakeError(Errc::kInvalidArgument, "redis: pool_size must be 1..256");
  }
  return std::unique_ptr<Store>(
      std::make_unique<RedisCachedStore>(std::move(inner), options, std::move(endpoint), clock));
}

}  // namespace idem
