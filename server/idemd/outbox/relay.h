// server/idemd/outbox/relay.h — the outbox relay (docs/outbox.md): publishes the events the
// payments wrote to the outbox (include/idem/outbox.h) to a broker, in order, and marks each
// published only once the broker confirmed it. A crash between the two publishes it again (the
// same id: consumers drop the copy); nothing confirmed is ever lost, and nothing unconfirmed is
// ever marked. One relay at a time on all instances, under a fenced lease (JobLease).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "idem/clock.h"
#include "idem/outbox.h"
#include "idem/store.h"

namespace idem::idemd {

class Metrics;

// Where a relay publishes (a Redis stream, a RabbitMQ exchange). Used by one thread at a time.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Publishes `events` in their order. Returns how many of them, from the first, the broker
  // confirmed; fewer than all only with *error set to why the rest were not (then a later event
  // was not confirmed either: an event is never confirmed after one that was not).
  virtual std::size_t Publish(std::span<const OutboxEvent> events, std::optional<Error>* error) = 0;
  // What it publishes to, for logs: "redis stream payments.events".
  virtual std::string Describe() const = 0;
};

// A sink on a Redis stream: each event one entry (XADD with an id Redis gives), its fields
// event_id, type, aggregate, sequence, content_type and payload; a page of events in one script,
// so they are appended in order, together, or not at all. As durable as the Redis is configured
// (appendfsync always: on disk before it answers). Errors: kInvalidArgument for a URL that is
// not redis://[[user]:password@]host[:port][/db] or an empty stream.
Result<std::unique_ptr<EventSink>> OpenRedisEventSink(const std::string& url,
                                                      const std::string& stream);

// A sink on a RabbitMQ exchange, which must exist (idemd declares none): each event a persistent
// message published with `mandatory` under publisher confirms, one confirmed before the next
// leaves; its message-id the event id, its content type the event's, headers type, aggregate and
// sequence, its routing key `routing_key` or, when that is empty, the event's type
// (payment.succeeded, ...). A message no queue takes comes back, and counts as not confirmed.
// Errors: kInvalidArgument for a URL that is not amqp://user:password@host[:port]/vhost or an
// empty exchange.
Result<std::unique_ptr<EventSink>> OpenRabbitEventSink(const std::string& url,
                                                       const std::string& exchange,
                                                       const std::string& routing_key);

// The sink of an [outbox] section (config.h): Redis or RabbitMQ. Errors: as the two Open's;
// kInvalidArgument for broker "off".
struct OutboxConfig;
Result<std::unique_ptr<EventSink>> OpenEventSink(const OutboxConfig& config);

struct RelayOptions {
  int batch = 100;       // events read and published at a time (1..kOutboxPageMax)
  Millis lease{30'000};  // the relay's lease; renewed before every page
  Millis retention{7LL * 24 * 3'600'000};  // published events are swept this long after
  int sweep_batches = 20;                  // per pass, of 500 events each
};

// What one pass did.
struct RelayPass {
  int64_t published = 0;    // events confirmed and marked
  int64_t republished = 0;  // of them, events a replay set back (published before)
  int64_t swept = 0;        // published events deleted past retention
};

// Thread-compatible: one pass at a time per object; passes on several instances exclude each
// other through the lease.
class Relay {
 public:
  // Borrows everything; `metrics` may be null.
  Relay(Store& store, EventSink& sink, Clock& clock, RelayOptions options, Metrics* metrics);

  // One pass: takes the lease, publishes pages of unpublished events (oldest first, each
  // payment's in sequence order) until none is left or `max_events` went, marking each page's
  // confirmed events in the transaction that renews the lease, then sweeps published events past
  // retention and gives the lease back. Errors: kConflict (another instance relays now);
  // kFenced (the lease ran out mid-pass: the instance that took it over publishes the rest, and
  // what this pass published and could not mark again); kUnavailable / kDeadlineExceeded (the
  // broker or the store: what was confirmed before is marked, the rest waits for the next pass).
  Result<RelayPass> RunOnce(int64_t max_events);

 private:
  Store& store_;
  EventSink& sink_;
  Clock& clock_;
  RelayOptions options_;
  Metrics* metrics_;
};

}  // namespace idem::idemd
