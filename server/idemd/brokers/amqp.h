// server/idemd/brokers/amqp.h — what idemd's RabbitMQ code shares (rabbitmq-c): the URL, a
// connection logged in under a deadline, replies read as errors, and a publish under publisher
// confirms. The queue consumers (consumers/rabbitmq.cc) and the outbox relay's exchange
// (outbox/rabbit_sink.cc) are built on it.
#pragma once

#include <amqp.h>
#include <sys/time.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/result.h"

namespace idem::idemd::amqp {

// Where and as whom: amqp://user:password@host[:port]/vhost.
struct Endpoint {
  std::string host;
  int port = 5672;
  std::string user;
  std::string password;
  std::string vhost;
};
// Errors: kInvalidArgument for a URL of another shape.
Result<Endpoint> ParseUrl(const std::string& url);

timeval Timeval(Millis m);
std::string Text(amqp_bytes_t bytes);
// A view of `text` for rabbitmq-c, which reads it and never writes it.
amqp_bytes_t Bytes(const std::string& text);
// What went wrong in `reply`, or "" when it is a normal one.
std::string ReplyError(const amqp_rpc_reply_t& reply, const char* what);
// Whether `reply` is the channel closed with 404 (a passive declare of something absent).
bool IsNotFound(const amqp_rpc_reply_t& reply);

// A new connection to `endpoint`, logged in, every call bounded by `timeout` (the connect's
// included); no heartbeats. Errors: kUnavailable naming what failed (the connection is then
// destroyed).
Result<amqp_connection_state_t> Connect(const Endpoint& endpoint, Millis timeout);

// Opens `channel`. Errors: kUnavailable (the connection is left to the caller to drop).
Status OpenChannel(amqp_connection_state_t conn, amqp_channel_t channel);

// One message to publish: persistent, mandatory.
struct Message {
  std::string exchange;     // "" for the default exchange
  std::string routing_key;  // the queue's name on the default exchange
  std::vector<std::pair<std::string, std::string>> headers;  // as UTF-8 strings
  std::string message_id;                                    // "" for none
  std::string content_type;                                  // "" for none
  std::string body;
};

// Publishes `message` on `channel` (in confirm mode: confirm.select was done) and waits up to
// `timeout` for the broker's confirm. A message no queue takes comes back (basic.return): an
// error, never a message dropped in silence. Errors: kUnavailable (after any of them the
// connection must be dropped: its state is unknown).
Status PublishConfirmed(amqp_connection_state_t conn, amqp_channel_t channel,
                        const Message& message, Millis timeout);

}  // namespace idem::idemd::amqp
