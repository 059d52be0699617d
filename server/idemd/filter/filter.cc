// server/idemd/filter/filter.cc — Decision → HTTP, Prefer handling, completion, the takeover loop
// pass.
#include "server/idemd/filter/filter.h"

#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <thread>
#include <unordered_map>

#include "http/log.h"
#include "http/problem.h"
#include "idem/failpoint.h"
#include "idem/mutex.h"

namespace idem::idemd {
namespace {

namespace json = boost::json;

struct Preferences {
  std::optional<Millis> wait;
  bool respond_async = false;
};

// What is kept of `response`: its status, body and the headers `names` lists, every value of
// each in the order they came (a Link or Set-Cookie-like header may repeat).
StoredResponse Stored(const http::Response& response, const std::vector<std::string>& names) {
  StoredResponse stored;
  stored.status = response.status;
  for (const std::string& name : names) {
    const std::string lower = http::ToLower(name);
    for (const auto& [field, value] : response.headers.fields) {
      if (field == lower) stored.headers.emplace_back(name, value);  // fields are lower case
    }
  }
  stored.body = response.body;
  return stored;
}

// The final answer kept instead of `original`, an execution's answer over the route's
// stored-answer cap: 502 answer-too-large, with the original's Location (a payment's), so a
// client can still find what was made.
http::Response TooLargeToKeep(const http::Response& original, const Ticket& ticket) {
  const std::optional<std::string_view> location = original.headers.Get("Location");
  http::Response r =
      http::Problem(http::ProblemKind::kAnswerTooLarge,
                    "the request was executed (status " + std::to_string(original.status) +
                        "), but its answer of " + std::to_string(original.body.size()) +
                        " bytes is larger than the " + std::to_string(ticket.max_response_bytes) +
                        " bytes this route keeps; it is not executed again for this key" +
                        (location ? "; what it made is at its Location" : ""),
                    {.key_expires = ticket.record.expires_at});
  if (location) r.headers.Set("Location", *location);
  return r;
}

// RFC 7240: comma-separated preferences, each token[=value] with ;parameters, across headers.
Preferences ParsePrefer(const http::Headers& headers) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  Preferences p;
  for (std::string_view item : headers.List("prefer")) {
    item = trim(item.substr(0, item.find(';')));
    const std::size_t eq = item.find('=');
    const std::string token = http::ToLower(trim(item.substr(0, eq)));
    std::string_view arg =
        eq == std::string_view::npos ? std::string_view() : trim(item.substr(eq + 1));
    if (arg.size() >= 2 && arg.front() == '"' && arg.back() == '"')
      arg = arg.substr(1, arg.size() - 2);
    if (token == "respond-async") {
      p.respond_async = true;
    } else if (token == "wait" && !arg.empty() && arg.size() <= 6 &&
               std::all_of(arg.begin(), arg.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      p.wait = Millis(std::stoll(std::string(arg)) * 1000);
    }
  }
  return p;
}

std::string ScopeKey(const ScopeHash& scope) { return ToHex(scope); }

int RetryAfterSeconds(Millis ms) {
  return static_cast<int>(std::max<int64_t>(1, (ms.count() + 999) / 1000));
}

// A principal as a map key: the length of the tenant keeps ("ab", "c") apart from ("a", "bc").
std::string PrincipalKey(const Principal& who) {
  return std::to_string(who.tenant.size()) + ":" + who.tenant + who.user;
}

}  // namespace

// Thread-safe.
class IdempotencyFilter::Waiters {
 public:
  // Counts one more waiter of `who` unless it has `max` already.
  bool TryAdd(const std::string& who, int64_t max) {
    MutexLock lock(mu_);
    auto [it, inserted] = parked_.try_emplace(who, 0);
    if (it->second >= max) {
      if (inserted) parked_.erase(it);
      return false;
    }
    ++it->second;
    return true;
  }
  void Remove(const std::string& who) {
    MutexLock lock(mu_);
    auto it = parked_.find(who);
    if (it != parked_.end() && --it->second <= 0) parked_.erase(it);
  }

