// server/idemd/filter/filter_test.cc — every decision of the idempotency filter, called directly
// (no process, no socket): a scripted Operation in front of a real Engine on a SQLite file, with
// fake clocks. Each test asserts the exact status, problem type and the headers docs/idemd.md
// requires.
//
// Only the tests that hold an execution inside Execute use a second thread; it blocks on latches,
// never on time.
#include "server/idemd/filter/filter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <functional>
#include <future>
#include <latch>
#include <set>
#include <thread>
#include <vector>

#include "http/problem.h"
#include "idem/mutex.h"
#include "idem/store/replay_cache.h"
#include "idem/store/sqlite.h"
#include "testing/engine_fixture.h"
#include "testing/fakes.h"
#include "testing/faulty_store.h"
#include "testing/http_answers.h"

namespace idem::idemd {
namespace {

namespace json = boost::json;
using std::chrono::milliseconds;

constexpr Millis kLease{10000};
constexpr Millis kRetention{24LL * 3600 * 1000};
constexpr Millis kWaitMax{10000};
constexpr std::string_view kRoute = "things.create";
constexpr std::string_view kBody = R"({"amount":"1.00"})";
const Principal kAlice{"acme", "alice"};
const Principal kBob{"acme", "bob"};

using testing::HeaderOf;
using testing::TypeOf;

// The answer of the n-th execution: 201 with a body that names it, a Location and Content-Type
// (stored with the answer) and X-Trace (not stored).
Execution Answer(int status, int n) {
  Execution e;
  e.response.status = status;
  e.response.headers.Set("Content-Type", "application/json");
  e.response.headers.Set("Location", "/v1/things/" + std::to_string(n));
  e.response.headers.Set("X-Trace", "t" + std::to_string(n));
  e.response.body = R"({"n":)" + std::to_string(n) + "}";
  return e;
}

// An Operation the test scripts. Validate answers `refusal`; OnClaim fixes the resource id
// ("thing_<claim>") and advances to "claimed" once per operation; Execute and TakeOver answer
// through the hooks, by default Answer(201, n) for the n-th execution. Counts every call and keeps
// what each execution's ticket said. The hooks are set before requests start; the rest is
// thread-safe.
class FakeOperation final : public Operation {
 public:
  std::optional<http::Response> refusal;
  std::function<Execution(int n, Ticket& ticket)> execute;
  std::function<Execution(Ticket& ticket)> reconcile;

  std::optional<http::Response> Validate(const http::Request&, const Principal&, bool) override {
    MutexLock lock(mu_);
    ++validated_;
    return refusal;
  }
  Status OnClaim(StoreTxn& txn, const Record& record, const http::Request&,
                 const Principal&) override {
    int n;
    {
      MutexLock lock(mu_);
      n = ++claimed_;
    }
    if (!record.resource_id.empty()) return Ok();
    return txn.Advance(record.scope, record.lease, "claimed", "thing_" + std::to_string(n));
  }
  http::Async<Execution> Execute(Ticket& ticket, const http::Request&, const Principal&, Engine&,
                                 Heartbeat&) override {
    int n;
    {
      MutexLock lock(mu_);
      n = ++executed_;
      executions_.push_back(ticket);
    }
    co_return execute ? execute(n, ticket) : Answer(201, n);
  }
  Execution TakeOver(Ticket& ticket, Engine&) override {
    {
      MutexLock lock(mu_);
      reconciled_.push_back(ticket);
    }
    return reconcile ? reconcile(ticket) : Answer(201, 99);
  }

  int Validated() {
    MutexLock lock(mu_);
    return validated_;
  }
  int Claimed() {
    MutexLock lock(mu_);
    return claimed_;
  }
  int Executed() {
    MutexLock lock(mu_);
    return executed_;
  }
  // The ticket each execution (or reconciliation) started with, in order.
  std::vector<Ticket> Executions() {
    MutexLock lock(mu_);
    return executions_;
  }
  std::vector<Ticket> Reconciled() {
    MutexLock lock(mu_);
    return reconciled_;
  }

 private:
  Mutex mu_;
  int validated_ IDEM_GUARDED_BY(mu_) = 0;
  int claimed_ IDEM_GUARDED_BY(mu_) = 0;
  int executed_ IDEM_GUARDED_BY(mu_) = 0;
  std::vector<Ticket> executions_ IDEM_GUARDED_BY(mu_);
  std::vector<Ticket> reconciled_ IDEM_GUARDED_BY(mu_);
};

class FilterTest : public testing::EngineFixture {
 protected:
  FilterTest() {
    policy_.route.route = kRoute;
    policy_.route.rules.money_fields = {"amount"};
    policy_.route.lease = kLease;
    policy_.route.retention = kRetention;
    policy_.route.retry_after = Millis(5000);
    policy_.failures.final_statuses = {402};
    policy_.failures.retryable_statuses = {503};
    policy_.wait_max = kWaitMax;
    policy_.route_label = kRoute;
    policy_.operations_prefix = "/v1/operations/";
  }

  ~FilterTest() override {
    // A failed assertion must not leave the blocked execution waiting for ever.
    if (runner_.joinable()) {
      if (!released_) release_.count_down();
      runner_.join();
    }
  }

  // The filter, made on first use so a test may change policy_ before.
  IdempotencyFilter& Filter() {
    if (!filter_) {
      filter_ =
          std::make_unique<IdempotencyFilter>(*engine_, pool_, monotonic_, metrics_, policy_, op_);
    }
    return *filter_;
  }

  static http::Request Post(std::string_view key, std::string_view body = kBody) {
    http::Request r;
    r.method = "POST";
    r.target = "/v1/things";
    r.headers.Add("Idempotency-Key", key);
    r.headers.Add("Content-Type", "application/json");
    r.body = std::string(body);
    return r;
  }
  static http::Request Prefer(http::Request r, std::string_view preference) {
    r.headers.Add("Prefer", preference);
    return r;
  }

  // A context like the server's: spawned tasks are kept for the test to run, notifications are
  // recorded.
  http::RequestContext Context() {
    http::RequestContext context;
    context.spawn = [this](std::function<http::Async<void>()> task) {
      MutexLock lock(mu_);
      spawned_.push_back(std::move(task));
    };
    context.notify = [this](const std::string& key) {
      MutexLock lock(mu_);
      notified_.push_back(key);
    };
    return context;
  }

  http::Response Handle(const http::Request& request, const Principal& who = kAlice) {
    http::RequestContext context = Context();
    return HandleWith(request, who, context);
  }

  // The filter's coroutine run to its end in this thread.
  http::Response HandleWith(const http::Request& request, const Principal& who,
                            http::RequestContext& context) {
    return http::RunSync(Filter().Handle(request, who, context));
  }

  // Runs `request` on a thread and returns once its (first) execution is inside Execute, where it
  // waits until Release().
  void StartBlocked(http::Request request) {
    op_.execute = [this](int n, Ticket&) {
      if (n == 1) {
        entered_.count_down();
        release_.wait();
      }
      return Answer(201, n);
    };
    Filter();
    runner_ = std::thread([this, request = std::move(request)] {
      http::RequestContext context = Context();
      blocked_answer_ = HandleWith(request, kAlice, context);
    });
    entered_.wait();
  }
  // Lets the blocked execution finish and returns its answer.
  http::Response Release() {
    released_ = true;
    release_.count_down();
    runner_.join();
    return blocked_answer_;
  }

