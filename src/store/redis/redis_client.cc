// src/store/redis/redis_client.cc — connections, the pool and the rest period after a failure.
#include "src/store/redis/redis_client.h"

#include <boost/url/parse.hpp>
#include <chrono>

namespace idem::redis_internal {
namespace {

Error BadUrl(const std::string& why) {
  return MakeError(Errc::kInvalidArgument,
                   "redis URL: " + why + " (redis://[[user]:password@]host[:port][/database])");
}

// A reply's text, for an error message.
std::string ReplyText(const redisReply* r) {
  if (r == nullptr) return "no answer";
  if (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS) return {r->str, r->len};
  return "an unexpected reply";
}

}  // namespace

Result<std::unique_ptr<RedisConn>> ConnectRedis(const Endpoint& e, Millis timeout) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  redisContext* c = redisConnectWithTimeout(e.host.c_str(), e.port, tv);
  if (c == nullptr || c->err != 0) {
    const std::string why = c ? c->errstr : "out of memory";
    if (c) redisFree(c);
    return MakeError(Errc::kUnavailable, "redis connect: " + why);
  }
  redisSetTimeout(c, tv);
  auto conn = std::make_unique<RedisConn>(c);
  // AUTH with a user is Redis 6's ACL form; without one, the password of `requirepass`.
  if (!e.password.empty()) {
    std::vector<std::string_view> auth = {"AUTH"};
    if (!e.user.empty()) auth.emplace_back(e.user);
    auth.emplace_back(e.password);
    if (std::string why; !conn->Expect(auth, &why)) {
      return MakeError(Errc::kUnavailable, "redis AUTH refused: " + why);
    }
  }
  if (e.database != 0) {
    const std::string db = std::to_string(e.database);
    if (std::string why; !conn->Expect({"SELECT", db}, &why)) {
      return MakeError(Errc::kUnavailable, "redis SELECT " + db + " refused: " + why);
    }
  }
  return conn;
}

Reply RedisConn::Send(const std::vector<std::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return Reply(static_cast<redisReply*>(
      redisCommandArgv(ctx_.get(), static_cast<int>(args.size()), argv.data(), lens.data())));
}

Reply RedisConn::Command(const std::vector<std::string_view>& args) {
  Reply reply = Send(args);
  if (reply && reply->type != REDIS_REPLY_ERROR) return reply;
  last_error_ = reply ? ReplyText(reply.get()) : std::string(ctx_->errstr);
  return nullptr;
}

bool RedisConn::Expect(const std::vector<std::string_view>& args, std::string* why) {
  Reply reply = Send(args);
  if (reply && reply->type == REDIS_REPLY_STATUS) return true;
  *why = reply ? ReplyText(reply.get()) : std::string(ctx_->errstr);
  return false;
}

Result<Endpoint> ParseRedisUrl(const std::string& text) {
  auto url = boost::urls::parse_absolute_uri(text);
  if (!url) return BadUrl("not a URL (percent-encode @ : / % in the password)");
  if (url->scheme() == "rediss") {
    return BadUrl("rediss:// (TLS) is not supported by this build: its hiredis has no TLS");
  }
  if (url->scheme() != "redis") return BadUrl("the scheme must be redis://");
  Endpoint e;
  e.host = url->host_address();  // an IPv6 address without its brackets
  if (e.host.empty()) return BadUrl("no host");
  if (url->has_port()) {
    if (url->port_number() == 0) return BadUrl("bad port '" + std::string(url->port()) + "'");
    e.port = url->port_number();
  }
  if (url->has_userinfo()) {
    e.user = url->user();
    e.password = url->password();
    if (e.password.empty()) return BadUrl("user info without a password");
  }
  std::string path = url->path();
  if (!path.empty() && path != "/") {
    const std::string db = path.substr(1);
    if (db.empty() || db.size() > 9 || db.find_first_not_of("0123456789") != std::string::npos) {
      return BadUrl("the path must be a database number, got '" + path + "'");
    }
    e.database = std::stoi(db);
  }
  if (url->has_query() || url->has_fragment()) return BadUrl("no query or fragment is read");
  return e;
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
            return ConnectRedis(endpoint, timeout);
          },
          options.pool_size) {}

Reply RedisClient::Command(const std::vector<std::string_view>& args) {
  if (Resting()) return nullptr;
  auto conn = store_internal::Borrow(pool_, options_.timeout);
  if (!conn) {
    Fallback(conn.error().message);
    return nullptr;
  }
  Reply reply = (*conn)->Command(args);
  if (!reply) {
    Fallback("redis " + std::string(args.empty() ? "" : args[0]) + ": " + (*conn)->LastError());
  } else {
    Answered();
  }
  return reply;
}

int64_t RedisClient::NowMs() const {
  return std::chrono::duration_cast<Millis>(monotonic_.Now().time_since_epoch()).count();
}

bool RedisClient::Resting() const { return NowMs() < resting_until_ms_.load(); }

void RedisClient::CountFallback() const {
  if (options_.on_fallback) options_.on_fallback();
}

void RedisClient::Fallback(std::string_view why) {
  CountFallback();
  resting_until_ms_ = NowMs() + options_.rest_after_failure.count();
  // Under the lock, so the reports of concurrent calls come out in the order of the changes.
  MutexLock lock(health_mu_);
  if (failing_.exchange(true)) return;
  if (options_.on_health) options_.on_health(why);
}

void RedisClient::Answered() {
  if (!failing_.load(std::memory_order_relaxed)) return;  // healthy traffic takes no lock
  MutexLock lock(health_mu_);
  if (!failing_.exchange(false)) return;
  if (options_.on_health) options_.on_health("");
}

}  // namespace idem::redis_internal