 private:
  Mutex mu_;
  std::unordered_map<std::string, int64_t> parked_ IDEM_GUARDED_BY(mu_);
};

// Claims per principal: a token bucket of `rate` tokens a second holding at most `rate`. The
// table is bounded: past kMaxBuckets principals, buckets that have refilled (idle principals) are
// dropped, and if every one is busy the table starts afresh (a fresh burst each: the store's
// quotas still hold).
class IdempotencyFilter::ClaimRate {
 public:
  explicit ClaimRate(int64_t rate) : rate_(static_cast<double>(rate)) {}

  // Takes a token of `who` at `now`; false when none is left.
  bool Take(const std::string& who, SteadyTime now) {
    if (rate_ <= 0) return true;
    MutexLock lock(mu_);
    if (buckets_.size() >= kMaxBuckets && !buckets_.contains(who)) Prune(now);
    auto [it, inserted] = buckets_.try_emplace(who, Bucket{rate_, now});
    Bucket& b = it->second;
    b.tokens = Refilled(b, now);
    b.at = now;
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }

 private:
  static constexpr std::size_t kMaxBuckets = 65536;
  struct Bucket {
    double tokens;
    SteadyTime at;
  };
  double Refilled(const Bucket& b, SteadyTime now) const {
    const double seconds = std::chrono::duration<double>(now - b.at).count();
    return std::min(rate_, b.tokens + std::max(0.0, seconds) * rate_);
  }
  void Prune(SteadyTime now) IDEM_REQUIRES(mu_) {
    std::erase_if(buckets_,
                  [&](const auto& entry) { return Refilled(entry.second, now) >= rate_; });
    if (buckets_.size() >= kMaxBuckets) buckets_.clear();
  }

  const double rate_;
  Mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_ IDEM_GUARDED_BY(mu_);
};

// One waiter's place among its principal's: given back when the request's context lets it go.
class IdempotencyFilter::WaiterPlace {
 public:
  WaiterPlace(std::shared_ptr<Waiters> waiters, std::string who)
      : waiters_(std::move(waiters)), who_(std::move(who)) {}
  ~WaiterPlace() { waiters_->Remove(who_); }
  WaiterPlace(const WaiterPlace&) = delete;
  WaiterPlace& operator=(const WaiterPlace&) = delete;

