// server/idemd/consumers/rabbitmq.h — a RabbitMQ queue as a MessageSource (rabbitmq-c): one
// connection per thread, a prefetch of one, acknowledgements by hand. A delivery stays this
// consumer's until it is acknowledged, given back (basic.nack with requeue) or its connection
// closes, when the broker delivers it again; a quorum queue counts the deliveries
// (x-delivery-count). Quarantined messages are published to the dead-letter queue under
// publisher confirms before the original is acknowledged.
#pragma once

#include <memory>
#include <string>

#include "server/idemd/consumers/consumer_route.h"
#include "server/idemd/consumers/source.h"

namespace idem::idemd {

// A source for `consumer`. Connects lazily, and again after a failure; declares the queue (a
// durable quorum queue with a delivery limit of 2 x max_attempts + 2 that dead-letters to the
// dead-letter queue) and the dead-letter queue when they do not exist. Errors: kInvalidArgument
// for a URL that is not amqp://user:password@host[:port]/vhost. With `consume` false it takes no
// message: a source asked only for its Backlog.
Result<std::unique_ptr<MessageSource>> OpenRabbitQueue(const ConsumerRoute& consumer,
                                                       MonotonicClock& monotonic,
                                                       bool consume = true);

// `consumer`'s dead-letter queue (basic.get; what is not moved is given back). Errors: as
// OpenRabbitQueue's.
Result<std::unique_ptr<DeadLetterBox>> OpenRabbitDeadLetters(const ConsumerRoute& consumer);

}  // namespace idem::idemd
