// server/idemd/consumers/redis_stream.cc — a consumer group's reads, acknowledgements and
// dead letters on one Redis connection.
#include "server/idemd/consumers/redis_stream.h"

#include "http/log.h"
#include "src/store/redis/redis_client.h"

namespace idem::idemd {
namespace {

using redis_internal::Reply;

// Every command's deadline, the connect's included: longer than the longest BLOCK it waits.
constexpr Millis kCommandTimeout{5000};
// The longest a Receive blocks in XREADGROUP.
constexpr Millis kLongestBlock{2000};

std::string Text(const redisReply* r) {
  return r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
             ? std::string(r->str, r->len)
             : std::string();
}

// A stream entry, [id, [field, value, ...]], as a delivery; nullopt for anything else (an entry
// deleted while pending reads [id, nil] on some versions).
std::optional<Delivery> EntryOf(const redisReply* entry) {
  if (entry == nullptr || entry->type != REDIS_REPLY_ARRAY || entry->elements != 2) {
    return std::optional<Delivery>();
  }
  const redisReply* fields = entry->element[1];
  if (fields == nullptr || fields->type != REDIS_REPLY_ARRAY || fields->elements % 2 != 0) {
    return std::optional<Delivery>();
  }
  Delivery d;
  d.id = Text(entry->element[0]);
  for (std::size_t i = 0; i + 1 < fields->elements; i += 2) {
    d.fields.emplace_back(Text(fields->element[i]), Text(fields->element[i + 1]));
  }
  return d;
}

class RedisStream final : public MessageSource, public DeadLetterBox {
 public:
  RedisStream(const ConsumerRoute& consumer, redis_internal::Endpoint endpoint, std::string me,
              MonotonicClock& monotonic)
      : consumer_(consumer),
        endpoint_(std::move(endpoint)),
        me_(std::move(me)),
        monotonic_(monotonic),
        min_idle_(std::to_string(consumer.redeliver_after.count())) {}

  Result<std::optional<Delivery>> Receive(Millis wait) override {
    if (monotonic_.Now() >= next_scan_) {
      IDEM_ASSIGN_OR_RETURN(std::optional<Delivery> left, TakeOverOne());
      if (left) return left;
    }
    const std::string block = std::to_string(std::min(wait, kLongestBlock).count());
    IDEM_ASSIGN_OR_RETURN(
        Reply reply, Command({"XREADGROUP", "GROUP", consumer_.group, me_, "COUNT", "1", "BLOCK",
                              block, "STREAMS", consumer_.stream, ">"}));
    // nil: nothing came; else [[stream, [entry]]].
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements == 0) return std::optional<Delivery>();
    const redisReply* stream = reply->element[0];
    if (stream->type != REDIS_REPLY_ARRAY || stream->elements != 2 ||
        stream->element[1]->type != REDIS_REPLY_ARRAY || stream->element[1]->elements == 0) {
      return std::optional<Delivery>();
    }
    std::optional<Delivery> d = EntryOf(stream->element[1]->element[0]);
    if (d) d->received = monotonic_.Now();
    return d;
  }

  Status Ack(const Delivery& delivery) override {
    IDEM_ASSIGN_OR_RETURN(Reply reply,
                          Command({"XACK", consumer_.stream, consumer_.group, delivery.id}));
    return Ok();
  }

  Status Keep(const Delivery& delivery) override {
    // JUSTID: the idle time starts again, and the delivery count stays as it is.
    IDEM_ASSIGN_OR_RETURN(Reply reply, Command({"XCLAIM", consumer_.stream, consumer_.group, me_,
                                                "0", delivery.id, "JUSTID"}));
    return Ok();
  }

  bool TakesOverIdle() const override { return true; }
  Status Release(const Delivery& /*delivery*/) override { return Ok(); }

  Status Quarantine(const Delivery& delivery, std::string_view reason,
                    std::string_view detail) override {
    // XADD, and only when it succeeded XACK, in one script: Redis runs it whole, and a script
    // stops at its first failing call (a MULTI would acknowledge the message even when its XADD
    // failed, e.g. on a dead-letter key that is no stream). A consumer that dies before it leaves
    // the message pending, and the next one quarantines it again (the dead letter names its
    // source id).
    constexpr std::string_view kMove =
        "redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3)) "
        "return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])";
    const std::string deliveries = std::to_string(delivery.deliveries);
    std::vector<std::string_view> args = {"EVAL",
                                          kMove,
                                          "2",
                                          consumer_.stream,
                                          consumer_.dead_letter,
                                          consumer_.group,
                                          delivery.id,
                                          "idem_source_id",
                                          delivery.id,
                                          "idem_consumer",
                                          consumer_.name,
                                          "idem_reason",
                                          reason,
                                          "idem_detail",
                                          detail,
                                          "idem_deliveries",
                                          deliveries};
    for (const auto& [field, value] : delivery.fields) args.insert(args.end(), {field, value});
    auto moved = Command(args);
    if (!moved) {
      return MakeError(Errc::kUnavailable, "redis: the dead letter of " + delivery.id +
                                               " was not written: " + moved.error().message);
    }
    return Ok();
  }

