// server/idemd/filter/filter.h — the idempotency filter: HTTP in front of the engine, generic over
// the operation it protects. The payments route uses it; another route plugs in its own Operation
// and policy and reuses it unchanged.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "http/message.h"
#include "http/server.h"
#include "idem/engine.h"
#include "idem/heartbeat.h"
#include "server/idemd/metrics.h"

namespace idem::idemd {

// What one execution produced. The factories below name the common outcomes; a field set by
// hand serves the rest.
struct Execution {
  // `response`, classified by the route's FailurePolicy.
  static Execution Answer(http::Response response);
  // `response`, with its writes in the completion's transaction.
  static Execution Answer(http::Response response, TxnHook business);
  // `response` as a FAILED_RETRYABLE record resuming at `point` ("" keeps the record's), with
  // `business` in the completion's transaction when given.
  static Execution Retryable(http::Response response, std::string_view point = {},
                             TxnHook business = {});
  // The downstream may have acted and nobody knows yet (outcome_unknown), answered `response`.
  static Execution Unknown(http::Response response);
  // The same, answered as `error` is (http::ProblemFor): a lost lease, a store that failed.
  static Execution Unknown(const Error& error);
  // An earlier send has not settled for `left` more (settling_for).
  static Execution Settling(Millis left);
  // A held outcome (held): `response` kept FAILED_FINAL for an operator to settle.
  static Execution Held(http::Response response);

