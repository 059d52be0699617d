// server/idemd/consumers/consumer_route.h — a queue consumer ([[consumers]] in idemd.toml,
// docs/consumers.md): where its messages come from, which key each one is recognised by, and the
// request each one becomes. Read and checked by LoadConfig (consumer_config.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "server/idemd/gateway/routes.h"

namespace idem::idemd {

// Bounds of a consumer's settings.
inline constexpr std::size_t kMaxConsumers = 64;
inline constexpr int kMaxConsumerConcurrency = 64;
inline constexpr int kMaxConsumerAttempts = 1000;
inline constexpr std::size_t kMaxStreamNameLength = 255;

// Where a message's key comes from.
enum class KeySource : uint8_t {
  kField,     // a field of the message (a stream entry's field, an AMQP header)
  kJson,      // a member of the JSON body, by JSON pointer (RFC 6901): "/order/id"
  kBrokerId,  // the broker's id of the message (a stream entry's id): only where nothing else is
};

struct ConsumerRoute {
  std::string name;  // [a-z0-9._-], unique: metrics, logs, and the records' route id
  // The broker: "redis" (a Redis stream read through a consumer group) or "rabbitmq" (a queue,
  // declared a quorum queue when it does not exist).
  std::string source = "redis";
  // redis://[[user]:password@]host[:port][/database], or amqp://user:password@host[:port]/vhost
  std::string url;
  std::string stream;  // redis
  std::string queue;   // rabbitmq
  std::string group = "idem";
  // The stream entry's field that holds the message's body (the payload the target receives);
  // a RabbitMQ message's body is its body, offered to the key rule under this name.
  std::string body_field = "body";
  // Fields of the message sent as headers of the same name (lower case) with its request: a
  // trace id, a tenant's header the upstream reads. Not part of the fingerprint.
  std::vector<std::string> header_fields;
  KeySource key_source = KeySource::kField;
  std::string key_name = "key";  // the field's name, or the JSON pointer
  // The stream or queue quarantined messages go to, with why (default: stream or queue +
  // ".dead").
  std::string dead_letter;
  // Attempts of one message, at most: a message whose record has had this many executions
  // started without a final answer (retryable failures, or a consumer that died each time it
  // ran it), or that was delivered more often than this without reaching its claim, is
  // quarantined (Consumer::TooOften).
  int max_attempts = 5;
  // How long a delivered message may go unanswered (not acknowledged, not kept by its consumer)
  // before another consumer takes it over: longer than target.lease.
  Millis redeliver_after{60000};
  int concurrency = 4;  // messages in hand at once, per idemd process
  // The tenant whose payments the messages are, when the target is idemd's own payments
  // operation (each message a POST /v1/payments of this tenant: a queue of payment commands);
  // "" when it is an HTTP upstream ([consumers.target]).
  std::string payments_tenant;
  // The request each message becomes, and where it goes: a gateway route's settings, with the
  // consumer's name and one fixed path (route_config.h, ReadConsumerTarget). For a payments
  // target, POST /v1/payments with a JSON body, and the payments' lease, retention and provider
  // timeout ([idempotency], [provider]), set by LoadConfig.
  GatewayRoute target;
  int64_t line = 0;  // where its [[consumers]] table begins in the file

  bool IsRabbitMq() const { return source == "rabbitmq"; }
  bool IsPayments() const { return !payments_tenant.empty(); }
  // The stream or the queue.
  const std::string& Source() const { return IsRabbitMq() ? queue : stream; }
  // The records' route id: "mq." + name.
  std::string RouteId() const { return "mq." + name; }
  // How long after its first delivery a message can still be delivered again by the broker's
  // own retries: max_attempts redeliveries, each after redeliver_after at most a lease late.
  Millis RedeliveryHorizon() const { return max_attempts * (redeliver_after + target.lease); }
};

}  // namespace idem::idemd
