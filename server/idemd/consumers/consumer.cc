// server/idemd/consumers/consumer.cc — a message's way through the filter, and what the broker
// is told of it.
#include "server/idemd/consumers/consumer.h"

#include <algorithm>
#include <array>
#include <boost/json.hpp>
#include <charconv>

#include "http/async.h"
#include "http/log.h"
#include "http/problem.h"
#include "idem/failpoint.h"
#include "idem/thread_name.h"

namespace idem::idemd {
namespace {

// How long a thread rests after its broker failed, at most (doubling from 100 ms).
constexpr Millis kLongestBrokerRest{5000};
constexpr std::string_view kMismatchDetail =
    "its key was used for a message with another payload, which the record holds: not executed";
// idemd's answers that nothing ran for this request: it runs elsewhere, or could not start.
constexpr std::array<http::ProblemKind, 4> kNotRunHere = {
    http::ProblemKind::kRequestInProgress, http::ProblemKind::kQuotaExceeded,
    http::ProblemKind::kUnavailable, http::ProblemKind::kOverloaded};
// The longest a thread waits before it asks about a running duplicate again.
constexpr Millis kLongestWait{5000};

bool IsProblem(const http::Response& answer, http::ProblemKind kind) {
  if (answer.status != http::Spec(kind).status) return false;
  const std::optional<std::string_view> type = answer.headers.Get("content-type");
  if (!type || type->find("problem+json") == std::string_view::npos) return false;
  boost::system::error_code ec;
  const boost::json::value body = boost::json::parse(answer.body, ec);
  const boost::json::object* object = ec ? nullptr : body.if_object();
  const boost::json::value* found = object != nullptr ? object->if_contains("type") : nullptr;
  return found != nullptr && found->is_string() && found->as_string() == http::Spec(kind).type;
}

// What an answer of problem+json says went wrong: its detail, then each field error's field and
// message ("the request body failed validation: currency: required: one of USD, EUR").
std::string ProblemDetail(const std::string& answer) {
  boost::system::error_code ec;
  const boost::json::value body = boost::json::parse(answer, ec);
  const boost::json::object* object = ec ? nullptr : body.if_object();
  const boost::json::value* detail = object != nullptr ? object->if_contains("detail") : nullptr;
  if (detail == nullptr || !detail->is_string()) {
    return "the message cannot become a request of the target";
  }
  std::string out(detail->as_string());
  const boost::json::value* errors = object->if_contains("errors");
  if (errors != nullptr && errors->is_array()) {
    const char* separator = ": ";
    for (const boost::json::value& error : errors->as_array()) {
      const boost::json::object* e = error.if_object();
      const boost::json::value* field = e != nullptr ? e->if_contains("field") : nullptr;
      const boost::json::value* message = e != nullptr ? e->if_contains("message") : nullptr;
      if (field == nullptr || !field->is_string() || message == nullptr || !message->is_string()) {
        continue;
      }
      out += separator + std::string(field->as_string()) + ": " + std::string(message->as_string());
      separator = "; ";
      if (out.size() > 1024) break;  // a dead letter's reason, not its payload
    }
  }
  return out;
}

int64_t Nanos(SteadyTime t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Millis RetryAfter(const http::Response& answer) {
  int64_t seconds = 1;
  if (const auto text = answer.headers.Get("retry-after")) {
    int64_t parsed = 0;
    const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), parsed);
    if (error == std::errc() && end == text->data() + text->size() && parsed >= 0) seconds = parsed;
  }
  return std::clamp(Millis(seconds * 1000), Millis(100), kLongestWait);
}

}  // namespace

Principal ConsumerPrincipal(const ConsumerRoute& consumer) {
  return Principal{.tenant = consumer.IsPayments() ? consumer.payments_tenant : "mq",
                   .user = consumer.group};
}