  ScopeHash ScopeOf(std::string_view key, const Principal& who = kAlice,
                    std::string_view route = kRoute) {
    return *Scope{who.tenant, who.user, std::string(route), std::string(key)}.Hash();
  }
  std::optional<FoundRecord> Found(std::string_view key, const Principal& who = kAlice) {
    auto found = engine_->Lookup(who, policy_.route, key);
    EXPECT_TRUE(found.has_value()) << found.error().message;
    return found ? *found : std::nullopt;
  }
  int64_t Records() {
    auto rows = store_->Query("SELECT count(*) FROM idem_records");
    EXPECT_TRUE(rows.has_value());
    return rows ? std::get<int64_t>(rows->at(0).at(0)) : -1;
  }
  // Idempotency-Key-Expires of a record created at `created`.
  static std::string ExpiresFor(Timestamp created) {
    return http::HttpDate(ToUnixMillis(created + kRetention));
  }
  // The value of one metric series (name and labels as rendered); 0 when not rendered.
  int64_t Metric(const std::string& series) {
    const std::string text = metrics_.Render();
    const std::size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return 0;
    return std::stoll(text.substr(at + series.size() + 2));
  }
  int64_t Requests(const std::string& outcome) {
    return Metric("idem_requests_total{route=\"" + std::string(kRoute) + "\",outcome=\"" + outcome +
                  "\"}");
  }
  std::vector<std::string> Notified() {
    MutexLock lock(mu_);
    return notified_;
  }
  std::size_t SpawnedCount() {
    MutexLock lock(mu_);
    return spawned_.size();
  }
  // The i-th spawned task, to run; it stays in spawned_, which keeps what it captured.
  http::Async<void> Spawned(std::size_t i) {
    MutexLock lock(mu_);
    return spawned_[i]();
  }

  Metrics metrics_;
  http::BlockingPool pool_{4};
  FilterPolicy policy_;
  FakeOperation op_;
  std::unique_ptr<IdempotencyFilter> filter_;

  Mutex mu_;
  std::vector<std::function<http::Async<void>()>> spawned_ IDEM_GUARDED_BY(mu_);
  std::vector<std::string> notified_ IDEM_GUARDED_BY(mu_);

  std::latch entered_{1};
  std::latch release_{1};
  bool released_ = false;
  std::thread runner_;
  http::Response blocked_answer_;
};

TEST(FailurePolicyTest, Classifies2xxThenTheListsThenTheStatusClass) {
  FailurePolicy policy;
  policy.final_statuses = {402, 501};
  policy.retryable_statuses = {409, 503};
  EXPECT_EQ(policy.Classify(200), RecordState::kSucceeded);
  EXPECT_EQ(policy.Classify(201), RecordState::kSucceeded);
  EXPECT_EQ(policy.Classify(204), RecordState::kSucceeded);
  EXPECT_EQ(policy.Classify(402), RecordState::kFailedFinal);
  EXPECT_EQ(policy.Classify(501), RecordState::kFailedFinal) << "listed final beats 5xx";
  EXPECT_EQ(policy.Classify(409), RecordState::kFailedRetryable) << "listed retryable beats 4xx";
  EXPECT_EQ(policy.Classify(503), RecordState::kFailedRetryable);
  EXPECT_EQ(policy.Classify(400), RecordState::kFailedFinal) << "any other 4xx";
  EXPECT_EQ(policy.Classify(500), RecordState::kFailedRetryable) << "any other 5xx";
}

TEST_F(FilterTest, ARefusalFromValidateEndsTheRequestAndLeavesNoRecord) {
  op_.refusal = http::Problem(http::ProblemKind::kUnsupportedMediaType, "send JSON");
  http::RequestContext context = Context();
  const http::Response r = HandleWith(Post("key-00000001"), kAlice, context);

  EXPECT_EQ(r.status, 415);
  EXPECT_EQ(TypeOf(r), "urn:idem:problem:unsupported-media-type");
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key-Expires"), "<absent>");
  EXPECT_EQ(op_.Validated(), 1);
  EXPECT_EQ(op_.Claimed(), 0);
  EXPECT_EQ(op_.Executed(), 0);
  EXPECT_FALSE(Found("key-00000001").has_value());
  EXPECT_EQ(Records(), 0);
  EXPECT_EQ(context.route, kRoute);
  EXPECT_EQ(context.outcome, "invalid");
  EXPECT_EQ(Requests("invalid"), 1);
}

// A request without one well-formed Idempotency-Key is 400 before the claim: nothing executes,
// no record is written under any key it carries, and it counts as invalid.
TEST_F(FilterTest, ARequestWithoutOneWellFormedKeyIs400AndLeavesNoRecord) {
  struct Case {
    std::string why;
    http::Request request;
    std::vector<std::string> keys = {};  // no record under any of these
  };
  std::vector<Case> cases;
  http::Request missing = Post("unused-key");
  missing.headers.fields.clear();
  missing.headers.Add("Content-Type", "application/json");
  cases.push_back({"no key", missing});
  for (std::string_view key :
       {"short", "has space inside", "\"unterminated-key", "key/with/slash"}) {
    cases.push_back({"malformed key " + std::string(key), Post(key)});
  }
  http::Request two = Post("key-00000001");
  two.headers.Add("Idempotency-Key", "key-00000002");
  cases.push_back({"two key headers", two, {"key-00000001", "key-00000002"}});

  int64_t invalid = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.why);
    http::RequestContext context = Context();
    const http::Response r = HandleWith(c.request, kAlice, context);
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(TypeOf(r), "urn:idem:problem:invalid-request");
    EXPECT_EQ(context.outcome, "invalid");
    EXPECT_EQ(Requests("invalid"), ++invalid);
    EXPECT_EQ(op_.Claimed(), 0);
    EXPECT_EQ(op_.Executed(), 0);
    EXPECT_EQ(Records(), 0);
    for (const std::string& key : c.keys) EXPECT_FALSE(Found(key).has_value()) << key;
  }
}

