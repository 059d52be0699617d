// src/store/redis/redis_client.cc — connections, the pool and the rest period after a failure.
#include "src/store/redis/redis_client.h"

#include <chrono>

namespace idem::redis_internal {
namespace {

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

Result<std::unique_ptr<RedisConn>> Connect(const Endpoint& e, Millis timeout) {
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

}  // namespace

Reply RedisConn::Command(const std::vector<std::string_view>& args) {
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

Result<std::shared_ptr<RedisClient>> RedisClient::Create(const RedisCacheOptions& options) {
  IDEM_ASSIGN_OR_RETURN(Endpoint endpoint, ParseRedisUrl(options.url));
  if (options.pool_size < 1 || options.pool_size > 256) {
    return MakeError(Errc::kInvalidArgument, "redis: pool_size must be 1..256");
  }
  return std::make_shared<RedisClient>(options, std::move(endpoint));
}

RedisClient::RedisClient(const RedisCacheOptions& options, Endpoint endpoint)
    : options_(options),
      monotonic_(options.monotonic != nullptr ? *options.monotonic : SystemMonotonicClock()),
      pool_(
          "redis", {},
          [endpoint = std::move(endpoint), timeout = options.timeout]() {
            return Connect(endpoint, timeout);
          },
          options.pool_size) {}

Reply RedisClient::Command(const std::vector<std::string_view>& args) {
  if (Resting()) return nullptr;
  auto conn = store_internal::Borrow(pool_, options_.timeout);
  if (!conn) {
    Fallback();
    return nullptr;
  }
  Reply reply = (*conn)->Command(args);
  if (!reply) Fallback();
  return reply;
}

int64_t RedisClient::NowMs() const {
  return std::chrono::duration_cast<Millis>(monotonic_.Now().time_since_epoch()).count();
}

bool RedisClient::Resting() const { return NowMs() < resting_until_ms_.load(); }

void RedisClient::CountFallback() const {
  if (options_.on_fallback) options_.on_fallback();
}

void RedisClient::Fallback() {
  CountFallback();
  resting_until_ms_ = NowMs() + options_.rest_after_failure.count();
}

}  // namespace idem::redis_internal