Result<http::Request> MessageRequest(const ConsumerRoute& consumer, const Delivery& delivery) {
  const std::optional<std::string_view> body = delivery.Field(consumer.body_field);
  if (!body) {
    return MakeError(Errc::kInvalidArgument,
                     "the message has no field '" + consumer.body_field + "' (body_field)");
  }
  std::string key;
  switch (consumer.key_source) {
    case KeySource::kField: {
      const std::optional<std::string_view> field = delivery.Field(consumer.key_name);
      if (!field || field->empty()) {
        return MakeError(Errc::kInvalidArgument,
                         "the message has no field '" + consumer.key_name + "' (its key)");
      }
      key = *field;
      break;
    }
    case KeySource::kJson: {
      boost::system::error_code ec;
      const boost::json::value json = boost::json::parse(*body, ec);
      const boost::json::value* member = ec ? nullptr : json.find_pointer(consumer.key_name, ec);
      if (member == nullptr || ec) {
        return MakeError(Errc::kInvalidArgument, "the message's body has no JSON member " +
                                                     consumer.key_name + " (its key)");
      }
      if (member->is_string()) {
        key = member->as_string();
      } else if (member->is_int64() || member->is_uint64()) {
        key = boost::json::serialize(*member);
      } else {
        return MakeError(Errc::kInvalidArgument, "the JSON member " + consumer.key_name +
                                                     " (its key) is neither a string nor an "
                                                     "integer");
      }
      break;
    }
    case KeySource::kBrokerId:
      key = delivery.id;
      break;
  }
  http::Request request;
  request.method = consumer.target.method;
  request.target = consumer.target.pattern;
  for (const std::string& name : consumer.header_fields) {
    if (const std::optional<std::string_view> value = delivery.Field(name)) {
      // A field value goes on a header line as it is: no line breaks or other controls in it.
      const bool clean =
          value->size() <= 1024 && std::none_of(value->begin(), value->end(), [](char ch) {
            const auto byte = static_cast<unsigned char>(ch);
            return (byte < 0x20 && byte != '\t') || byte == 0x7f;
          });
      if (!clean) {
        return MakeError(Errc::kInvalidArgument,
                         "the message's field '" + name +
                             "' (header_fields) is over 1024 bytes or holds control characters");
      }
      request.headers.Set(name, std::string(*value));
    }
  }
  request.headers.Set("Idempotency-Key", key);
  request.headers.Set("Content-Type",
                      consumer.target.json_body ? "application/json" : "application/octet-stream");
  request.body = std::string(*body);
  return request;
}

Judgement Judge(const http::Response& answer, const Result<std::optional<FoundRecord>>& found) {
  // First: a record finished by another payload answers this one 422, and must not acknowledge it.
  if (IsProblem(answer, http::ProblemKind::kIdempotencyKeyReused)) {
    return Judgement::Quarantine("payload-mismatch", std::string(kMismatchDetail));
  }
  if (found && found->has_value() && !(*found)->expired &&
      ((*found)->record.state == RecordState::kSucceeded ||
       (*found)->record.state == RecordState::kFailedFinal)) {
    const Record& record = (*found)->record;
    const bool held =
        record.state == RecordState::kFailedFinal && record.recovery_point == kOutcomeUnknownPoint;
    // Executed here only when this answer is the execution's own: a replay, or an answer of
    // idemd's that nothing ran here (a duplicate that found it running, which has finished
    // since), is a duplicate.
    const bool ran_here =
        answer.headers.Get("idempotent-replayed") != "true" &&
        std::none_of(kNotRunHere.begin(), kNotRunHere.end(),
                     [&](http::ProblemKind kind) { return IsProblem(answer, kind); });
    return Judgement::Ack(held ? "held" : ran_here ? "executed" : "duplicate");
  }
  for (http::ProblemKind kind :
       {http::ProblemKind::kInvalidRequest, http::ProblemKind::kMalformedJson,
        http::ProblemKind::kValidationFailed, http::ProblemKind::kUnsupportedMediaType,
        http::ProblemKind::kPayloadTooLarge}) {
    if (IsProblem(answer, kind)) {
      return Judgement::Quarantine("invalid", ProblemDetail(answer.body));
    }
  }
  for (http::ProblemKind kind : kNotRunHere) {
    if (IsProblem(answer, kind)) return Judgement::Wait(RetryAfter(answer));
  }
  if (!found) return Judgement::Wait(Millis(1000));  // the store is down
  return Judgement::Retry();
}

