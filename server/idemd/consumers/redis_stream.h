// server/idemd/consumers/redis_stream.h — a Redis stream read through a consumer group, as a
// MessageSource: XREADGROUP for new entries, XAUTOCLAIM for entries another consumer left
// unanswered (their delivery count from XPENDING), XACK, XCLAIM JUSTID to keep one, and the
// dead-letter stream written in one script with the XACK.
#pragma once

#include <memory>
#include <string>

#include "server/idemd/consumers/consumer_route.h"
#include "server/idemd/consumers/source.h"

namespace idem::idemd {

// A source for `consumer` under the name `me` in its group (unique per thread and process, e.g.
// "host-1234-0"). Connects lazily, and again after a failure; creates the stream and the group
// (reading from the stream's beginning) when they do not exist. Errors: kInvalidArgument for a
// URL the client refuses.
Result<std::unique_ptr<MessageSource>> OpenRedisStream(const ConsumerRoute& consumer,
                                                       std::string me, MonotonicClock& monotonic);

// `consumer`'s dead-letter stream. Errors: as OpenRedisStream's.
Result<std::unique_ptr<DeadLetterBox>> OpenRedisDeadLetters(const ConsumerRoute& consumer);

}  // namespace idem::idemd