  http::Response response;
  // Business writes committed together with the record's completion.
  TxnHook business;
  // Overrides the policy's classification of response.status.
  std::optional<RecordState> state;
  // The downstream may have acted, and nobody will find out or try again: `response` is kept
  // FAILED_FINAL as a held outcome (kOutcomeUnknownPoint), which an operator settles.
  bool held = false;
  // For a retryable failure: the recovery point the next attempt resumes from (Engine::Finish);
  // empty keeps the record's. Ignored when the outcome is final.
  std::string recovery_point;
  // The downstream may have acted and nobody knows: the record stays PROCESSING at its recovery
  // point, the lease is released, and the next attempt or the takeover loop resolves it.
  bool outcome_unknown = false;
  // An earlier send's outcome is not settled yet, and nothing may be sent until it is: as with
  // outcome_unknown the record stays PROCESSING and the lease is released, but the answer is the
  // in-progress one (409 request-in-progress with this Retry-After, Location and
  // Idempotency-Key-Expires), not `response`.
  std::optional<Millis> settling_for;
};

// The work behind an idempotent route. Implementations are thread-safe.
class Operation {
 public:
  virtual ~Operation() = default;
  // Checks the request before any record exists; a response here ends the request and leaves
  // nothing behind (400, 415, ...). `canonical`: the body has canonicalised under the route's
  // rules (Engine::Canonical, made by the filter before this check), so it is JSON the
  // fingerprint accepts where the route's rules hold its limits.
  virtual std::optional<http::Response> Validate(const http::Request& request,
                                                 const Principal& principal, bool canonical) = 0;
  // Runs in the claim transaction when this request wins the right to execute (also on resumes;
  // record.resource_id is set once).
  virtual Status OnClaim(StoreTxn& txn, const Record& record, const http::Request& request,
                         const Principal& principal) = 0;
  // Executes, as a coroutine on an I/O thread: store calls (and anything else that blocks) go
  // through a BlockingPool; external calls are awaited without holding a thread. `ticket` may be
  // advanced through `engine`. `heartbeat` keeps the ticket's lease meanwhile (renewed on a timer
  // while this runs): check it before each external step and stop when it fails.
  virtual http::Async<Execution> Execute(Ticket& ticket, const http::Request& request,
                                         const Principal& principal, Engine& engine,
                                         Heartbeat& heartbeat) = 0;
  // Resolves a stale record without its request (the takeover loop, on its own thread; blocking):
  // returns the execution to finish with, or one with outcome_unknown to try again later.
  virtual Execution TakeOver(Ticket& ticket, Engine& engine) = 0;
};

// 415 unless the body is application/json (the media type as the fingerprint sees it:
// parameters and case do not count) without a content coding (idemd decodes none, and a coded
// body read as it is would be taken for the JSON it is not).
std::optional<http::Response> RefuseUnlessJson(const http::Request& request);

// Which finished outcomes are final (replayed) and which retryable, by status code. 2xx is
// SUCCEEDED; listed codes follow the lists; any other 4xx is final and any other 5xx retryable.
struct FailurePolicy {
  std::vector<int> final_statuses;
  std::vector<int> retryable_statuses;
  // Gateway routes: only 2xx when success_final, and the final_statuses, are final; every other
  // status is retryable.
  bool only_listed_final = false;
  bool success_final = true;
  RecordState Classify(int status) const;
};

// How many stale records of one route the takeover loop resolves at once: each may wait for a
// downstream (a stalled provider or status URL) up to its timeout, so a pass over N of them takes
// about ceil(N / kTakeoverConcurrency) such waits, never N.
inline constexpr std::size_t kTakeoverConcurrency = 8;

// Runs body(0) … body(n - 1) on up to `width` threads at once (the calling thread among them)
// and returns once every call has. `body` must be safe to call concurrently.
void RunConcurrently(std::size_t n, std::size_t width,
                     const std::function<void(std::size_t)>& body);

struct FilterPolicy {
  RoutePolicy route;
  FailurePolicy failures;
  Millis wait_max{10000};
  // Requests one principal may have parked on Prefer: wait at once; beyond, a would-be waiter gets
  // the answer it would get without Prefer: wait (409 + Retry-After) at once.
  int64_t max_waiters_per_principal = limits::kMaxWaitersPerPrincipal;
  // Requests one principal may bring to the claim each second (a token bucket holding as many:
  // a burst of that size after a pause); beyond, 429 quota-exceeded with Retry-After at once,
  // before the store. Replays and duplicates of a running operation are not counted. Per filter
  // and process; 0: no limit.
  int64_t max_new_keys_per_second = limits::kMaxNewKeysPerSecondPerPrincipal;
  std::string route_label;  // for metrics and logs, e.g. "payments.create"
  // The URL of a running operation is operations_prefix + key + operations_suffix, e.g.
  // "/v1/operations/" + key, or with "?route=orders.create" for a gateway route.
  std::string operations_prefix;
  std::string operations_suffix;
  std::string api_version = "v1";
  // Stale records TakeOverOnce resolves at once, each on a thread of its own (the calling
  // thread among them); 1: one after another on the calling thread (the simulator's).
  std::size_t takeover_concurrency = kTakeoverConcurrency;
  // Response headers kept with a stored response (besides the status and body).
  std::vector<std::string> stored_headers = {"Location", "Content-Type"};
  // The request's target (path and query) is part of its fingerprint: for routes whose pattern
  // leaves parts of it open (gateway routes).
  bool fingerprint_target = false;
};

// Thread-safe. Borrows the engine, the pools, the clock, the metrics and the operation; talks to
// records only through the engine, whose calls run on `pool`, and its snapshot reads (a replay
// not held in memory, a parked request's poll) on `reads` (default: `pool`), so that with a pool
// of their own they never queue behind claims. `monotonic` times Prefer: wait deadlines and the
// heartbeat that renews each execution's lease. Declares its route's
// request outcomes to `metrics`.
class IdempotencyFilter {
 public:
  IdempotencyFilter(Engine& engine, http::BlockingPool& pool, MonotonicClock& monotonic,
                    Metrics& metrics, FilterPolicy policy, Operation& operation,
                    http::BlockingPool* reads = nullptr);
  ~IdempotencyFilter();

  // Prefer: wait parks a duplicate of a running operation (context.park) when its principal has
  // fewer than policy.max_waiters_per_principal parked and the server has room
  // (context.reserve_park); otherwise it answers at once, as without Prefer: wait. A parked
  // request keeps its place in context.hold until it ends. Called again after a park, it first
  // checks with a snapshot read (Engine::Lookup) and goes to Engine::Start — whose claim
  // transaction takes the write lock — only once the record is finished, its lease has ended,
  // or it is gone.
  http::Async<http::Response> Handle(const http::Request& request, const Principal& principal,
                                     http::RequestContext& context);

  // GET {operations_prefix}{key}{operations_suffix}: the caller's own record for `key` on this
  // route (blocking).
  http::Response GetOperation(std::string_view key, const Principal& principal);

  // Resolves up to `limit` stale records of this route, kTakeoverConcurrency at once (each on a
  // thread of its own, blocking); returns how many it resolved. Counts one takeover pass, failed
  // when the store refused to list, take over or settle a record.
  int TakeOverOnce(int limit, const std::function<void(const std::string&)>& notify);