  Result<std::vector<DeadLetter>> List(int limit) override {
    IDEM_ASSIGN_OR_RETURN(Reply range, Command({"XRANGE", consumer_.dead_letter, "-", "+", "COUNT",
                                                std::to_string(limit)}));
    std::vector<DeadLetter> out;
    for (std::size_t e = 0; range->type == REDIS_REPLY_ARRAY && e < range->elements; ++e) {
      std::optional<Delivery> entry = EntryOf(range->element[e]);
      if (!entry) continue;
      DeadLetter dead;
      dead.id = entry->id;
      for (auto& [field, value] : entry->fields) {
        if (field == "idem_source_id") {
          dead.source_id = value;
        } else if (field == "idem_reason") {
          dead.reason = value;
        } else if (field == "idem_detail") {
          dead.detail = value;
        } else if (field == "idem_deliveries") {
          dead.deliveries = std::atoll(value.c_str());
        } else if (field.rfind("idem_", 0) != 0) {
          dead.fields.emplace_back(std::move(field), std::move(value));
        }
      }
      out.push_back(std::move(dead));
    }
    return out;
  }

  Result<int64_t> Redrive(const std::set<std::string>& ids, int limit) override {
    // One script a dead letter: the entry read, its own fields (not quarantine's idem_*) added to
    // the consumer's stream, and only then the entry deleted. Redis runs it whole and stops at a
    // failing call, so a dead letter is never deleted before its message is back.
    constexpr std::string_view kBack =
        "local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) "
        "if #e == 0 then return 0 end "
        "local own = {} "
        "for i = 1, #e[1][2], 2 do "
        "  if string.sub(e[1][2][i], 1, 5) ~= 'idem_' then "
        "    own[#own + 1] = e[1][2][i] own[#own + 1] = e[1][2][i + 1] "
        "  end "
        "end "
        "if #own == 0 then return redis.error_reply('the dead letter has no fields of its own') "
        "end "
        "redis.call('XADD', KEYS[2], '*', unpack(own)) "
        "return redis.call('XDEL', KEYS[1], ARGV[1])";
    IDEM_ASSIGN_OR_RETURN(std::vector<DeadLetter> dead, List(limit));
    int64_t moved = 0;
    for (const DeadLetter& letter : dead) {
      if (!ids.empty() && !ids.contains(letter.id)) continue;
      auto back = Command({"EVAL", kBack, "2", consumer_.dead_letter, consumer_.stream, letter.id});
      if (!back) {
        return MakeError(Errc::kUnavailable, "redis: " + letter.id + " was not moved back (" +
                                                 std::to_string(moved) +
                                                 " were): " + back.error().message);
      }
      if ((*back)->type == REDIS_REPLY_INTEGER && (*back)->integer == 1) ++moved;
    }
    return moved;
  }

 private:
  // The next entry left unanswered past redeliver_after, claimed (XAUTOCLAIM counts the
  // delivery), with its delivery count; the scan goes on from where the last one stopped and,
  // once it has gone round, rests for a quarter of redeliver_after.
  Result<std::optional<Delivery>> TakeOverOne() {
    IDEM_ASSIGN_OR_RETURN(Reply reply, Command({"XAUTOCLAIM", consumer_.stream, consumer_.group,
                                                me_, min_idle_, cursor_, "COUNT", "1"}));
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 2) {
      return MakeError(Errc::kUnavailable, "redis: XAUTOCLAIM answered an unexpected reply");
    }
    cursor_ = Text(reply->element[0]);
    if (cursor_ == "0-0" || cursor_.empty()) {
      cursor_ = "0-0";
      next_scan_ = monotonic_.Now() + consumer_.redeliver_after / 4;
    }
    if (reply->elements >= 3 && reply->element[2]->type == REDIS_REPLY_ARRAY &&
        reply->element[2]->elements > 0) {
      // Trimmed from the stream while pending: the broker has lost them, not us; say so.
      http::Log(http::LogLevel::kError, "consumer message trimmed before it was answered",
                {{"consumer", consumer_.name},
                 {"stream", consumer_.stream},
                 {"id", Text(reply->element[2]->element[0])}});
    }
    const redisReply* entries = reply->element[1];
    if (entries->type != REDIS_REPLY_ARRAY || entries->elements == 0)
      return std::optional<Delivery>();
    std::optional<Delivery> d = EntryOf(entries->element[0]);
    if (!d) return std::optional<Delivery>();
    d->taken_over = true;
    d->received = monotonic_.Now();
    IDEM_ASSIGN_OR_RETURN(
        Reply pending, Command({"XPENDING", consumer_.stream, consumer_.group, d->id, d->id, "1"}));
    if (pending->type == REDIS_REPLY_ARRAY && pending->elements == 1 &&
        pending->element[0]->type == REDIS_REPLY_ARRAY && pending->element[0]->elements == 4 &&
        pending->element[0]->element[3]->type == REDIS_REPLY_INTEGER) {
      d->deliveries = pending->element[0]->element[3]->integer;
    } else {
      return std::optional<Delivery>();  // acknowledged meanwhile by the consumer it was taken from
    }
    return d;
  }

