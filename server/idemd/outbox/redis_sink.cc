// server/idemd/outbox/redis_sink.cc — the outbox relay's Redis stream (relay.h).
#include <string>
#include <vector>

#include "server/idemd/outbox/relay.h"
#include "src/store/redis/redis_client.h"

namespace idem::idemd {
namespace {

// Every command's deadline, the connect's included.
constexpr Millis kCommandTimeout{5000};

// Appends a page of events to KEYS[1], six arguments each, in order: a script runs whole, so the
// page is appended in order and nothing else lands between its entries. Returns the count. The
// fields are those idemd's queue consumers read by default: `key`, the event id; `body`, the
// payload.
constexpr std::string_view kAppendScript = R"lua(
for i = 1, #ARGV, 6 do
  redis.call('XADD', KEYS[1], '*', 'key', ARGV[i], 'type', ARGV[i + 1],
             'aggregate', ARGV[i + 2], 'sequence', ARGV[i + 3],
             'content_type', ARGV[i + 4], 'body', ARGV[i + 5])
end
return #ARGV / 6
)lua";

class RedisEventSink final : public EventSink {
 public:
  RedisEventSink(redis_internal::Endpoint endpoint, std::string stream)
      : endpoint_(std::move(endpoint)), stream_(std::move(stream)) {}

  std::size_t Publish(std::span<const OutboxEvent> events, std::optional<Error>* error) override {
    if (events.empty()) return 0;
    if (conn_ == nullptr || conn_->Broken()) {
      conn_.reset();
      auto connected = redis_internal::ConnectRedis(endpoint_, kCommandTimeout);
      if (!connected) {
        *error = std::move(connected).error();
        return 0;
      }
      conn_ = std::move(*connected);
    }
    std::vector<std::string> sequences;
    sequences.reserve(events.size());
    for (const OutboxEvent& e : events) sequences.push_back(std::to_string(e.sequence));
    std::vector<std::string_view> args = {"EVAL", kAppendScript, "1", stream_};
    args.reserve(4 + 6 * events.size());
    for (std::size_t i = 0; i < events.size(); ++i) {
      const OutboxEvent& e = events[i];
      args.insert(args.end(), {e.id, e.type, e.aggregate, sequences[i], e.content_type, e.payload});
    }
    redis_internal::Reply reply = conn_->Command(args);
    if (reply == nullptr || reply->type != REDIS_REPLY_INTEGER ||
        reply->integer != static_cast<long long>(events.size())) {
      // An error reply or a lost connection: perhaps appended, perhaps not. Nothing is marked,
      // and the next pass appends the page again (the same event ids).
      *error = MakeError(Errc::kUnavailable, "redis: appending " + std::to_string(events.size()) +
                                                 " events to " + stream_ + ": " +
                                                 (reply == nullptr ? conn_->LastError()
                                                                   : std::string("a reply of "
                                                                                 "another shape")));
      if (reply == nullptr) conn_.reset();
      return 0;
    }
    return events.size();
  }

  std::string Describe() const override { return "redis stream " + stream_; }

 private:
  redis_internal::Endpoint endpoint_;
  std::string stream_;
  std::unique_ptr<redis_internal::RedisConn> conn_;
};

}  // namespace

Result<std::unique_ptr<EventSink>> OpenRedisEventSink(const std::string& url,
                                                      const std::string& stream) {
  if (stream.empty()) return MakeError(Errc::kInvalidArgument, "outbox: the stream is empty");
  IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint endpoint, redis_internal::ParseRedisUrl(url));
  return std::unique_ptr<EventSink>(new RedisEventSink(std::move(endpoint), stream));
}

}  // namespace idem::idemd