TEST_F(FilterTest, TheFirstRequestExecutesOnceAndTheRetryReplaysItsAnswer) {
  http::RequestContext context = Context();
  const http::Response first = HandleWith(Post("key-00000001"), kAlice, context);
  ASSERT_EQ(first.status, 201);
  EXPECT_EQ(first.body, R"({"n":1})");
  EXPECT_EQ(HeaderOf(first, "Location"), "/v1/things/1");
  EXPECT_EQ(HeaderOf(first, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(HeaderOf(first, "Idempotent-Replayed"), "<absent>");
  EXPECT_EQ(context.outcome, "executed");
  ASSERT_EQ(op_.Executions().size(), 1u);
  EXPECT_FALSE(op_.Executions()[0].resumed);
  EXPECT_EQ(op_.Executions()[0].record.resource_id, "thing_1");
  EXPECT_EQ(Notified(), std::vector<std::string>{ToHex(ScopeOf("key-00000001"))});

  clock_.Advance(Millis(60000));
  // The same request, the key written as an sf-string: a retry.
  context = Context();
  const http::Response again = HandleWith(Post("\"key-00000001\""), kAlice, context);
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(HeaderOf(again, "Idempotent-Replayed"), "true");
  EXPECT_EQ(HeaderOf(again, "Location"), "/v1/things/1");
  EXPECT_EQ(HeaderOf(again, "Content-Type"), "application/json");
  EXPECT_EQ(HeaderOf(again, "X-Trace"), "<absent>") << "only the policy's stored_headers replay";
  EXPECT_EQ(HeaderOf(again, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(context.outcome, "replayed");
  EXPECT_EQ(op_.Executed(), 1);
  EXPECT_EQ(op_.Claimed(), 1) << "a replay claims nothing";
  EXPECT_EQ(Requests("executed"), 1);
  EXPECT_EQ(Requests("replayed"), 1);
}

// The engine fingerprints the media type of Content-Type only; the filter hands it the header as
// sent, so a retry that adds a charset or changes case is the same request.
TEST_F(FilterTest, ARetryWithContentTypeParametersOrOtherCaseIsAReplay) {
  ASSERT_EQ(Handle(Post("key-00000001")).status, 201);
  for (std::string_view type : {"application/json; charset=utf-8", "Application/JSON"}) {
    SCOPED_TRACE(type);
    http::Request retry = Post("key-00000001");
    retry.headers.Set("Content-Type", type);
    const http::Response r = Handle(retry);
    EXPECT_EQ(r.status, 201) << TypeOf(r);
    EXPECT_EQ(HeaderOf(r, "Idempotent-Replayed"), "true");
  }
  EXPECT_EQ(op_.Executed(), 1);
}

// A 422 is about the record that holds the key: it tells until when that record keeps the key
// (its expiry, not the time of the refused request plus the retention).
TEST_F(FilterTest, TheSameKeyWithADifferentBodyIs422) {
  ASSERT_EQ(Handle(Post("key-00000001")).status, 201);
  clock_.Advance(Millis(60000));
  http::RequestContext context = Context();
  const http::Response r =
      HandleWith(Post("key-00000001", R"({"amount":"2.00"})"), kAlice, context);

  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(TypeOf(r), "urn:idem:problem:idempotency-key-reused");
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(HeaderOf(r, "Idempotent-Replayed"), "<absent>");
  EXPECT_EQ(op_.Executed(), 1);
  EXPECT_EQ(context.outcome, "mismatch");
  EXPECT_EQ(Requests("mismatch"), 1);
  // The same key of another principal is another record: no mismatch.
  EXPECT_EQ(Handle(Post("key-00000001", R"({"amount":"2.00"})"), kBob).status, 201);
}

// While the first request runs, a different request with its key is decided in the claim
// transaction, and answers the same.
TEST_F(FilterTest, TheSameKeyWithADifferentBodyWhileTheFirstRunsIs422) {
  StartBlocked(Post("key-00000001"));
  clock_.Advance(Millis(2000));
  const http::Response r = Handle(Post("key-00000001", R"({"amount":"2.00"})"));

  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(TypeOf(r), "urn:idem:problem:idempotency-key-reused");
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(HeaderOf(r, "Location"), "<absent>");
  EXPECT_EQ(HeaderOf(r, "Retry-After"), "<absent>") << "a retry would not help";
  EXPECT_EQ(Release().status, 201);
  EXPECT_EQ(op_.Executed(), 1);
}

// An execution's own 409 (e.g. payments' order-conflict and order-in-progress) is an answer about
// its record: the filter stamps the record's expiry on it, and on its replay.
TEST_F(FilterTest, AnExecutionsOwn409CarriesTheRecordsExpiry) {
  op_.execute = [](int n, Ticket&) {
    Execution e = Answer(409, n);
    e.state = RecordState::kFailedFinal;
    return e;
  };
  const http::Response first = Handle(Post("key-00000001"));
  EXPECT_EQ(first.status, 409);
  EXPECT_EQ(HeaderOf(first, "Idempotency-Key-Expires"), ExpiresFor(t0_));

  clock_.Advance(Millis(60000));
  const http::Response again = Handle(Post("key-00000001"));
  EXPECT_EQ(again.status, 409);
  EXPECT_EQ(HeaderOf(again, "Idempotent-Replayed"), "true");
  EXPECT_EQ(HeaderOf(again, "Idempotency-Key-Expires"), ExpiresFor(t0_));

  // Retryable: the next attempt executes again and answers with its record's expiry, which the
  // resume extended to a full retention from the retry.
  op_.execute = [](int n, Ticket&) {
    Execution e = Answer(409, n);
    e.state = RecordState::kFailedRetryable;
    return e;
  };
  ASSERT_EQ(Handle(Post("key-00000002")).status, 409);
  clock_.Advance(Millis(60000));
  const http::Response retried = Handle(Post("key-00000002"));
  EXPECT_EQ(retried.status, 409);
  EXPECT_EQ(HeaderOf(retried, "Idempotent-Replayed"), "<absent>");
  EXPECT_EQ(HeaderOf(retried, "Idempotency-Key-Expires"), ExpiresFor(t0_ + Millis(120000)));
  EXPECT_EQ(op_.Executed(), 3);
}

TEST_F(FilterTest, ADuplicateWhileTheFirstRunsIs409WithRetryAfterAndLocation) {
  StartBlocked(Post("key-00000001"));
  // 2.5 s of the lease left: Retry-After rounds up to 3 (the policy allows up to 5).
  clock_.Advance(Millis(7500));
  http::RequestContext context = Context();
  const http::Response r = HandleWith(Post("\"key-00000001\""), kAlice, context);

  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(TypeOf(r), "urn:idem:problem:request-in-progress");
  EXPECT_EQ(HeaderOf(r, "Retry-After"), "3");
  EXPECT_EQ(HeaderOf(r, "Location"), "/v1/operations/key-00000001");
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(context.outcome, "in_progress");
  EXPECT_FALSE(context.park.has_value());
  EXPECT_EQ(op_.Executed(), 1) << "the duplicate must not execute";

  EXPECT_EQ(Release().status, 201);
  EXPECT_EQ(op_.Executed(), 1);
}

TEST_F(FilterTest, ADuplicateWhileTheFirstRunsWithRespondAsyncIs202) {
  StartBlocked(Post("key-00000001"));
  http::RequestContext context = Context();
  const http::Response r =
      HandleWith(Prefer(Post("key-00000001"), "respond-async"), kAlice, context);

  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.body, R"({"key":"key-00000001","state":"PROCESSING"})");
  EXPECT_EQ(HeaderOf(r, "Content-Type"), "application/json");
  EXPECT_EQ(HeaderOf(r, "Location"), "/v1/operations/key-00000001");
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(context.outcome, "in_progress");
  EXPECT_EQ(SpawnedCount(), 0u) << "a duplicate spawns no work";
  EXPECT_EQ(Release().status, 201);
  EXPECT_EQ(op_.Executed(), 1);
}

TEST_F(FilterTest, PreferWaitParksUntilMinOfNAndWaitMaxThenAnswers409) {
  StartBlocked(Post("key-00000001"));
  const std::string scope_key = ToHex(ScopeOf("key-00000001"));

  // wait=3 is under wait_max: the deadline is now + 3 s on the injected monotonic clock.
  const SteadyTime start = monotonic_.Now();
  http::RequestContext context = Context();
  const http::Request waiting = Prefer(Post("key-00000001"), "wait=3");
  (void)HandleWith(waiting, kAlice, context);
  ASSERT_TRUE(context.park.has_value());
  EXPECT_EQ(context.park->key, scope_key);
  EXPECT_EQ(context.park->deadline, start + milliseconds(3000));
  EXPECT_EQ(context.outcome, "") << "a parked request has no outcome yet";

  // Woken early (a poll), still running: parks again with the same deadline.
  monotonic_.Advance(milliseconds(1000));
  context.park.reset();
  context.attempt = 2;
  (void)HandleWith(waiting, kAlice, context);
  ASSERT_TRUE(context.park.has_value());
  EXPECT_EQ(context.park->deadline, start + milliseconds(3000));

  // At the deadline: the answer a request without Prefer gets.
  monotonic_.Advance(milliseconds(2000));
  context.park.reset();
  context.attempt = 3;
  const http::Response r = HandleWith(waiting, kAlice, context);
  EXPECT_FALSE(context.park.has_value());
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(TypeOf(r), "urn:idem:problem:request-in-progress");
  EXPECT_EQ(HeaderOf(r, "Retry-After"), "5");
  EXPECT_EQ(HeaderOf(r, "Location"), "/v1/operations/key-00000001");
  EXPECT_EQ(context.outcome, "in_progress");

  // wait=60 is over wait_max (10 s): capped.
  http::RequestContext capped = Context();
  (void)HandleWith(Prefer(Post("key-00000001"), "wait=60"), kAlice, capped);
  ASSERT_TRUE(capped.park.has_value());
  EXPECT_EQ(capped.park->deadline, monotonic_.Now() + kWaitMax);

  EXPECT_EQ(Release().status, 201);
  EXPECT_EQ(op_.Executed(), 1);
}

TEST_F(FilterTest, AParkedDuplicateGetsTheReplayOnceTheFirstFinishes) {
  StartBlocked(Post("key-00000001"));
  http::RequestContext context = Context();
  const http::Request waiting = Prefer(Post("key-00000001"), "wait=5");
  (void)HandleWith(waiting, kAlice, context);
  ASSERT_TRUE(context.park.has_value());

  const http::Response first = Release();
  ASSERT_EQ(first.status, 201);
  // The completion notifies the parked request's key; it calls Handle again before its deadline.
  EXPECT_EQ(Notified(), std::vector<std::string>{context.park->key});
  context.park.reset();
  context.attempt = 2;
  const http::Response r = HandleWith(waiting, kAlice, context);
  EXPECT_FALSE(context.park.has_value());
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.body, first.body);
  EXPECT_EQ(HeaderOf(r, "Idempotent-Replayed"), "true");
  EXPECT_EQ(context.outcome, "replayed");
  EXPECT_EQ(op_.Executed(), 1);
}

// Prefer: wait parks at most max_waiters_per_principal requests per principal: tested at the
// limit and one past it. Each place is given back when its request ends: answered (a replay),
// timed out (the 409), or ended by the server (its context destroyed: a connection closed while
// parked, a drain). Another principal's waiters are counted apart.
TEST_F(FilterTest, PreferWaitParksAtMostMaxWaitersPerPrincipalThenAnswers409AtOnce) {
  policy_.max_waiters_per_principal = 3;
  StartBlocked(Post("key-00000001"));
  const http::Request waiting = Prefer(Post("key-00000001"), "wait=5");
  auto park = [&](http::RequestContext& context, const Principal& who = kAlice) {
    context = Context();
    return HandleWith(waiting, who, context);
  };

  std::vector<http::RequestContext> parked(3);
  for (http::RequestContext& context : parked) {
    (void)park(context);
    ASSERT_TRUE(context.park.has_value()) << "at the limit, a waiter parks";
  }
  // One past the limit: the answer without Prefer: wait, at once.
  http::RequestContext over;
  const http::Response r = park(over);
  EXPECT_FALSE(over.park.has_value());
  EXPECT_EQ(over.hold, nullptr);
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(TypeOf(r), "urn:idem:problem:request-in-progress");
  EXPECT_EQ(HeaderOf(r, "Retry-After"), "5");
  EXPECT_EQ(HeaderOf(r, "Location"), "/v1/operations/key-00000001");
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(over.outcome, "in_progress");

  // Bob's waiters are his own: a running operation of his, and he may park.
  Request bob_first;
  bob_first.principal = kBob;
  bob_first.key_header = "key-00000002";
  bob_first.method = "POST";
  bob_first.content_type = "application/json";
  bob_first.api_version = policy_.api_version;
  bob_first.body = kBody;
  auto bob_claim = engine_->Start(policy_.route, bob_first);
  ASSERT_TRUE(bob_claim.has_value()) << bob_claim.error().message;
  ASSERT_EQ(bob_claim->kind, Decision::Kind::kExecute);
  http::RequestContext bob = Context();
  (void)HandleWith(Prefer(Post("key-00000002"), "wait=5"), kBob, bob);
  EXPECT_TRUE(bob.park.has_value()) << "another principal's waiters are counted apart";

  // The server ends a parked request (its connection closed): its context goes, and its place.
  parked[0] = http::RequestContext();
  (void)park(parked[0]);
  EXPECT_TRUE(parked[0].park.has_value()) << "a closed waiter's place is given back";
  (void)park(over);
  EXPECT_FALSE(over.park.has_value()) << "full again";

  // A waiter whose wait ends gets the 409 and gives its place back.
  monotonic_.Advance(milliseconds(5000));
  parked[1].park.reset();
  parked[1].attempt = 2;
  EXPECT_EQ(HandleWith(waiting, kAlice, parked[1]).status, 409);
  EXPECT_FALSE(parked[1].park.has_value());
  EXPECT_EQ(parked[1].hold, nullptr);
  (void)park(parked[1]);
  EXPECT_TRUE(parked[1].park.has_value()) << "a timed-out waiter's place is given back";

  // A waiter woken by the completion gets the replay and gives its place back.
  ASSERT_EQ(Release().status, 201);
  parked[2].park.reset();
  parked[2].attempt = 2;
  const http::Response replay = HandleWith(waiting, kAlice, parked[2]);
  EXPECT_EQ(replay.status, 201);
  EXPECT_EQ(HeaderOf(replay, "Idempotent-Replayed"), "true");
  EXPECT_EQ(parked[2].hold, nullptr);
}

// The server's bound on parked requests in all (reserve_park) refuses room: the waiter answers
// at once, as without Prefer: wait, and keeps no place among its principal's waiters.
TEST_F(FilterTest, PreferWaitWithoutRoomInTheServerAnswers409AtOnce) {
  policy_.max_waiters_per_principal = 1;
  StartBlocked(Post("key-00000001"));
  const http::Request waiting = Prefer(Post("key-00000001"), "wait=5");
  http::RequestContext refused = Context();
  refused.reserve_park = [] { return false; };
  const http::Response r = HandleWith(waiting, kAlice, refused);
  EXPECT_FALSE(refused.park.has_value());
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(HeaderOf(r, "Location"), "/v1/operations/key-00000001");
  EXPECT_EQ(refused.outcome, "in_progress");
  // Its principal's one place is still free.
  http::RequestContext roomy = Context();
  roomy.reserve_park = [] { return true; };
  (void)HandleWith(waiting, kAlice, roomy);
  EXPECT_TRUE(roomy.park.has_value());
  EXPECT_EQ(Release().status, 201);
}

// Counts write transactions (Begin) and snapshot reads (Read) on the way to a store.
class CountingStore final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<std::unique_ptr<StoreTxn>> Begin() override {
    ++begins;
    return StoreWrapper::Begin();
  }
  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    ++reads;
    return StoreWrapper::Read(scope);
  }
  std::atomic<int> begins{0};
  std::atomic<int> reads{0};
};

