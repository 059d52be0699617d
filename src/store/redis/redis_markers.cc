// src/store/redis/redis_markers.cc — in-flight markers in Redis: SET NX PX to place one, and an
// owner-checked compare-and-delete (a Lua script) to release it.
#include <algorithm>
#include <array>

#include "idem/inflight.h"
#include "src/core/wire.h"
#include "src/store/redis/redis_client.h"

namespace idem::redis_internal {
namespace {

using wire::PutBytes;
using wire::PutInt;

constexpr std::string_view kFormat = "m3";

// Deletes KEYS[1] only if it still holds ARGV[1], the exact value its placer wrote: atomic in
// Redis, so a marker placed by someone else in between is never deleted.
constexpr std::string_view kReleaseScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
    "return 0";

// The marker of KEYS[1] and how many milliseconds it still lives by Redis's clock, or nil.
constexpr std::string_view kReadScript =
    "local v = redis.call('GET', KEYS[1]) if not v then return nil end "
    "return {v, redis.call('PTTL', KEYS[1])}";

// A marker's value: what it says, and 16 random bytes that make every placement's value unique.
// The value is the placer's token.
std::string EncodeMarker(const InFlight& m, const std::array<uint8_t, 16>& nonce) {
  std::string out;
  PutBytes(out, kFormat);
  PutBytes(out, nonce);
  PutBytes(out, m.fingerprint.mac);
  PutInt(out, m.fingerprint.rules_version);
  PutInt(out, m.fingerprint.secret_id);
  PutInt(out, ToUnixMillis(m.expires_at));
  return out;
}

std::optional<InFlight> DecodeMarker(std::string_view bytes) {
  wire::Reader in(bytes);
  InFlight m;
  std::string format;
  std::array<uint8_t, 16> nonce;
  int64_t rules, secret, expires;
  if (!in.Bytes(&format) || format != kFormat || !in.Bytes(&nonce) ||
      !in.Bytes(&m.fingerprint.mac) || !in.Int(&rules) || !in.Int(&secret) || !in.Int(&expires) ||
      !in.Done()) {
    return std::nullopt;
  }
  m.fingerprint.rules_version = static_cast<uint32_t>(rules);
  m.fingerprint.secret_id = static_cast<uint32_t>(secret);
  m.expires_at = FromUnixMillis(expires);
  return m;
}

class RedisInFlightMarkers final : public InFlightMarkers {
 public:
  RedisInFlightMarkers(std::shared_ptr<RedisClient> client, Random& random)
      : client_(std::move(client)), random_(random) {}

  // SET key value NX PX ttl: the first request of a scope places the marker; a concurrent
  // duplicate reads the holder's marker back.
  Placement Place(const ScopeHash& scope, const InFlight& mine, Millis ttl) override {
    if (ttl.count() <= 0 || client_->Resting()) return {};
    std::array<uint8_t, 16> nonce;
    random_.Fill(nonce);
    MarkerToken value = EncodeMarker(mine, nonce);
    const std::string key = Key(scope);
    const std::string ttl_ms = std::to_string(ttl.count());
    Reply set = client_->Command({"SET", key, value, "NX", "PX", ttl_ms});
    if (!set) return {};
    if (set->type == REDIS_REPLY_STATUS) return Placement{std::move(value), std::nullopt};  // OK
    Reply held = client_->Command({"EVAL", kReadScript, "1", key});
    // A failure, or expired in between.
    if (!held || held->type != REDIS_REPLY_ARRAY || held->elements != 2) return {};
    const redisReply* marker_value = held->element[0];
    const redisReply* left = held->element[1];
    if (marker_value->type != REDIS_REPLY_STRING || left->type != REDIS_REPLY_INTEGER) return {};
    // A marker this build cannot read (another version's) tells nothing: go to the database.
    std::optional<InFlight> marker =
        DecodeMarker(std::string_view(marker_value->str, marker_value->len));
    if (marker) marker->lease_left = Millis(std::max<long long>(left->integer, 0));
    return Placement{std::nullopt, std::move(marker)};
  }

  void Release(const ScopeHash& scope, const MarkerToken& token) override {
    (void)client_->Command({"EVAL", kReleaseScript, "1", Key(scope), token});
  }

 private:
  std::string Key(const ScopeHash& scope) const {
    return client_->options().key_prefix + "lock:" + ToHex(scope);
  }

  std::shared_ptr<RedisClient> client_;
  Random& random_;
};

}  // namespace

std::unique_ptr<InFlightMarkers> MakeRedisMarkers(std::shared_ptr<RedisClient> client,
                                                  Random& random) {
  return std::make_unique<RedisInFlightMarkers>(std::move(client), random);
}

}  // namespace idem::redis_internal
