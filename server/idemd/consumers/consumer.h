// server/idemd/consumers/consumer.h — a queue consumer (docs/consumers.md): each message a
// request of the consumer's route, through the idempotency filter and its target's proxy, and
// the broker told only what the record holds. A redelivered message finds its record and is
// acknowledged without running anything; a message whose key came with another payload, or that
// cannot become a request, or that had max_attempts attempts without a final answer, is
// quarantined; nothing is acknowledged before its record is finished.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "http/message.h"
#include "idem/engine.h"
#include "idem/mutex.h"
#include "server/idemd/consumers/consumer_route.h"
#include "server/idemd/consumers/source.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/metrics.h"

namespace idem::idemd {

// The principal of a consumer's records: tenant "mq" (a payments target's: its payments_tenant,
// whose payments they are), user the consumer's group. The route id ("mq." + name) and the key
// complete the scope: (consumer group, message key).
Principal ConsumerPrincipal(const ConsumerRoute& consumer);

// The request `delivery` becomes on `consumer`'s target: its method and path, the message's key
// (by the consumer's key rule) as the Idempotency-Key, its body field as the body (JSON for a
// target with body = "json"). Errors: kInvalidArgument saying what the message lacks (no key, a
// key the key policy would refuse is caught by the filter; no body field; a JSON body that is
// not JSON, for a key read from it).
Result<http::Request> MessageRequest(const ConsumerRoute& consumer, const Delivery& delivery);

// What to do with a message once the filter has answered it.
struct Judgement {
  enum class Verdict {
    kAck,         // its record is finished: tell the broker (outcome says how)
    kQuarantine,  // it can never execute: move it to the dead-letter stream (reason, detail)
    kWait,        // it is running elsewhere, or the store is down: keep it, ask again after `wait`
    kRetry,       // a retryable failure: leave it to the broker's redelivery (counted)
  };
  static Judgement Ack(std::string outcome) {
    return {Verdict::kAck, std::move(outcome), {}, {}, {}};
  }
  static Judgement Quarantine(std::string reason, std::string detail) {
    return {Verdict::kQuarantine, "quarantined", std::move(reason), std::move(detail), {}};
  }
  static Judgement Wait(Millis wait) { return {Verdict::kWait, {}, {}, {}, wait}; }
  static Judgement Retry() { return {Verdict::kRetry, "retried", {}, {}, {}}; }

  Verdict verdict = Verdict::kRetry;
  // The message's idem_consumer_messages_total outcome: kAck executed, duplicate or held;
  // kQuarantine quarantined; kRetry retried.
  std::string outcome;
  std::string reason;  // kQuarantine: payload-mismatch, invalid
  std::string detail;
  Millis wait{0};
};
// `answer` is the filter's answer; `found` the record read after it (nullopt: none; an error: the
// store could not be read).
Judgement Judge(const http::Response& answer, const Result<std::optional<FoundRecord>>& found);

// One consumer's threads. Borrows everything; `open(i)` opens the source of thread i.
class Consumer {
 public:
  using OpenSource = std::function<Result<std::unique_ptr<MessageSource>>(int thread)>;
  Consumer(const ConsumerRoute& route, IdempotencyFilter& filter, Engine& engine, Metrics& metrics,
           MonotonicClock& monotonic, OpenSource open);
  ~Consumer();  // Stop()

  // Starts route.concurrency threads, each taking one message at a time. Errors: the source's
  // (nothing started).
  Status Start();
  // Takes no more messages, lets those in hand reach an answer (one the broker is told of, or
  // left to its redelivery), and joins the threads. Idempotent.
  void Stop();

  // One delivery, start to end, on the calling thread (a thread's loop; tests).
  void Process(MessageSource& source, const Delivery& delivery);

  // The messages its threads have in hand now, and how long the oldest has been.
  Metrics::ConsumerLoad Load() const;

 private:
  // Thread `thread`'s loop.
  void Run(MessageSource& source, std::size_t thread);
  // Sleeps `duration`, or less when Stop is called; whether it is still running.
  bool Pause(Millis duration);
  // What to do with `delivery`, of `request` under `key`, delivered more than max_attempts times:
  // answered from its record, quarantined, or (nullopt) run as any delivery while its record
  // shows fewer than max_attempts executions started.
  std::optional<Judgement> TooOften(const http::Request& request, const std::string& key,
                                    const Delivery& delivery);
  // Tells the broker what `judgement` says of `delivery`, then counts and logs it.
  void Finish(MessageSource& source, const Delivery& delivery, const Judgement& judgement);

  const ConsumerRoute& route_;
  IdempotencyFilter& filter_;
  Engine& engine_;
  Metrics& metrics_;
  MonotonicClock& monotonic_;
  const OpenSource open_;
  const Principal principal_;
  Mutex mu_;
  CondVar stopped_;
  std::atomic<bool> stopping_{false};
  std::vector<std::unique_ptr<MessageSource>> sources_;
  // By thread: since when (monotonic nanoseconds) it has its message in hand; 0 when it has
  // none.
  std::unique_ptr<std::atomic<int64_t>[]> in_hand_since_;
  std::vector<std::thread> threads_;
};

}  // namespace idem::idemd