// A finished record held in memory is answered without any store call (no read, no
// transaction, so no hop to the store's threads): its replay, and a mismatch against it. The
// execution that finished it put it there (Store::KeepFinished), so even the first replay needs
// no read.
TEST_F(FilterTest, AFinishedRecordHeldInMemoryIsAnsweredWithoutAStoreCall) {
  // The engine's calls are counted in front of the cache: a read the cache answers counts too.
  std::unique_ptr<Store> cached = WrapWithReplayCache(std::make_unique<StoreWrapper>(*store_),
                                                      {.monotonic = &monotonic_}, clock_);
  CountingStore counting(*cached);
  Engine engine(counting, *fingerprinter_, *sealer_, clock_);
  IdempotencyFilter filter(engine, pool_, monotonic_, metrics_, policy_, op_);
  auto handle = [&](const http::Request& request) {
    http::RequestContext context = Context();
    return http::RunSync(filter.Handle(request, kAlice, context));
  };
  const http::Response first = handle(Post("key-00000001"));
  ASSERT_EQ(first.status, 201);
  const int reads = counting.reads;
  const int begins = counting.begins;
  for (int i = 0; i < 4; ++i) {
    const http::Response replay = handle(Post("key-00000001"));
    EXPECT_EQ(replay.status, 201);
    EXPECT_EQ(replay.body, first.body);
    EXPECT_EQ(HeaderOf(replay, "Idempotent-Replayed"), "true");
    EXPECT_EQ(HeaderOf(replay, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  }
  const http::Response mismatch = handle(Post("key-00000001", R"({"amount":"2.00"})"));
  EXPECT_EQ(mismatch.status, 422);
  EXPECT_EQ(HeaderOf(mismatch, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(counting.reads, reads) << "answered from memory, without a store call";
  EXPECT_EQ(counting.begins, begins);
  EXPECT_EQ(op_.Executed(), 1);
  EXPECT_EQ(Requests("replayed"), 4);
  EXPECT_EQ(Requests("mismatch"), 1);
  EXPECT_EQ(Metric("idem_replays_total{source=\"memory\"}"), 4);
  EXPECT_EQ(Metric("idem_replays_total{source=\"store\"}"), 0);
}

// A replay of a finished record that memory does not hold (another instance finished it, or this
// one restarted) is read on the reads' threads: it does not wait while every thread of the
// claims' pool is taken (claims queued behind a slow database). Before the reads had threads of
// their own, the snapshot read ran inside Start on the claims' pool, and this replay waited for
// the blocked thread until the test gave up (5 s).
TEST_F(FilterTest, AReplayNotHeldInMemoryDoesNotQueueBehindClaims) {
  http::BlockingPool claims(1);
  http::BlockingPool reads(1);
  IdempotencyFilter filter(*engine_, claims, monotonic_, metrics_, policy_, op_, &reads);
  auto handle = [&](const http::Request& request) {
    http::RequestContext context = Context();
    return http::RunSync(filter.Handle(request, kAlice, context));
  };
  const http::Response first = handle(Post("key-00000001"));
  ASSERT_EQ(first.status, 201);

  std::latch release(1);
  claims.Post([&] { release.wait(); });  // the claims' only thread, taken
  auto replay = std::async(std::launch::async, [&] { return handle(Post("key-00000001")); });
  const bool answered = replay.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  release.count_down();
  EXPECT_TRUE(answered) << "the replay waited for the claims' pool";
  const http::Response r = replay.get();
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(HeaderOf(r, "Idempotent-Replayed"), "true");
  EXPECT_EQ(r.body, first.body);
  EXPECT_EQ(op_.Executed(), 1);
  EXPECT_EQ(Metric("idem_replays_total{source=\"store\"}"), 1) << "read, not held in memory";
  EXPECT_EQ(Metric("idem_replays_total{source=\"memory\"}"), 0);
}

// A parked request polls with snapshot reads: while the first execution holds its lease, a poll
// takes no write transaction (SQLite: BEGIN IMMEDIATE, the one write lock). Once the first has
// finished, the replay comes from the read path too.
TEST_F(FilterTest, AParkedRequestPollsWithReadsNeverTheWriteLock) {
  StartBlocked(Post("key-00000001"));
  CountingStore counting(*store_);
  Engine engine(counting, *fingerprinter_, *sealer_, clock_);
  IdempotencyFilter filter(engine, pool_, monotonic_, metrics_, policy_, op_);
  const http::Request waiting = Prefer(Post("key-00000001"), "wait=10");
  http::RequestContext context = Context();
  (void)http::RunSync(filter.Handle(waiting, kAlice, context));
  ASSERT_TRUE(context.park.has_value());
  const int begins_at_park = counting.begins;  // the first decision may try to claim

  for (int attempt = 2; attempt <= 6; ++attempt) {
    monotonic_.Advance(milliseconds(500));
    clock_.Advance(Millis(500));
    context.park.reset();
    context.attempt = attempt;
    (void)http::RunSync(filter.Handle(waiting, kAlice, context));
    ASSERT_TRUE(context.park.has_value()) << "still running: parks again";
  }
  EXPECT_EQ(counting.begins, begins_at_park) << "polls of a running record take no write lock";
  EXPECT_GE(counting.reads, 5);

  ASSERT_EQ(Release().status, 201);
  context.park.reset();
  context.attempt = 7;
  const http::Response r = http::RunSync(filter.Handle(waiting, kAlice, context));
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(HeaderOf(r, "Idempotent-Replayed"), "true");
  EXPECT_EQ(counting.begins, begins_at_park) << "a finished record is replayed from a read";
}

// Once the first execution's lease has ended, a parked request's poll goes to the claim: it takes
// the operation over and executes (the write transaction is taken only then).
TEST_F(FilterTest, AParkedRequestWhoseFirstLostItsLeaseTakesOver) {
  Request first;
  first.principal = kAlice;
  first.key_header = "key-00000001";
  first.method = "POST";
  first.content_type = "application/json";
  first.api_version = policy_.api_version;
  first.body = kBody;
  auto claim = engine_->Start(policy_.route, first);  // never finished: a crashed executor
  ASSERT_TRUE(claim.has_value()) << claim.error().message;
  CountingStore counting(*store_);
  Engine engine(counting, *fingerprinter_, *sealer_, clock_);
  IdempotencyFilter filter(engine, pool_, monotonic_, metrics_, policy_, op_);
  const http::Request waiting = Prefer(Post("key-00000001"), "wait=10");
  http::RequestContext context = Context();
  (void)http::RunSync(filter.Handle(waiting, kAlice, context));
  ASSERT_TRUE(context.park.has_value());
  const int begins_at_park = counting.begins;

  clock_.Advance(kLease + Millis(1));
  monotonic_.Advance(milliseconds(1000));
  context.park.reset();
  context.attempt = 2;
  const http::Response r = http::RunSync(filter.Handle(waiting, kAlice, context));
  EXPECT_FALSE(context.park.has_value());
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(context.outcome, "executed");
  EXPECT_GT(counting.begins, begins_at_park);
  EXPECT_EQ(op_.Executed(), 1);
}

TEST_F(FilterTest, ANewKeyWithRespondAsyncIs202AndTheWorkGoesToSpawn) {
  http::RequestContext context = Context();
  const http::Response r =
      HandleWith(Prefer(Post("key-00000001"), "respond-async"), kAlice, context);

  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.body, R"({"key":"key-00000001","state":"PROCESSING"})");
  EXPECT_EQ(HeaderOf(r, "Location"), "/v1/operations/key-00000001");
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(context.outcome, "accepted");
  EXPECT_EQ(op_.Executed(), 0) << "the work runs on the spawned task, not in Handle";
  ASSERT_EQ(SpawnedCount(), 1u);
  ASSERT_TRUE(Found("key-00000001").has_value());
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kProcessing);

  http::RunSync(Spawned(0));
  EXPECT_EQ(op_.Executed(), 1);
  auto found = Found("key-00000001");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->record.state, RecordState::kSucceeded);
  ASSERT_TRUE(found->response.has_value());
  EXPECT_EQ(found->response->status, 201);
  EXPECT_EQ(found->response->body, R"({"n":1})");
  EXPECT_EQ(Notified(), std::vector<std::string>{ToHex(ScopeOf("key-00000001"))});

  const http::Response replay = Handle(Post("key-00000001"));
  EXPECT_EQ(replay.status, 201);
  EXPECT_EQ(replay.body, R"({"n":1})");
  EXPECT_EQ(HeaderOf(replay, "Idempotent-Replayed"), "true");
}

TEST_F(FilterTest, AFinalFailureIsReplayedWithoutExecutingAgain) {
  op_.execute = [](int n, Ticket&) { return Answer(402, n); };
  const http::Response first = Handle(Post("key-00000001"));
  ASSERT_EQ(first.status, 402);
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kFailedFinal);

  const http::Response again = Handle(Post("key-00000001"));
  EXPECT_EQ(again.status, 402);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(HeaderOf(again, "Idempotent-Replayed"), "true");
  EXPECT_EQ(HeaderOf(again, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(op_.Executed(), 1);
}

TEST_F(FilterTest, ARetryableFailureExecutesAgainWithTheSameKey) {
  op_.execute = [](int n, Ticket&) { return Answer(n == 1 ? 503 : 201, n); };
  const http::Response first = Handle(Post("key-00000001"));
  ASSERT_EQ(first.status, 503);
  EXPECT_EQ(HeaderOf(first, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kFailedRetryable);

  http::RequestContext context = Context();
  const http::Response again = HandleWith(Post("key-00000001"), kAlice, context);
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.body, R"({"n":2})");
  EXPECT_EQ(HeaderOf(again, "Idempotent-Replayed"), "<absent>");
  EXPECT_EQ(context.outcome, "executed");
  ASSERT_EQ(op_.Executions().size(), 2u);
  EXPECT_TRUE(op_.Executions()[1].resumed);
  EXPECT_EQ(op_.Executions()[1].record.resource_id, "thing_1") << "the same operation resumes";
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kSucceeded);
  EXPECT_EQ(Metric("idem_lease_takeovers_total"), 1);
}

// An executed operation whose answer is over the route's stored-answer cap is finished all the
// same, in its answer's state, with a small final answer kept instead (502 answer-too-large, the
// original's Location): every copy gets that, and nothing executes again, also after the lease
// has ended and under the takeover loop. Before, Finish failed with kTooLarge, the first copy got
// 413, and the record stayed PROCESSING to be taken over and executed again on every retry.
TEST_F(FilterTest, AnAnswerTooLargeToKeepFinishesTheRecordAndIsNeverExecutedAgain) {
  policy_.route.max_response_bytes = 2048;
  op_.execute = [](int n, Ticket&) {
    Execution e;
    e.response = {201, {}, std::string(4096, 'x')};
    e.response.headers.Set("Location", "/v1/things/" + std::to_string(n));
    e.response.headers.Set("Content-Type", "text/plain");
    e.business = [](StoreTxn& txn, const Record&) {
      return txn.Exec("CREATE TABLE business_done (x INTEGER)", {}).has_value()
                 ? Ok()
                 : MakeError(Errc::kInternal, "business write failed");
    };
    return e;
  };
  const http::Response first = Handle(Post("key-00000001"));
  EXPECT_EQ(first.status, 502) << first.body;
  EXPECT_EQ(TypeOf(first), "urn:idem:problem:answer-too-large");
  EXPECT_EQ(HeaderOf(first, "Location"), "/v1/things/1");
  EXPECT_EQ(HeaderOf(first, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  const std::optional<FoundRecord> found = Found("key-00000001");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->record.state, RecordState::kSucceeded) << "the work was done";
  EXPECT_TRUE(store_->Query("SELECT count(*) FROM business_done").has_value())
      << "the business writes committed with the completion";

  clock_.Advance(kLease + Millis(1));
  EXPECT_EQ(Filter().TakeOverOnce(10, {}), 0) << "nothing is left to take over";
  const http::Response again = Handle(Post("key-00000001"));
  EXPECT_EQ(again.status, 502);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(HeaderOf(again, "Idempotent-Replayed"), "true");
  EXPECT_EQ(HeaderOf(again, "Location"), "/v1/things/1");
  EXPECT_EQ(HeaderOf(again, "Content-Type"), "application/problem+json");
  EXPECT_EQ(op_.Executed(), 1);
}

// A kept header that came more than once is replayed with every value, in order. Before, the
// replay had the first value only.
TEST_F(FilterTest, AKeptHeaderWithSeveralValuesIsReplayedWithAll) {
  policy_.stored_headers = {"Link", "Content-Type"};
  op_.execute = [](int n, Ticket&) {
    Execution e = Answer(201, n);
    e.response.headers.Add("Link", "</a>; rel=a");
    e.response.headers.Add("Link", "</b>; rel=b");
    return e;
  };
  ASSERT_EQ(Handle(Post("key-00000001")).status, 201);
  const http::Response replay = Handle(Post("key-00000001"));
  ASSERT_EQ(HeaderOf(replay, "Idempotent-Replayed"), "true");
  EXPECT_EQ(replay.headers.List("link"),
            (std::vector<std::string_view>{"</a>; rel=a", "</b>; rel=b"}));
}

// A principal may bring max_new_keys_per_second requests to the claim each second (and as many
// at once after a pause); beyond, 429 at once, and no record is made. A replay of a finished key
// is not counted, another principal has its own, and a second later there is room again.
TEST_F(FilterTest, AKeyFloodIsRefusedBeforeTheClaimAndReplaysAreNotCounted) {
  policy_.max_new_keys_per_second = 3;
  for (int i = 1; i <= 3; ++i) {
    ASSERT_EQ(Handle(Post("flood-key-" + std::to_string(i))).status, 201);
  }
  const http::Response refused = Handle(Post("flood-key-4"));
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(TypeOf(refused), "urn:idem:problem:quota-exceeded");
  EXPECT_EQ(HeaderOf(refused, "Retry-After"), "1");
  EXPECT_EQ(Records(), 3) << "a refused request made no record";
  EXPECT_EQ(Requests("quota"), 1);

  const http::Response replay = Handle(Post("flood-key-1"));
  EXPECT_EQ(replay.status, 201);
  EXPECT_EQ(HeaderOf(replay, "Idempotent-Replayed"), "true");
  EXPECT_EQ(Handle(Post("flood-key-5", kBody), kBob).status, 201) << "bob has his own";

  monotonic_.Advance(Millis(334));  // a third of a second: one token
  EXPECT_EQ(Handle(Post("flood-key-4")).status, 201);
  EXPECT_EQ(Handle(Post("flood-key-6")).status, 429);
  EXPECT_EQ(op_.Executed(), 5);
}

// Duplicates of a running operation are answered from a snapshot read, in progress, and take no
// token: retries of one slow payment (a client's Prefer: wait flood) never crowd its principal's
// new keys out, however many there are.
TEST_F(FilterTest, DuplicatesOfARunningOperationAreNotCountedAgainstTheRateOfNewKeys) {
  policy_.max_new_keys_per_second = 3;
  StartBlocked(Post("key-00000001"));
  for (int i = 0; i < 10; ++i) {
    const http::Response duplicate = Handle(Post("key-00000001"));
    ASSERT_EQ(duplicate.status, 409) << "duplicate " << i << ": " << duplicate.body;
    EXPECT_EQ(TypeOf(duplicate), "urn:idem:problem:request-in-progress");
  }
  EXPECT_EQ(Requests("quota"), 0);
  EXPECT_EQ(Handle(Post("key-00000002")).status, 201);
  EXPECT_EQ(Handle(Post("key-00000003")).status, 201);
  EXPECT_EQ(Handle(Post("key-00000004")).status, 429) << "the first claim took a token";
  EXPECT_EQ(Release().status, 201);
  EXPECT_EQ(op_.Executed(), 3);
}

TEST_F(FilterTest, AnExecutionsStateOverridesThePolicy) {
  // A 503 declared final is replayed; a 201 declared retryable executes again.
  op_.execute = [](int n, Ticket&) {
    Execution e = Answer(503, n);
    e.state = RecordState::kFailedFinal;
    return e;
  };
  ASSERT_EQ(Handle(Post("key-00000001")).status, 503);
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kFailedFinal);
  const http::Response replay = Handle(Post("key-00000001"));
  EXPECT_EQ(replay.status, 503);
  EXPECT_EQ(HeaderOf(replay, "Idempotent-Replayed"), "true");
  EXPECT_EQ(op_.Executed(), 1);

  op_.execute = [](int n, Ticket&) {
    Execution e = Answer(201, n);
    e.state = RecordState::kFailedRetryable;
    return e;
  };
  ASSERT_EQ(Handle(Post("key-00000002")).status, 201);
  EXPECT_EQ(Found("key-00000002")->record.state, RecordState::kFailedRetryable);
  const http::Response again = Handle(Post("key-00000002"));
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.body, R"({"n":3})");
  EXPECT_EQ(HeaderOf(again, "Idempotent-Replayed"), "<absent>");
  EXPECT_EQ(op_.Executed(), 3);
}