Consumer::Consumer(const ConsumerRoute& route, IdempotencyFilter& filter, Engine& engine,
                   Metrics& metrics, MonotonicClock& monotonic, OpenSource open)
    : route_(route),
      filter_(filter),
      engine_(engine),
      metrics_(metrics),
      monotonic_(monotonic),
      open_(std::move(open)),
      principal_(ConsumerPrincipal(route)) {
  metrics_.DeclareConsumer(route_.name);
}

Consumer::~Consumer() { Stop(); }

Status Consumer::Start() {
  for (int i = 0; i < route_.concurrency; ++i) {
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<MessageSource> source, open_(i));
    sources_.push_back(std::move(source));
  }
  in_hand_since_ = std::make_unique<std::atomic<int64_t>[]>(sources_.size());
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    in_hand_since_[i] = 0;
    threads_.emplace_back([this, s = sources_[i].get(), i] {
      NameThisThread("consumer");
      Run(*s, i);
    });
  }
  return Ok();
}

void Consumer::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  stopped_.NotifyAll();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

bool Consumer::Pause(Millis duration) {
  MutexLock lock(mu_);
  return !stopped_.WaitFor(mu_, duration, [this] { return stopping_.load(); });
}

Metrics::ConsumerLoad Consumer::Load() const {
  Metrics::ConsumerLoad load{.consumer = route_.name};
  const int64_t now = Nanos(monotonic_.Now());
  for (std::size_t i = 0; in_hand_since_ != nullptr && i < sources_.size(); ++i) {
    const int64_t since = in_hand_since_[i].load();
    if (since == 0) continue;
    ++load.in_flight;
    load.oldest_seconds = std::max(load.oldest_seconds, static_cast<double>(now - since) / 1e9);
  }
  return load;
}

void Consumer::Run(MessageSource& source, std::size_t thread) {
  Millis rest{100};
  bool failing = false;
  while (!stopping_) {
    auto delivery = source.Receive(Millis(1000));
    if (!delivery) {
      if (!failing) {
        http::Log(http::LogLevel::kWarn, "consumer paused: its broker fails",
                  {{"consumer", route_.name}, {"error", delivery.error().message}});
      }
      failing = true;
      if (!Pause(rest)) break;
      rest = std::min(rest * 2, kLongestBrokerRest);
      continue;
    }
    if (failing) http::Log(http::LogLevel::kInfo, "consumer resumed", {{"consumer", route_.name}});
    failing = false;
    rest = Millis(100);
    if (*delivery) {
      in_hand_since_[thread] = std::max<int64_t>(1, Nanos(monotonic_.Now()));
      Process(source, **delivery);
      in_hand_since_[thread] = 0;
    }
  }
}

void Consumer::Process(MessageSource& source, const Delivery& delivery) {
  if (delivery.taken_over) metrics_.CountConsumerTakeover(route_.name);
  auto request = MessageRequest(route_, delivery);
  if (!request) {
    Finish(source, delivery, Judgement::Quarantine("invalid", request.error().message));
    return;
  }
  const std::string key(request->headers.Get("idempotency-key").value_or(""));
  if (delivery.deliveries > route_.max_attempts) {
    if (std::optional<Judgement> judged = TooOften(*request, key, delivery)) {
      Finish(source, delivery, *judged);
      return;
    }
  }
  SteadyTime kept = monotonic_.Now();
  while (true) {
    http::RequestContext context;  // no server: a running duplicate is answered 409, never parked
    const http::Response answer = http::RunSync(filter_.Handle(*request, principal_, context));
    const auto found = engine_.Lookup(principal_, filter_.policy().route, key);
    const Judgement judgement = Judge(answer, found);
    if (judgement.verdict != Judgement::Verdict::kWait) {
      Finish(source, delivery, judgement);
      return;
    }
    // Running elsewhere, settling, or the store is down: this delivery stays this consumer's.
    if (!Pause(judgement.wait)) return;  // stopping: the broker delivers it again
    if (monotonic_.Now() - kept >= route_.redeliver_after / 3) {
      if (source.Keep(delivery)) kept = monotonic_.Now();
    }
  }
}