 private:
  std::shared_ptr<Waiters> waiters_;
  std::string who_;
};

Execution Execution::Answer(http::Response response) {
  Execution e;
  e.response = std::move(response);
  return e;
}

Execution Execution::Answer(http::Response response, TxnHook business) {
  Execution e = Answer(std::move(response));
  e.business = std::move(business);
  return e;
}

Execution Execution::Retryable(http::Response response, std::string_view point, TxnHook business) {
  Execution e = Answer(std::move(response), std::move(business));
  e.state = RecordState::kFailedRetryable;
  e.recovery_point = std::string(point);
  return e;
}

Execution Execution::Unknown(http::Response response) {
  Execution e = Answer(std::move(response));
  e.outcome_unknown = true;
  return e;
}

Execution Execution::Unknown(const Error& error) { return Unknown(http::ProblemFor(error)); }

Execution Execution::Settling(Millis left) {
  Execution e;
  e.settling_for = left;
  e.outcome_unknown = true;
  return e;
}

Execution Execution::Held(http::Response response) {
  Execution e = Answer(std::move(response));
  e.held = true;
  return e;
}

std::optional<http::Response> RefuseUnlessJson(const http::Request& request) {
  if (MediaTypeOf(request.headers.Get("content-type").value_or(std::string_view())) !=
      "application/json") {
    return http::Problem(http::ProblemKind::kUnsupportedMediaType,
                         "send the body as application/json");
  }
  for (std::string_view coding : request.headers.List("content-encoding")) {
    if (http::ToLower(coding) == "identity") continue;
    http::Response refusal = http::Problem(http::ProblemKind::kUnsupportedMediaType,
                                           "send the body without a content coding");
    refusal.headers.Set("Accept-Encoding", "identity");
    return refusal;
  }
  return std::nullopt;
}

RecordState FailurePolicy::Classify(int status) const {
  const bool success = status >= 200 && status < 300;
  if (only_listed_final) {
    if (success && success_final) return RecordState::kSucceeded;
    const bool listed =
        std::find(final_statuses.begin(), final_statuses.end(), status) != final_statuses.end();
    if (!listed) return RecordState::kFailedRetryable;
    return success ? RecordState::kSucceeded : RecordState::kFailedFinal;
  }
  if (success) return RecordState::kSucceeded;
  if (std::find(final_statuses.begin(), final_statuses.end(), status) != final_statuses.end()) {
    return RecordState::kFailedFinal;
  }
  if (std::find(retryable_statuses.begin(), retryable_statuses.end(), status) !=
      retryable_statuses.end()) {
    return RecordState::kFailedRetryable;
  }
  return status >= 500 ? RecordState::kFailedRetryable : RecordState::kFailedFinal;
}

IdempotencyFilter::IdempotencyFilter(Engine& engine, http::BlockingPool& pool,
                                     MonotonicClock& monotonic, Metrics& metrics,
                                     FilterPolicy policy, Operation& operation,
                                     http::BlockingPool* reads)
    : engine_(engine),
      pool_(pool),
      reads_(reads != nullptr ? *reads : pool),
      monotonic_(monotonic),
      metrics_(metrics),
      policy_(std::move(policy)),
      operation_(operation),
      waiters_(std::make_shared<Waiters>()),
      claim_rate_(std::make_unique<ClaimRate>(policy_.max_new_keys_per_second)) {
  metrics_.DeclareRoute(policy_.route_label);
}

IdempotencyFilter::~IdempotencyFilter() = default;

http::Response IdempotencyFilter::Accepted(std::string_view key, const std::string& location,
                                           Timestamp expires) const {
  http::Response response{
      202, {}, "{\"key\":" + json::serialize(json::string(key)) + ",\"state\":\"PROCESSING\"}"};
  response.headers.Set("Content-Type", "application/json");
  response.headers.Set("Location", location);
  AddExpires(response, expires);
  return response;
}

void IdempotencyFilter::AddExpires(http::Response& response, Timestamp expires) const {
  response.headers.Set("Idempotency-Key-Expires", http::HttpDate(ToUnixMillis(expires)));
}

http::Async<http::Response> IdempotencyFilter::Handle(const http::Request& request,
                                                      const Principal& principal,
                                                      http::RequestContext& context) {
  std::optional<Admitted> admitted;
  http::Response response = co_await Admit(request, principal, context, admitted);
  if (admitted) response = co_await Execute(*admitted, request, principal, context);
  if (!context.park) context.hold.reset();  // answered: no longer waiting
  co_return response;
}

void IdempotencyFilter::Count(http::RequestContext& context, RequestOutcome outcome) {
  context.outcome = RequestOutcomeName(outcome);
  metrics_.CountRequest(policy_.route_label, outcome);
}

bool IdempotencyFilter::TryPark(const Principal& principal, http::RequestContext& context) {
  if (context.hold) return true;  // parked before: its place and its room are its own
  std::string who = PrincipalKey(principal);
  if (!waiters_->TryAdd(who, policy_.max_waiters_per_principal)) return false;
  auto place = std::make_shared<WaiterPlace>(waiters_, std::move(who));
  if (context.reserve_park && !context.reserve_park()) return false;  // `place` given back
  context.hold = std::move(place);
  return true;
}

http::Response IdempotencyFilter::InProgress(const Running& running, bool respond_async,
                                             std::optional<Millis> wait, const Principal& principal,
                                             http::RequestContext& context) {
  const SteadyTime now = monotonic_.Now();
  if (wait && !context.wait_until) {
    context.wait_until = now + std::min(*wait, policy_.wait_max);
  }
  if (context.wait_until && now < *context.wait_until && TryPark(principal, context)) {
    context.park = http::RequestContext::Park{ScopeKey(running.scope), *context.wait_until};
    return {};
  }
  context.outcome = RequestOutcomeName(RequestOutcome::kInProgress);
  metrics_.CountRequest(policy_.route_label, RequestOutcome::kInProgress);
  const std::string location = policy_.operations_prefix + running.key + policy_.operations_suffix;
  if (respond_async) return Accepted(running.key, location, running.key_expires);
  http::Response response =
      http::Problem(http::ProblemKind::kRequestInProgress,
                    "a request with this Idempotency-Key is still being processed",
                    {.retry_after_seconds = RetryAfterSeconds(running.retry_after),
                     .key_expires = running.key_expires});
  response.headers.Set("Location", location);
  return response;
}

Request IdempotencyFilter::EngineRequest(const http::Request& request,
                                         const Principal& principal) const {
  Request out;
  out.principal = principal;
  out.key_header = request.headers.Get("idempotency-key");
  out.method = request.method;
  // As sent: the engine fingerprints only its media type (MediaTypeOf).
  out.content_type = request.headers.Get("content-type").value_or(std::string_view());
  out.api_version = policy_.api_version;
  out.body = request.body;
  if (policy_.fingerprint_target) out.target = request.target;
  return out;
}

Result<std::optional<Decision>> IdempotencyFilter::Recorded(const http::Request& request,
                                                            const Principal& principal) {
  return engine_.ReplayFromStore(policy_.route, EngineRequest(request, principal));
}

http::Async<http::Response> IdempotencyFilter::Admit(const http::Request& request,
                                                     const Principal& principal,
                                                     http::RequestContext& context,
                                                     std::optional<Admitted>& admitted) {
  context.route = policy_.route_label;
  using O = RequestOutcome;
  auto count = [&](RequestOutcome outcome) { Count(context, outcome); };
  // The body canonicalised under the route's rules once, for the operation's check and for each
  // of the engine's steps (a replay from memory, the snapshot read, the claim). A body that does
  // not canonicalise is left to the check and to the engine, which say why.
  Request engine_request = EngineRequest(request, principal);
  const Result<CanonicalRequest> canonical = Engine::Canonical(policy_.route, engine_request);
  if (canonical) engine_request.canonical = &*canonical;
  if (auto refusal = operation_.Validate(request, principal, canonical.has_value())) {
    count(O::kInvalid);
    co_return std::move(*refusal);
  }
  if (request.headers.Count("idempotency-key") > 1) {
    count(O::kInvalid);
    co_return http::Problem(http::ProblemKind::kInvalidRequest,
                            "send exactly one Idempotency-Key header");
  }
  const Preferences prefer = ParsePrefer(request.headers);

  Timestamp mismatch_expires{};  // set by the engine with kFingerprintMismatch
  // A finished record held in memory is answered here, on this thread: no store call, no hop.
  Result<std::optional<Decision>> held =
      engine_.ReplayFromMemory(policy_.route, engine_request, &mismatch_expires);
  SteadyTime claim_began{};  // Ticket::claim_began
  Result<Decision> decision = MakeError(Errc::kInternal, "undecided");
  const bool from_memory = held && *held;
  if (held && !*held) {
    // Not in memory: a snapshot read, on the reads' threads, answers a finished record and a
    // duplicate of a running one (a parked request's every poll); only what it cannot answer
    // goes to the claim, which queues with the other writes, and only that counts against the
    // principal's rate of new keys.
    held = co_await reads_.Call(
        [&] { return engine_.ReplayFromStore(policy_.route, engine_request, &mismatch_expires); });
    if (held && !*held && !claim_rate_->Take(PrincipalKey(principal), monotonic_.Now())) {
      count(O::kQuota);
      co_return http::Problem(http::ProblemKind::kQuotaExceeded,
                              "too many new requests for this principal (limit " +
                                  std::to_string(policy_.max_new_keys_per_second) +
                                  " a second); retry shortly");
    }
    if (held && !*held) {
      decision = co_await pool_.Call([&] {
        return engine_.Start(
            policy_.route, engine_request,
            [&](StoreTxn& txn, const Record& record) {
              claim_began = monotonic_.Now();  // inside the claim's transaction, before the hook
              return operation_.OnClaim(txn, record, request, principal);
            },
            &mismatch_expires, /*read_first=*/false);
      });
    }
  }
  if (held && *held) {
    decision = std::move(**held);
  } else if (!held) {
    decision = held.error();
  }
  if (!decision) {
    const Errc code = decision.error().code;
    count(code == Errc::kFingerprintMismatch                          ? O::kMismatch
          : code == Errc::kResourceExhausted                          ? O::kQuota
          : code == Errc::kInvalidArgument || code == Errc::kTooLarge ? O::kInvalid
                                                                      : O::kError);
    if (code == Errc::kDataLoss || code == Errc::kInternal) {
      http::Log(http::LogLevel::kError, "engine", {{"code", ErrcName(code)}});
    }
    // A mismatch is about the record that holds the key: the 422 tells until when it does.
    if (code == Errc::kFingerprintMismatch) {
      co_return http::ProblemFor(decision.error(), mismatch_expires);
    }
    co_return http::ProblemFor(decision.error());
  }

  const std::string location =
      policy_.operations_prefix + decision->key + policy_.operations_suffix;
  switch (decision->kind) {
    case Decision::Kind::kReplay: {
      count(O::kReplayed);
      metrics_.CountReplay(from_memory);
      http::Response response;
      response.status = decision->response.status;
      for (auto& [name, value] : decision->response.headers) response.headers.Add(name, value);
      response.body = std::move(decision->response.body);
      response.headers.Set("Idempotent-Replayed", "true");
      AddExpires(response, decision->key_expires);
      co_return response;
    }
    case Decision::Kind::kInProgress:
      co_return InProgress(Running{decision->key, decision->record.scope, decision->retry_after,
                                   decision->key_expires},
                           prefer.respond_async, prefer.wait, principal, context);
    case Decision::Kind::kExecute:
      break;
  }

  decision->ticket.claim_began = claim_began;
  if (decision->ticket.resumed) metrics_.CountTakeover();
  if (prefer.respond_async) {
    count(O::kAccepted);
    // The work runs on apart from this request, with copies of what it needs.
    context.spawn([this, ticket = decision->ticket, request, principal, notify = context.notify,
                   location]() -> http::Async<void> {
      return RunApart(ticket, request, principal, location, notify);
    });
    co_return Accepted(decision->key, location, decision->key_expires);
  }
  admitted.emplace(Admitted{
      .ticket = std::move(decision->ticket),
      .running = {std::move(decision->key), decision->record.scope, {}, decision->key_expires},
      .location = location,
      .wait = prefer.wait});
  co_return http::Response{};
}

http::Async<http::Response> IdempotencyFilter::Execute(Admitted& admitted,
                                                       const http::Request& request,
                                                       const Principal& principal,
                                                       http::RequestContext& context) {
  std::optional<Millis> settling;
  http::Response response = co_await Run(admitted.ticket, request, principal, admitted.location,
                                         context.notify, &settling);
  if (settling) {
    // Nothing was sent: an earlier send is still settling, and the record is held until it
    // has. A request that may wait parks like any duplicate of a running operation.
    if (admitted.wait) {
      admitted.running.retry_after = *settling;
      co_return InProgress(admitted.running, /*respond_async=*/false, admitted.wait, principal,
                           context);
    }
    Count(context, RequestOutcome::kInProgress);
    co_return response;
  }
  Count(context, RequestOutcome::kExecuted);
  AddExpires(response, admitted.running.key_expires);
  co_return response;
}

http::Async<void> IdempotencyFilter::RunApart(Ticket ticket, http::Request request,
                                              Principal principal, std::string location,
                                              std::function<void(const std::string&)> notify) {
  (void)co_await Run(ticket, request, principal, location, notify);
}

http::Async<http::Response> IdempotencyFilter::Run(
    Ticket& ticket, const http::Request& request, const Principal& principal,
    const std::string& location, const std::function<void(const std::string&)>& notify,
    std::optional<Millis>* settling) {
  Execution execution;
  {
    // Renews the lease on a timer while the operation works, each renewal on the pool; stopped
    // (and any renewal in progress ended) before the lease is finished or released, so it never
    // extends a lease given up.
    Heartbeat heartbeat(engine_, ticket, monotonic_, {.own_thread = false});
    co_await http::WhileRunning(
        [](Operation& op, Ticket& t, const http::Request& r, const Principal& p, Engine& e,
           Heartbeat& h, Execution& out) -> http::Async<void> {
          out = co_await op.Execute(t, r, p, e, h);
        }(operation_, ticket, request, principal, engine_, heartbeat, execution),
        heartbeat.Interval(), pool_, [&heartbeat] { heartbeat.Beat(); });
  }
  http::Response response =
      co_await pool_.Call([&] { return Finish(ticket, std::move(execution), location, settling); });
  if (notify) notify(ScopeKey(ticket.scope));
  co_return response;
}

http::Response IdempotencyFilter::Finish(Ticket& ticket, Execution execution,
                                         const std::string& location,
                                         std::optional<Millis>* settling, bool* store_failed) {
  auto failed = [store_failed](const Status& status) {
    if (!status && status.error().code != Errc::kFenced && store_failed != nullptr) {
      *store_failed = true;
    }
  };
  if (execution.settling_for) {
    // Held for a moment, not released: the attempts that arrive within it are answered in
    // progress (and parked ones stay parked) without asking the provider again, so however many
    // retry, the provider is asked about this send at most once per retry_after.
    failed(engine_.Release(ticket, std::min(*execution.settling_for, policy_.route.retry_after)));
    if (settling != nullptr) *settling = execution.settling_for;
    http::Response response = http::Problem(
        http::ProblemKind::kRequestInProgress,
        "an earlier attempt with this Idempotency-Key may still be executing downstream; "
        "retry later to learn its outcome",
        {.retry_after_seconds = RetryAfterSeconds(*execution.settling_for),
         .key_expires = ticket.record.expires_at});
    if (!location.empty()) response.headers.Set("Location", location);
    return response;
  }
  if (execution.outcome_unknown) {
    // Nobody knows whether the downstream acted: keep the record PROCESSING, free the lease.
    failed(engine_.Release(ticket));
    return std::move(execution.response);
  }
  const RecordState state =
      execution.held
          ? RecordState::kFailedFinal
          : execution.state.value_or(policy_.failures.Classify(execution.response.status));
  const std::string resume_at = execution.held ? std::string(kOutcomeUnknownPoint)
                                : state == RecordState::kFailedRetryable ? execution.recovery_point
                                                                         : std::string();
  Status finished =
      engine_.Finish(ticket, state, Stored(execution.response, policy_.stored_headers),
                     execution.business, resume_at);
  if (!finished && finished.error().code == Errc::kTooLarge && !IDEM_REVERTED("too_large")) {
    // The operation was executed and its answer cannot be kept. Left unfinished, the record
    // would be taken over once its lease ends and executed again (a gateway route forwards
    // again, on every retry). It is finished instead, in the state its answer had, with a small
    // final answer that says so, which every copy of the request gets from now on, this one
    // too: the same answer for every copy.
    http::Log(http::LogLevel::kError, "answer too large to keep",
              {{"route", policy_.route_label},
               {"status", execution.response.status},
               {"body_bytes", execution.response.body.size()},
               {"max_bytes", ticket.max_response_bytes}});
    execution.response = TooLargeToKeep(execution.response, ticket);
    finished =
        engine_.Finish(ticket, state, Stored(execution.response, {"Content-Type", "Location"}),
                       execution.business, resume_at);
  }
  failed(finished);
  if (!finished) {
    if (finished.error().code == Errc::kFenced) {
      // Another executor took over and owns the outcome: answer with its result when it has one.
      metrics_.CountFenced();
      if (auto replay = StoredAnswer(ticket.scope)) return std::move(*replay);
      http::Response r =
          http::Problem(http::ProblemKind::kRequestInProgress,
                        "this execution lost its lease to another; retry to get its result",
                        {.key_expires = ticket.record.expires_at});
      if (!location.empty()) r.headers.Set("Location", location);
      return r;
    }
    return http::ProblemFor(finished.error());
  }
  return std::move(execution.response);
}

std::optional<http::Response> IdempotencyFilter::StoredAnswer(const ScopeHash& scope) {
  auto found = engine_.Lookup(scope);
  if (!found || !*found || !(*found)->response) return std::nullopt;
  StoredResponse& stored = *(*found)->response;
  http::Response response;
  response.status = stored.status;
  for (auto& [name, value] : stored.headers) response.headers.Add(name, value);
  response.body = std::move(stored.body);
  response.headers.Set("Idempotent-Replayed", "true");
  AddExpires(response, (*found)->record.expires_at);
  return response;
}

http::Response IdempotencyFilter::GetOperation(std::string_view key, const Principal& principal) {
  auto found = engine_.Lookup(principal, policy_.route, key);
  if (!found) return http::ProblemFor(found.error());
  if (!*found || (*found)->expired) {
    return http::Problem(http::ProblemKind::kNotFound, "no operation with this key");
  }
  const Record& r = (*found)->record;
  json::object body;
  body["key"] = (*found)->key;
  body["state"] = RecordStateName(r.state);
  body["recovery_point"] = r.recovery_point;
  body["status_code"] = IsReplayable(r.state) || r.state == RecordState::kFailedRetryable
                            ? json::value(r.status_code)
                            : json::value(nullptr);
  if (const std::optional<StoredResponse>& stored = (*found)->response) {
    boost::system::error_code ec;
    json::value parsed_body = json::parse(stored->body, ec);
    body["response"] = ec ? json::value(stored->body) : std::move(parsed_body);
  }
  body["created_at"] = http::Rfc3339(ToUnixMillis(r.created_at));
  body["expires_at"] = http::Rfc3339(ToUnixMillis(r.expires_at));
  http::Response response{200, {}, json::serialize(body)};
  response.headers.Set("Content-Type", "application/json");
  AddExpires(response, r.expires_at);
  return response;
}

void RunConcurrently(std::size_t n, std::size_t width,
                     const std::function<void(std::size_t)>& body) {
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < n; i = next++) body(i);
  };
  {
    std::vector<std::jthread> helpers;
    for (std::size_t t = 1; t < std::min(n, width); ++t) helpers.emplace_back(work);
    work();
  }  // joined
}