TEST_F(FilterTest, AnUnknownOutcomeKeepsTheRecordProcessingAndTheNextRequestResumes) {
  op_.execute = [](int n, Ticket&) {
    Execution e = Answer(n == 1 ? 504 : 201, n);
    e.outcome_unknown = n == 1;
    return e;
  };
  const http::Response first = Handle(Post("key-00000001"));
  EXPECT_EQ(first.status, 504);
  EXPECT_EQ(HeaderOf(first, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  auto found = Found("key-00000001");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->record.state, RecordState::kProcessing);
  EXPECT_EQ(found->record.recovery_point, "claimed");
  EXPECT_LE(found->record.lease.until, clock_.Now()) << "the lease is released, not left to run";
  EXPECT_FALSE(found->response.has_value());

  clock_.Advance(Millis(1));  // far less than the 10 s lease
  http::RequestContext context = Context();
  const http::Response again = HandleWith(Post("key-00000001"), kAlice, context);
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.body, R"({"n":2})");
  EXPECT_EQ(context.outcome, "executed");
  ASSERT_EQ(op_.Executions().size(), 2u);
  EXPECT_TRUE(op_.Executions()[1].resumed);
  EXPECT_EQ(op_.Executions()[1].record.recovery_point, "claimed");
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kSucceeded);
}

