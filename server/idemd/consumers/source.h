// server/idemd/consumers/source.h — where a consumer's messages come from: a broker seen as
// deliveries to take, acknowledge, keep and quarantine. One per consumer thread (a connection
// of its own); a broker adapter implements it (redis_stream.h).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
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

// A quarantined message as its dead-letter stream or queue holds it.
struct DeadLetter {
  // What Redrive names it by: the dead-letter stream entry's id; a RabbitMQ dead letter's
  // message-id (the message's own, "" when it has none).
  std::string id;
  std::string source_id;  // the message's id in the consumer's stream or queue
  // payload-mismatch, invalid, attempts; delivery_limit (dead-lettered by the queue itself)
  std::string reason;
  std::string detail;
  int64_t deliveries = 0;
  // The message's own fields (a stream entry's, a RabbitMQ message's headers), its body under
  // the consumer's body_field among them.
  std::vector<std::pair<std::string, std::string>> fields;
};

// An operator's view of one consumer's dead letters (idemctl dead-letter). Not thread-safe.
// Errors: kUnavailable when the broker cannot be reached or refuses.
class DeadLetterBox {
 public:
  virtual ~DeadLetterBox() = default;
  // The first `limit` dead letters, oldest first. Nothing is moved.
  virtual Result<std::vector<DeadLetter>> List(int limit) = 0;
  // Moves the dead letters named by `ids` (every one when empty) among the first `limit` back to
  // the consumer's stream or queue as the messages they were, without what quarantine added;
  // each both or neither (a dead letter is deleted only once its message is back; a failure in
  // between leaves it in both, which the message's key makes harmless). Returns how many moved.
  virtual Result<int64_t> Redrive(const std::set<std::string>& ids, int limit) = 0;
};

}  // namespace idem::idemd
