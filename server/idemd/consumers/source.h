// server/idemd/consumers/source.h — where a consumer's messages come from: a broker seen as
// deliveries to take, acknowledge, keep and quarantine. One per consumer thread (a connection
// of its own); a broker adapter implements it (redis_stream.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/result.h"

namespace idem::idemd {

// One delivery of a message.
struct Delivery {
  // The broker's id of the message: a stream entry's id, a RabbitMQ message's message-id
  // property ("" when it has none).
  std::string id;
  // The broker's handle of this delivery (a RabbitMQ delivery tag); 0 where the id serves.
  uint64_t tag = 0;
  // The message's fields (a stream entry's field-value pairs, the body's among them), in order.
  std::vector<std::pair<std::string, std::string>> fields;
  // How often the broker has delivered the message, this delivery included.
  int64_t deliveries = 1;
  // Taken over from another consumer that left it unanswered (a redelivery).
  bool taken_over = false;
  // When this consumer took it, by its monotonic clock.
  SteadyTime received{};

  // The first field called `name`, or nullopt.
  std::optional<std::string_view> Field(std::string_view name) const {
    for (const auto& [key, value] : fields) {
      if (key == name) return std::string_view(value);
    }
    return std::nullopt;
  }
};

// Not thread-safe: one per thread. Errors of every call: kUnavailable when the broker cannot be
// reached or refuses (the caller waits and tries again; nothing is lost: an unacknowledged
// delivery is delivered again).
class MessageSource {
 public:
  virtual ~MessageSource() = default;

  // One delivery: first one another consumer (or an earlier life of this one) left unanswered
  // for longer than the consumer's redeliver_after, taken over; else a new message, waiting up
  // to `wait` for one; nullopt when none came.
  virtual Result<std::optional<Delivery>> Receive(Millis wait) = 0;
  // The message is answered: the broker forgets it.
  virtual Status Ack(const Delivery& delivery) = 0;
  // Keeps `delivery` this consumer's while it waits for its answer (a running duplicate, a
  // store that is down): the broker does not hand it to another consumer meanwhile, and does
  // not count a delivery.
  virtual Status Keep(const Delivery& delivery) = 0;
  // Whether a delivery left unanswered goes to another consumer by itself once it has been idle
  // for the consumer's redeliver_after (a Redis stream's XAUTOCLAIM). Otherwise (RabbitMQ) a
  // delivery stays this consumer's until it is answered, Released or its connection closes.
  virtual bool TakesOverIdle() const = 0;
  // Gives the delivery back to the broker for a later delivery, which counts (a retryable
  // failure); nothing where TakesOverIdle.
  virtual Status Release(const Delivery& delivery) = 0;
  // Moves the message to the dead-letter stream with `reason` (a word) and `detail` (a sentence)
  // and acknowledges it, both or neither.
  virtual Status Quarantine(const Delivery& delivery, std::string_view reason,
                            std::string_view detail) = 0;
  // The messages the broker holds for the consumer that no consumer has been given yet (a
  // stream's entries past the group's last delivered one; a queue's ready messages): its lag.
  virtual Result<int64_t> Backlog() = 0;
};

}  // namespace idem::idemd