// Engine::Release promises the next attempt "takes over at once". It sets the lease's end to now,
// while a live lease is one whose end is >= now, so a retry in the same millisecond (a parked
// duplicate woken by the release's notification) is told 409 instead of executing.
TEST_F(FilterTest, AnUnknownOutcomeReleasesTheLeaseForARetryInTheSameMillisecond) {
  op_.execute = [](int n, Ticket&) {
    Execution e = Answer(n == 1 ? 504 : 201, n);
    e.outcome_unknown = n == 1;
    return e;
  };
  ASSERT_EQ(Handle(Post("key-00000001")).status, 504);
  const http::Response again = Handle(Post("key-00000001"));
  EXPECT_EQ(again.status, 201) << TypeOf(again);
  EXPECT_EQ(op_.Executed(), 2);
}

TEST_F(FilterTest, ASecondKeyOverTheProcessingQuotaIs429) {
  policy_.route.max_processing = 1;
  StartBlocked(Post("key-00000001"));
  http::RequestContext context = Context();
  const http::Response r = HandleWith(Post("key-00000002"), kAlice, context);

  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(TypeOf(r), "urn:idem:problem:quota-exceeded");
  EXPECT_EQ(HeaderOf(r, "Retry-After"), "1");
  EXPECT_EQ(context.outcome, "quota");
  EXPECT_FALSE(Found("key-00000002").has_value()) << "the refused claim is rolled back";
  // Another principal has its own quota.
  EXPECT_EQ(Handle(Post("key-00000002"), kBob).status, 201);

  EXPECT_EQ(Release().status, 201);
  EXPECT_EQ(Handle(Post("key-00000002")).status, 201) << "under the quota again";
}