int IdempotencyFilter::TakeOverOnce(int limit,
                                    const std::function<void(const std::string&)>& notify) {
  std::atomic<bool> failed = false;
  std::atomic<int> resolved = 0;
  auto stale = engine_.ListStale(policy_.route, limit);
  if (!stale) failed = true;
  const std::vector<Record> records = stale ? std::move(*stale) : std::vector<Record>();
  // One record's downstream may stall until its timeout: the others are not held up behind it.
  RunConcurrently(records.size(), policy_.takeover_concurrency, [&](std::size_t i) {
    const Record& record = records[i];
    auto ticket = engine_.TakeOver(policy_.route, record);
    if (!ticket) {
      // Another instance or a retry got there first (kConflict), or a sweeper (kNotFound).
      const Errc code = ticket.error().code;
      if (code != Errc::kConflict && code != Errc::kNotFound) failed = true;
      return;
    }
    metrics_.CountTakeover();
    Execution execution = operation_.TakeOver(*ticket, engine_);
    const bool unknown = execution.outcome_unknown;
    bool store_failed = false;
    (void)Finish(*ticket, std::move(execution), /*location=*/{},
                 /*settling=*/nullptr, &store_failed);  // nobody waits for this answer
    if (store_failed) failed = true;
    metrics_.CountTakeoverResult(unknown ? "unknown" : "resolved");
    if (!unknown) ++resolved;
    if (notify) notify(ScopeKey(record.scope));
  });
  metrics_.CountTakeoverPass(failed);
  return resolved;
}

}  // namespace idem::idemd