std::optional<Judgement> Consumer::TooOften(const http::Request& request, const std::string& key,
                                            const Delivery& delivery) {
  // Its record may hold its answer nonetheless (an acknowledgement that was lost, a consumer
  // killed after the commit each time): then it is a duplicate like any other; a record of
  // another payload quarantines it as such.
  const auto recorded = filter_.Recorded(request, principal_);
  if (recorded && recorded->has_value() && (*recorded)->kind == Decision::Kind::kReplay) {
    return Judgement::Ack("duplicate");
  }
  if (!recorded && recorded.error().code == Errc::kFingerprintMismatch) {
    return Judgement::Quarantine("payload-mismatch", std::string(kMismatchDetail));
  }
  if (!recorded && recorded.error().code == Errc::kUnavailable) {
    return Judgement::Retry();  // the store is down: asked again later
  }
  // The attempts are the executions started (each claim and takeover moves the record's fence
  // on), not the deliveries: a delivery that waited on a running or settling execution of this
  // message, and was given back when its consumer died, started none. A message that never
  // reached its claim (it kills the consumer before, or the store refused every time) is
  // counted by its deliveries.
  const auto found = engine_.Lookup(principal_, filter_.policy().route, key);
  if (!found) return Judgement::Retry();
  if (found->has_value() && !(*found)->expired &&
      (*found)->record.lease.fence < route_.max_attempts) {
    return std::nullopt;  // run as any delivery
  }
  const int64_t started = found->has_value() ? (*found)->record.lease.fence : 0;
  return Judgement::Quarantine(
      "attempts", "delivered " + std::to_string(delivery.deliveries) + " times, " +
                      std::to_string(started) + " executions started, without a final answer " +
                      "(max_attempts " + std::to_string(route_.max_attempts) + ")");
}

void Consumer::Finish(MessageSource& source, const Delivery& delivery, const Judgement& judgement) {
  using Verdict = Judgement::Verdict;
  // The message's key is not logged (nor is any key): its broker id names it.
  boost::json::object fields{
      {"consumer", route_.name}, {"id", delivery.id}, {"deliveries", delivery.deliveries}};
  if (judgement.verdict == Verdict::kRetry) {
    metrics_.CountConsumerMessage(route_.name, "retried");
    http::Log(http::LogLevel::kInfo, "consumer message left for redelivery", fields);
    // A broker that never takes a delivery over gets it back after the back-off (or at once when
    // stopping), so that a retryable failure is not tried again at once.
    if (!source.TakesOverIdle()) {
      (void)Pause(route_.redeliver_after);
      (void)source.Release(delivery);
    }
    return;
  }
  Status told = Ok();
  if (judgement.verdict == Verdict::kAck) {
    told = IDEM_FAILPOINT("consumer_before_ack");
    if (told) told = source.Ack(delivery);
  } else {
    told = source.Quarantine(delivery, judgement.reason, judgement.detail);
  }
  if (!told) {
    // Delivered again later, and answered from the record (or quarantined again) then.
    fields["error"] = told.error().message;
    http::Log(http::LogLevel::kWarn, "consumer could not tell its broker", fields);
    return;
  }
  const std::string& outcome = judgement.outcome;
  metrics_.CountConsumerMessage(route_.name, outcome);
  metrics_.ObserveConsumerDeliveries(route_.name, delivery.deliveries);
  if (judgement.verdict == Verdict::kQuarantine) {
    fields["reason"] = judgement.reason;
    fields["detail"] = judgement.detail;
    fields["dead_letter"] = route_.dead_letter;
    http::Log(http::LogLevel::kWarn, "consumer message quarantined", fields);
  } else if (outcome == "held") {
    http::Log(http::LogLevel::kError, "consumer message held: its outcome is unknown", fields);
  } else if (outcome == "duplicate") {
    http::Log(http::LogLevel::kInfo, "consumer duplicate acknowledged", fields);
  }
}

}  // namespace idem::idemd