TEST_F(FilterTest, AFencedExecutorAnswersWithTheWinnersStoredAnswer) {
  http::Response second;
  op_.execute = [&](int n, Ticket&) {
    if (n == 1) {
      // The first execution stalls past its lease; a retry takes over and finishes.
      clock_.Advance(kLease + Millis(1));
      http::RequestContext context = Context();
      second = HandleWith(Post("key-00000001"), kAlice, context);
    }
    return Answer(201, n);
  };
  const http::Response first = Handle(Post("key-00000001"));

  EXPECT_EQ(second.status, 201);
  EXPECT_EQ(second.body, R"({"n":2})");
  EXPECT_EQ(first.status, second.status);
  EXPECT_EQ(first.body, second.body) << "both clients must get the winner's bytes";
  EXPECT_EQ(HeaderOf(first, "Location"), "/v1/things/2");
  EXPECT_EQ(HeaderOf(first, "Idempotent-Replayed"), "true");
  EXPECT_EQ(HeaderOf(first, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  ASSERT_EQ(op_.Executions().size(), 2u);
  EXPECT_TRUE(op_.Executions()[1].resumed);
  EXPECT_EQ(op_.Executions()[1].lease.fence, op_.Executions()[0].lease.fence + 1);
  auto found = Found("key-00000001");
  ASSERT_TRUE(found && found->response);
  EXPECT_EQ(found->response->body, R"({"n":2})");
  EXPECT_EQ(Metric("idem_fencing_rejections_total"), 1);
  EXPECT_EQ(Metric("idem_lease_takeovers_total"), 1);
}

// A fenced executor whose winner is still running answers request-in-progress: a 409 for a running
// key, which docs/idemd.md says carries Retry-After and Location: /v1/operations/{key}.
TEST_F(FilterTest, AFencedExecutorWhoseWinnerStillRunsAnswers409WithLocation) {
  op_.execute = [&](int n, Ticket&) {
    if (n == 1) {
      clock_.Advance(kLease + Millis(1));
      auto stale = engine_->ListStale(policy_.route, 10);
      EXPECT_TRUE(stale && stale->size() == 1u);
      if (stale && !stale->empty()) {
        EXPECT_TRUE(engine_->TakeOver(policy_.route, (*stale)[0]).has_value());
      }
    }
    return Answer(201, n);
  };
  const http::Response r = Handle(Post("key-00000001"));

  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(TypeOf(r), "urn:idem:problem:request-in-progress");
  EXPECT_EQ(HeaderOf(r, "Retry-After"), "1");
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(Metric("idem_fencing_rejections_total"), 1);
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kProcessing)
      << "the loser wrote nothing";
  EXPECT_EQ(HeaderOf(r, "Location"), "/v1/operations/key-00000001");
}

TEST_F(FilterTest, GetOperationShowsTheCallersOwnRecord) {
  const std::string created = http::Rfc3339(ToUnixMillis(t0_));
  const std::string expires = http::Rfc3339(ToUnixMillis(t0_ + kRetention));
  StartBlocked(Post("key-00000001"));
  http::Response running = Filter().GetOperation("key-00000001", kAlice);
  EXPECT_EQ(running.status, 200);
  EXPECT_EQ(HeaderOf(running, "Content-Type"), "application/json");
  EXPECT_EQ(HeaderOf(running, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(running.body,
            R"({"key":"key-00000001","state":"PROCESSING","recovery_point":"claimed",)"
            R"("status_code":null,"created_at":")" +
                created + R"(","expires_at":")" + expires + R"("})");

  ASSERT_EQ(Release().status, 201);
  clock_.Advance(Millis(1000));
  // The key is parsed as the header is: an sf-string names the same record.
  const http::Response done = Filter().GetOperation("\"key-00000001\"", kAlice);
  EXPECT_EQ(done.status, 200);
  EXPECT_EQ(HeaderOf(done, "Idempotency-Key-Expires"), ExpiresFor(t0_));
  EXPECT_EQ(done.body, R"({"key":"key-00000001","state":"SUCCEEDED","recovery_point":"done",)"
                       R"("status_code":201,"response":{"n":1},"created_at":")" +
                           created + R"(","expires_at":")" + expires + R"("})");

  // A retryable failure shows its status but no response.
  op_.execute = [](int n, Ticket&) { return Answer(503, n); };
  ASSERT_EQ(Handle(Post("key-00000002")).status, 503);
  const json::value failed = json::parse(Filter().GetOperation("key-00000002", kAlice).body);
  EXPECT_EQ(failed.at("state").as_string(), "FAILED_RETRYABLE");
  EXPECT_EQ(failed.at("status_code").as_int64(), 503);
  EXPECT_FALSE(failed.as_object().contains("response"));
}

TEST_F(FilterTest, GetOperationAnswers404ForOthersAndUnknownKeysAnd400ForMalformedOnes) {
  ASSERT_EQ(Handle(Post("key-00000001")).status, 201);

  const http::Response other = Filter().GetOperation("key-00000001", kBob);
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(TypeOf(other), "urn:idem:problem:not-found");
  EXPECT_EQ(other.body.find("n\":1"), std::string::npos) << "nothing of alice's answer leaks";

  const http::Response unknown = Filter().GetOperation("key-99999999", kAlice);
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(TypeOf(unknown), "urn:idem:problem:not-found");

  const http::Response malformed = Filter().GetOperation("bad key!", kAlice);
  EXPECT_EQ(malformed.status, 400);
  EXPECT_EQ(TypeOf(malformed), "urn:idem:problem:invalid-request");

  // Past its expiry the key is no longer recognised.
  clock_.Advance(kRetention);
  const http::Response expired = Filter().GetOperation("key-00000001", kAlice);
  EXPECT_EQ(expired.status, 404);
  EXPECT_EQ(TypeOf(expired), "urn:idem:problem:not-found");
}

// A request of `who` for `key` on `route`, as the filter would start it.
Request EngineRequest(const Principal& who, std::string_view key) {
  Request r;
  r.principal = who;
  r.key_header = key;
  r.method = "POST";
  r.content_type = "application/json";
  r.api_version = "v1";
  r.body = kBody;
  return r;
}