  // XINFO GROUPS' lag of the group (Redis 7; it is nil while Redis cannot tell, after an entry
  // was deleted from the middle of the stream).
  Result<int64_t> Backlog() override {
    IDEM_ASSIGN_OR_RETURN(Reply groups, Command({"XINFO", "GROUPS", consumer_.stream}));
    if (groups->type == REDIS_REPLY_ARRAY) {
      for (std::size_t g = 0; g < groups->elements; ++g) {
        const redisReply* group = groups->element[g];
        if (group->type != REDIS_REPLY_ARRAY) continue;
        std::optional<int64_t> lag;
        bool ours = false;
        for (std::size_t i = 0; i + 1 < group->elements; i += 2) {
          const redisReply* name = group->element[i];
          const redisReply* value = group->element[i + 1];
          if (name->type != REDIS_REPLY_STRING && name->type != REDIS_REPLY_STATUS) continue;
          const std::string_view field(name->str, name->len);
          if (field == "name" && value->type == REDIS_REPLY_STRING) {
            ours = std::string_view(value->str, value->len) == consumer_.group;
          } else if (field == "lag" && value->type == REDIS_REPLY_INTEGER) {
            lag = value->integer;
          }
        }
        if (ours && lag) return *lag;
        if (ours) break;
      }
    }
    return MakeError(Errc::kUnavailable, "redis: XINFO GROUPS tells no lag of group " +
                                             consumer_.group + " (Redis 7 or later tells it)");
  }

  // One command on the connection, connecting (and creating the stream and the group) first
  // when there is none. A failure drops a broken connection; an error reply is kUnavailable.
  Result<Reply> Command(const std::vector<std::string_view>& args) {
    if (conn_ == nullptr || conn_->Broken()) {
      conn_.reset();
      IDEM_ASSIGN_OR_RETURN(conn_, redis_internal::ConnectRedis(endpoint_, kCommandTimeout));
      Reply created =
          conn_->Command({"XGROUP", "CREATE", consumer_.stream, consumer_.group, "0", "MKSTREAM"});
      if (!created && conn_->LastError().rfind("BUSYGROUP", 0) != 0) {
        const std::string why = conn_->LastError();
        conn_.reset();
        return MakeError(Errc::kUnavailable, "redis: XGROUP CREATE " + consumer_.stream + " " +
                                                 consumer_.group + ": " + why);
      }
    }
    Reply reply = conn_->Command(args);
    if (reply == nullptr) {
      const std::string why = conn_->LastError();
      if (conn_->Broken() || why.rfind("NOGROUP", 0) == 0) conn_.reset();  // made again
      return MakeError(Errc::kUnavailable, "redis " + std::string(args[0]) + ": " + why);
    }
    return reply;
  }

  const ConsumerRoute& consumer_;
  const redis_internal::Endpoint endpoint_;
  const std::string me_;
  MonotonicClock& monotonic_;
  const std::string min_idle_;
  std::unique_ptr<redis_internal::RedisConn> conn_;
  std::string cursor_ = "0-0";
  SteadyTime next_scan_{};
};

}  // namespace

Result<std::unique_ptr<MessageSource>> OpenRedisStream(const ConsumerRoute& consumer,
                                                       std::string me, MonotonicClock& monotonic) {
  IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint endpoint,
                        redis_internal::ParseRedisUrl(consumer.url));
  return std::unique_ptr<MessageSource>(
      std::make_unique<RedisStream>(consumer, std::move(endpoint), std::move(me), monotonic));
}

Result<std::unique_ptr<DeadLetterBox>> OpenRedisDeadLetters(const ConsumerRoute& consumer) {
  IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint endpoint,
                        redis_internal::ParseRedisUrl(consumer.url));
  return std::unique_ptr<DeadLetterBox>(std::make_unique<RedisStream>(
      consumer, std::move(endpoint), "idemctl", SystemMonotonicClock()));
}

}  // namespace idem::idemd