  // What the record of `request` answers without executing anything (a snapshot read,
  // blocking): a replay of its finished record, kInProgress under a live lease, nullopt when
  // there is none or a claim would decide; kFingerprintMismatch when its key holds another
  // request (Engine::ReplayFromStore). For a caller that must not run the operation again (a
  // queue consumer's message delivered too often).
  Result<std::optional<Decision>> Recorded(const http::Request& request,
                                           const Principal& principal);

  const FilterPolicy& policy() const { return policy_; }

 private:
  // The engine's view of `request`: its key header, method, media type, body and, when the
  // route fingerprints it, its target; the filter's api version. Borrows from `request`.
  Request EngineRequest(const http::Request& request, const Principal& principal) const;
  // `location`: the operation's URL, for answers that tell a client to come back. When nothing
  // was sent because an earlier send is still settling, sets *settling (if given) to how long
  // it has left; the record is held that long. Everything is borrowed (the caller's frame
  // holds it), so a request waiting on its execution keeps one copy of each, not two.
  http::Async<http::Response> Run(Ticket& ticket, const http::Request& request,
                                  const Principal& principal, const std::string& location,
                                  const std::function<void(const std::string&)>& notify,
                                  std::optional<Millis>* settling = nullptr);
  // Run for a request answered already (202 Accepted): owns copies of what it uses.
  http::Async<void> RunApart(Ticket ticket, http::Request request, Principal principal,
                             std::string location, std::function<void(const std::string&)> notify);
  // Records the execution's outcome (blocking: on the pool). Sets *store_failed (if given) when
  // the store refused to record it for another reason than a lost lease.
  http::Response Finish(Ticket& ticket, Execution execution, const std::string& location,
                        std::optional<Millis>* settling, bool* store_failed = nullptr);
  void AddExpires(http::Response& response, Timestamp expires) const;
  // 202 Accepted for an operation that runs on: its key, state and Location.
  http::Response Accepted(std::string_view key, const std::string& location,
                          Timestamp expires) const;
  // The stored answer of a finished record, as a replay; nullopt if it is not finished.
  std::optional<http::Response> StoredAnswer(const ScopeHash& scope);
  // A running operation `key` met by this request: parks it (Prefer: wait, with a place among its
  // principal's waiters and room in the server) or answers 409 / 202.
  struct Running {
    std::string key;
    ScopeHash scope{};
    Millis retry_after{0};
    Timestamp key_expires{};
  };
  // A request Admit claimed to execute now: its ticket, what its answer needs, and its wait.
  struct Admitted {
    Ticket ticket;
    Running running;  // the key, its scope and expiry; Execute sets retry_after if it must wait
    std::string location;
    std::optional<Millis> wait;
  };
  // Handle up to the execution: every answer that needs none (invalid, replayed, in progress,
  // refused, accepted to run apart), or `admitted` set and no answer. Two coroutines, not one,
  // so that the admission's locals (the records read, the decision) are not held in the frame
  // of a request waiting for its execution (a provider call may wait seconds).
  http::Async<http::Response> Admit(const http::Request& request, const Principal& principal,
                                    http::RequestContext& context,
                                    std::optional<Admitted>& admitted);
  // Runs an admitted request to its answer.
  http::Async<http::Response> Execute(Admitted& admitted, const http::Request& request,
                                      const Principal& principal, http::RequestContext& context);
  void Count(http::RequestContext& context, RequestOutcome outcome);
  http::Response InProgress(const Running& running, bool respond_async, std::optional<Millis> wait,
                            const Principal& principal, http::RequestContext& context);
  // Takes a place among `principal`'s waiters and room in the server, into context.hold; false
  // when either is full. True at once when the request holds its place already.
  bool TryPark(const Principal& principal, http::RequestContext& context);

  Engine& engine_;
  http::BlockingPool& pool_;
  http::BlockingPool& reads_;
  MonotonicClock& monotonic_;
  Metrics& metrics_;
  FilterPolicy policy_;
  Operation& operation_;
  // Parked requests per principal; shared with each waiter's place, which may be given back
  // after the filter is gone (a server destroying its parked requests as it stops).
  class Waiters;
  class WaiterPlace;
  std::shared_ptr<Waiters> waiters_;
  class ClaimRate;
  std::unique_ptr<ClaimRate> claim_rate_;
};

}  // namespace idem::idemd