TEST_F(FilterTest, TakeOverOnceResolvesStaleRecordsOfItsOwnRouteOnly) {
  // This route: an unknown outcome left the record PROCESSING at "claimed".
  op_.execute = [](int n, Ticket&) {
    Execution e = Answer(504, n);
    e.outcome_unknown = true;
    return e;
  };
  ASSERT_EQ(Handle(Post("key-00000001")).status, 504);
  // Another route: a claim whose executor crashed.
  RoutePolicy other = policy_.route;
  other.route = "others.create";
  auto crashed = engine_->Start(other, EngineRequest(kAlice, "key-00000001"));
  ASSERT_TRUE(crashed && crashed->kind == Decision::Kind::kExecute);
  clock_.Advance(kLease + Millis(1));

  std::vector<std::string> woken;
  const int resolved =
      Filter().TakeOverOnce(10, [&](const std::string& key) { woken.push_back(key); });

  EXPECT_EQ(resolved, 1);
  ASSERT_EQ(op_.Reconciled().size(), 1u);
  const Ticket ticket = op_.Reconciled()[0];
  EXPECT_EQ(ticket.scope, ScopeOf("key-00000001"));
  EXPECT_TRUE(ticket.resumed);
  EXPECT_EQ(ticket.record.recovery_point, "claimed");
  EXPECT_EQ(ticket.record.resource_id, "thing_1");
  EXPECT_EQ(woken, std::vector<std::string>{ToHex(ScopeOf("key-00000001"))});
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kSucceeded);
  EXPECT_EQ(Metric("idem_reconciler_records_total{result=\"resolved\"}"), 1);
  EXPECT_EQ(Metric("idem_lease_takeovers_total"), 1);
  EXPECT_EQ(Metric("idem_reconciler_runs_total"), 1);
  EXPECT_EQ(Metric("idem_reconciler_run_failures_total"), 0);

  auto left = engine_->Lookup(crashed->ticket.scope);
  ASSERT_TRUE(left && *left);
  EXPECT_EQ((*left)->record.state, RecordState::kProcessing);
  EXPECT_EQ((*left)->record.lease.fence, crashed->ticket.lease.fence) << "not taken over";

  // The client's retry gets the reconciled answer.
  const http::Response retry = Handle(Post("key-00000001"));
  EXPECT_EQ(retry.status, 201);
  EXPECT_EQ(retry.body, R"({"n":99})");
  EXPECT_EQ(HeaderOf(retry, "Idempotent-Replayed"), "true");
  EXPECT_EQ(op_.Executed(), 1);
}

// A pass whose store refuses to list the stale records, or to settle one it took over, is a
// failed run (what idem_reconciler_run_failures_total alerts on); a record another instance took
// first is not a failure.
TEST_F(FilterTest, TakeOverOnceCountsAPassTheStoreRefusedAsAFailedRun) {
  auto claimed = engine_->Start(policy_.route, EngineRequest(kAlice, "key-00000001"));
  ASSERT_TRUE(claimed && claimed->kind == Decision::Kind::kExecute);
  clock_.Advance(kLease + Millis(1));
  using testing::Fault;
  using testing::FaultPlan;
  testing::FaultyStoreOptions faults;
  faults.plan = FaultPlan::FailNthOf(StoreOperation::kListStale, 1, Fault::FailBefore());
  testing::FaultyStore faulty(*store_, faults);
  Engine engine(faulty, *fingerprinter_, *sealer_, clock_);
  IdempotencyFilter filter(engine, pool_, monotonic_, metrics_, policy_, op_);

  EXPECT_EQ(filter.TakeOverOnce(10, {}), 0);
  EXPECT_EQ(Metric("idem_reconciler_runs_total"), 1);
  EXPECT_EQ(Metric("idem_reconciler_run_failures_total"), 1);
  EXPECT_TRUE(op_.Reconciled().empty());

  // The second pass lists it, but the completion's commit fails: still a failed run.
  faulty.SetPlan(FaultPlan::FailNthOf(StoreOperation::kFinish, 1, Fault::FailBefore()));
  EXPECT_EQ(filter.TakeOverOnce(10, {}), 1) << "resolved by the operation, not recorded";
  EXPECT_EQ(Metric("idem_reconciler_runs_total"), 2);
  EXPECT_EQ(Metric("idem_reconciler_run_failures_total"), 2);

  // A clean pass.
  faulty.SetPlan(FaultPlan());
  clock_.Advance(kLease + Millis(1));
  EXPECT_EQ(filter.TakeOverOnce(10, {}), 1);
  EXPECT_EQ(Metric("idem_reconciler_runs_total"), 3);
  EXPECT_EQ(Metric("idem_reconciler_run_failures_total"), 2);
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kSucceeded);
}

TEST_F(FilterTest, TakeOverOnceLeavesAnUnknownOutcomeForLater) {
  auto claimed = engine_->Start(policy_.route, EngineRequest(kAlice, "key-00000001"));
  ASSERT_TRUE(claimed && claimed->kind == Decision::Kind::kExecute);
  clock_.Advance(kLease + Millis(1));
  op_.reconcile = [](Ticket&) {
    Execution e;
    e.outcome_unknown = true;
    return e;
  };

  EXPECT_EQ(Filter().TakeOverOnce(10, {}), 0);
  EXPECT_EQ(op_.Reconciled().size(), 1u);
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kProcessing);
  EXPECT_EQ(Metric("idem_reconciler_records_total{result=\"unknown\"}"), 1);

  // Released: the next pass (a millisecond on) tries again.
  clock_.Advance(Millis(1));
  op_.reconcile = {};
  EXPECT_EQ(Filter().TakeOverOnce(10, {}), 1);
  EXPECT_EQ(op_.Reconciled().size(), 2u);
  EXPECT_EQ(Found("key-00000001")->record.state, RecordState::kSucceeded);
}

// The takeover loop resolves a route's stale records side by side, kTakeoverConcurrency at once: a
// downstream that stalls until its timeout on every lookup holds each pass up for about one
// timeout per kTakeoverConcurrency records, never one per record. Here each TakeOver waits
// until all of them have started (a stalled provider that answers only then); one at a time,
// the first would wait its whole bound and the pass would find each record alone.
TEST_F(FilterTest, TakeOverOnceResolvesStaleRecordsSideBySide) {
  constexpr int kRecords = static_cast<int>(kTakeoverConcurrency);
  for (int i = 0; i < kRecords; ++i) {
    auto claimed =
        engine_->Start(policy_.route, EngineRequest(kAlice, "key-side-" + std::to_string(i)));
    ASSERT_TRUE(claimed && claimed->kind == Decision::Kind::kExecute);
  }
  clock_.Advance(kLease + Millis(1));
  Mutex mu;
  CondVar all_in;
  int started = 0;  // both under mu (a local takes no GUARDED_BY)
  int alone = 0;
  op_.reconcile = [&](Ticket& ticket) {
    MutexLock lock(mu);
    ++started;
    all_in.NotifyAll();
    if (!all_in.WaitFor(mu, std::chrono::seconds(10), [&] { return started == kRecords; })) {
      ++alone;
    }
    return Answer(201, static_cast<int>(ticket.record.resource_id.size()));
  };
  EXPECT_EQ(Filter().TakeOverOnce(100, {}), kRecords);
  EXPECT_EQ(alone, 0) << "the stale records were resolved one after another";
  EXPECT_EQ(Metric("idem_reconciler_records_total{result=\"resolved\"}"), kRecords);
}

TEST(RunConcurrentlyTest, CallsEveryIndexOnceOnAtMostWidthThreads) {
  Mutex mu;
  std::vector<int> calls(50, 0);
  std::set<std::thread::id> threads;
  RunConcurrently(50, 4, [&](std::size_t i) {
    MutexLock lock(mu);
    ++calls[i];
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(std::count(calls.begin(), calls.end(), 1), 50);
  EXPECT_LE(threads.size(), 4u);
  RunConcurrently(0, 4, [&](std::size_t) { ADD_FAILURE() << "called for nothing"; });
}

// TakeOverOnce promises up to `limit` stale records *of this route*, but it takes the `limit`
// oldest stale records of every route and skips the others': stale records of another route that
// this filter never resolves keep the head of the list, and its own are never reached.
TEST_F(FilterTest, TakeOverOnceIsNotStarvedByAnotherRoutesStaleRecords) {
  RoutePolicy other = policy_.route;
  other.route = "others.create";
  ASSERT_TRUE(engine_->Start(other, EngineRequest(kAlice, "key-00000001")));
  clock_.Advance(Millis(1));
  ASSERT_TRUE(engine_->Start(policy_.route, EngineRequest(kAlice, "key-00000002")));
  clock_.Advance(kLease + Millis(1));

  int resolved = 0;
  for (int pass = 0; pass < 3; ++pass) resolved += Filter().TakeOverOnce(1, {});
  EXPECT_EQ(resolved, 1);
  EXPECT_EQ(Found("key-00000002")->record.state, RecordState::kSucceeded);
}

}  // namespace
}  // namespace idem::idemd
