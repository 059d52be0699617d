// tests/sim/sim.cc — the deterministic simulator (docs/testing.md): idemd's payments route and a
// gateway route as they ship — the idempotency filter, the payments operation and its charge
// steps, the gateway's forward steps, the engine, the heartbeat, the takeover loop and the books
// — on a real SQLite database (or, gateway only, the in-memory reference store), run by several
// instances in simulated time, each on an event loop the simulator steps, against a simulated
// provider and upstream that fail in every way their contracts allow (sim_provider.h,
// sim_upstream.h). Clients retry one payment each (some orders under two keys, some keys sent
// twice at once, some asking to wait or to be answered 202); instances crash, pause, see their
// wall clocks step and their clocks drift; the store fails, stalls and loses commit answers
// (testing/faulty_store.h); the in-flight markers fail and vanish (sim_markers.h). One seed fixes
// the whole schedule; invariants are checked after every step and at the end. A failure prints
// `reproduce: idem_sim --seed=N` and the schedule's trace.
//
//   idem_sim --seed=N [--schedules=K] [--seconds=S] [--without=FIX,...] [--expect-failure]
//            [--twice] [--jobs=N] [--store=sqlite|memory] [--verbose]
#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "http/async.h"
#include "http/log.h"
#include "idem/engine.h"
#include "idem/failpoint.h"
#include "idem/mutex.h"
#include "idem/outbox.h"
#include "idem/store/replay_cache.h"
#include "idem/store/sqlite.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/gateway/proxy.h"
#include "server/idemd/metrics.h"
#include "server/idemd/payments/books.h"
#include "server/idemd/payments/payments.h"
#include "server/idemd/payments/table.h"
#include "server/idemd/routes.h"
#include "testing/fakes.h"
#include "testing/faulty_store.h"
#include "testing/memory_store.h"
#include "tests/sim/sim_markers.h"
#include "tests/sim/sim_provider.h"
#include "tests/sim/sim_upstream.h"

// Every timer of this binary runs on simulated time, and the simulator's event loops look at
// their timers on every poll (http::SetTimerClock). Asio's reactor re-arms its timerfd for that on
// every poll, a system call that took a sixth of the simulator's time; without a timerfd it
// checks its timers in the poll itself. So this binary has none.
// NOLINTNEXTLINE(readability-identifier-naming): libc's name
extern "C" int timerfd_create(int /*clockid*/, int /*flags*/) noexcept {
  errno = ENOSYS;
  return -1;
}

namespace idem::sim {
namespace {

namespace json = boost::json;
using testing::FakeClock;
using testing::FakeMonotonicClock;
using testing::FaultPlan;
using testing::FaultyStore;
using testing::SeededRandom;
using testing::TempDir;

constexpr Millis kLease{3000};
constexpr Millis kTimeout{1000};  // the provider call's deadline
constexpr Millis kMargin{500};
constexpr Millis kLandsWithin{2400};  // the longest a charge takes to land after it left
constexpr Millis kSettle{3000};
static_assert(kSettle > kMargin + kLandsWithin);
constexpr Millis kClientTimeout{4000};  // a client gives an attempt up after this
constexpr Millis kListedWithin{3000};   // the longest the provider's listing takes to show a charge
// The books ([reconciliation]): each run looks at an hour, more than a schedule lasts, so every
// charge is walked again by every run (as the default day does with runs ten minutes apart); the
// lag leaves alone what the listing may not show yet.
constexpr Millis kBooksWindow{3'600'000};
constexpr Millis kBooksLag{5000};
static_assert(kBooksLag > kListedWithin);
constexpr Millis kOrphanGrace{20'000};
constexpr Millis kMaxSkew{10'000};        // how far an instance's wall clock steps from the world's
constexpr int64_t kMaxDriftPpm = 20'000;  // how fast or slow an instance's clocks run, at most
constexpr std::string_view kAmount = "10.00";
// Short, so that keys expire within a schedule and begin new operations; longer than any request
// stays in flight (a few pauses of an instance), so none reaches its record after it expired.
constexpr Millis kGatewayRetention{60'000};
constexpr std::size_t kGatewayMaxStored = 2048;

struct Options {
  uint64_t seed = 1;
  int schedules = 1;
  double seconds = 0;  // when > 0, run schedules until this much wall time has passed
  bool verbose = false;
  // Fixes taken back, to show that the simulator finds what each prevents: "settle" (the provider
  // is configured to settle at once: [provider] settle_ms = 0) and kRevertibleFixes.
  std::string without;
  bool expect_failure = false;
  // Runs each schedule twice and requires the same trace: the schedule is a function of its seed.
  bool twice = false;
  int jobs = 1;         // schedules run on this many threads at once
  bool memory = false;  // on the in-memory reference store (gateway operations only)
};

// How fast an instance's oscillator runs against the world's, in parts per million: both of its
// clocks drift by it.
template <class Duration>
Duration Drifted(Duration elapsed, int64_t ppm) {
  return elapsed + elapsed * ppm / 1'000'000;
}

// An instance's wall clock: the world's time plus this instance's skew, which steps now and then
// (an NTP step, an operator) and drifts in between. The store's clock (the database server's) is
// the world's; decisions about a record must not depend on an instance's.
class InstanceClock final : public Clock {
 public:
  InstanceClock(const FakeClock& world, int64_t drift_ppm)
      : world_(world), drift_ppm_(drift_ppm), since_(world.Now()) {}
  Timestamp Now() const override {
    return since_ + skew_ + Drifted(world_.Now() - since_, drift_ppm_);
  }
  // Steps the clock to `skew` from the world's now.
  void Set(Millis skew) {
    skew_ = skew;
    since_ = world_.Now();
  }
  Millis Skew() const { return std::chrono::duration_cast<Millis>(Now() - world_.Now()); }

 private:
  const FakeClock& world_;
  const int64_t drift_ppm_;
  Timestamp since_;
  Millis skew_{0};
};

// An instance's monotonic clock: the world's, running fast or slow by the instance's drift. Its
// leases' deadlines and its timers are measured by it.
class InstanceMonotonicClock final : public MonotonicClock {
 public:
  InstanceMonotonicClock(const FakeMonotonicClock& world, int64_t drift_ppm)
      : world_(world), drift_ppm_(drift_ppm), base_(world.Now()) {}
  SteadyTime Now() const override { return base_ + Drifted(world_.Now() - base_, drift_ppm_); }

 private:
  const FakeMonotonicClock& world_;
  const int64_t drift_ppm_;
  const SteadyTime base_;
};

// The monotonic clock of the instance whose code runs now (Schedule::Acting): a downstream
// judges its caller's deadlines by it.
class ActingMonotonicClock final : public MonotonicClock {
 public:
  explicit ActingMonotonicClock(const MonotonicClock& world) : clock_(&world) {}
  void Set(const MonotonicClock* clock) { clock_ = clock; }
  SteadyTime Now() const override { return clock_->Now(); }

 private:
  const MonotonicClock* clock_;
};

// One idemd process: what main.cc builds for the payments route, on an event loop of its own
// that the simulator steps. A crash destroys it, loop first (every request it was serving dies
// with it); a restart builds it again.
struct Instance {
  const int64_t drift_ppm;
  InstanceClock clock;
  InstanceMonotonicClock monotonic;
  std::unique_ptr<http::BlockingPool> pool;
  // The store as this instance sees it: through its own replay cache, when it has one.
  std::unique_ptr<Store> store;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<idemd::Metrics> metrics;
  std::unique_ptr<idemd::Payments> payments;
  std::unique_ptr<idemd::IdempotencyFilter> filter;
  std::unique_ptr<idemd::ProxyOperation> proxy;  // the gateway route
  std::unique_ptr<idemd::IdempotencyFilter> gateway;
  std::unique_ptr<idemd::Reconciliation> books;
  std::unique_ptr<http::EventLoop> loop;  // last: destroyed first
  SteadyTime paused_until{};
  int generation = 0;

  Instance(const FakeClock& world, const FakeMonotonicClock& world_monotonic, int64_t drift)
      : drift_ppm(drift), clock(world, drift), monotonic(world_monotonic, drift) {}
};

// A client's request in flight; shared with the coroutine that serves it, which may outlive the
// client's patience or die with its instance.
struct Call {
  int id = 0;
  int key = 0;
  int instance = 0;
  int generation = 0;
  SteadyTime sent{};
  bool given_up = false;
  std::optional<http::Response> answer;
};

// One Idempotency-Key, of a merchant order's payment or of a gateway operation, and what its client
// has learnt.
struct Key {
  std::string key;
  bool gateway = false;
  int order = 0;   // a payment's: its merchant order
  std::string op;  // a gateway operation's: its id, in the body; a new one after expiry
  ScopeHash scope{};
  std::optional<http::Response> final;  // the first final answer
  SteadyTime retry_at{};
  int in_flight = 0;
};

struct Order {
  std::string merchant_order_no;
  std::vector<int> keys;
};

// The charge a success answer names, or "" when it names none.
std::string ChargeOf(const http::Response& r) { return StringMember(r.body, "provider_charge_id"); }
// The provider_charge_id of the payment an outbox event's payload carries; "" when it has none.
std::string ChargeOfEvent(const std::string& payload) {
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(payload, ec);
  const boost::json::value* charge =
      ec ? nullptr : v.find_pointer("/payment/provider_charge_id", ec);
  return charge != nullptr && charge->is_string() ? std::string(charge->as_string()) : "";
}

// Whether an answer ends the client's retries: a success, a decline, a conflict of the order; on
// the gateway route a 2xx but a 202 (respond-async: it runs on), or a final 502 (the answer too
// large to keep, an outcome held).
bool IsFinal(const Key& key, const http::Response& r) {
  if (key.gateway) {
    const std::string type = StringMember(r.body, "type");
    return (r.status >= 200 && r.status < 300 && r.status != 202) ||
           (r.status == 502 && (type == "urn:idem:problem:answer-too-large" ||
                                type == "urn:idem:problem:upstream-outcome-unknown"));
  }
  return r.status == 200 || r.status == 201 || r.status == 402 ||
         (r.status == 409 && r.body.find("order-conflict") != std::string::npos);
}

// A request's Prefer header, by a draw in 0..7: mostly none; wait 1-3 s; respond-async.
std::string PreferOf(uint64_t draw) {
  if (draw >= 5) return "";
  if (draw == 4) return "respond-async";
  return "wait=" + std::to_string(1 + draw % 3);
}

// The gateway operation a 2xx answer names ({"op": ...}), or "".
std::string OpOf(const http::Response& r) { return StringMember(r.body, "op"); }

// What idemd's server does with a request (http/server.cc's Run): calls the filter, and while it
// parks the request (Prefer: wait) waits for the park's deadline or a poll, doubling from 50 ms
// to 1 s, by the instance's clock, then calls it again; work answered 202 already
// (Prefer: respond-async) goes on on the instance's loop.
http::Async<void> Serve(idemd::IdempotencyFilter& filter, http::EventLoop& loop,
                        const MonotonicClock& monotonic, http::Request request, Principal principal,
                        std::shared_ptr<Call> call) {
  http::RequestContext context;
  context.spawn = [&loop](std::function<http::Async<void>()> task) { loop.Spawn(task()); };
  context.notify = [](const std::string&) {};  // a parked request finds it by polling
  context.reserve_park = [] { return true; };
  Millis poll{50};
  for (;;) {
    http::Response answer = co_await filter.Handle(request, principal, context);
    if (!context.park) {
      call->answer = std::move(answer);
      co_return;
    }
    const SteadyTime wake = std::min(context.park->deadline, monotonic.Now() + poll);
    context.park.reset();
    ++context.attempt;
    poll = std::min(poll * 2, Millis(1000));
    co_await http::SleepFor(std::chrono::ceil<Millis>(wake - monotonic.Now()));
  }
}

class Schedule {
 public:
  // `settle` and `late_execution`: whether idemd is configured for a provider and an upstream
  // that may still execute a request after it timed out ([provider] settle_ms, a route's
  // late_execution_ms), as an operator configures it for these. `memory`: on the in-memory
  // reference store, which runs no SQL: gateway operations only, no payments, no books.
  Schedule(uint64_t seed, const std::string& dir, bool settle, bool late_execution, bool memory,
           std::string reproduce)
      : reproduce_(std::move(reproduce)),
        dir_(dir),
        settle_(settle),
        late_execution_(late_execution),
        memory_(memory),
        seed_(seed),
        rng_(seed),
        random_(seed ^ 0x9e3779b97f4a7c15ULL) {}

  ~Schedule() {
    instances_.clear();  // their loops and engines before the store
    http::SetTimerClock(nullptr);
    http::SetLogSink(nullptr);
  }

  const std::vector<std::string>& Trace() const { return trace_; }
  // What a failed schedule prints: its trace (unless it was printed as it ran) and how to
  // run it again.
  std::string Report() const {
    std::string out = "FAILED seed " + std::to_string(seed_) + "\n";
    if (!verbose_) {
      for (const std::string& line : trace_) out += "  " + line + "\n";
    }
    return out + "reproduce: " + reproduce_ + " --seed=" + std::to_string(seed_) + "\n";
  }

  // Runs the schedule; returns false (after printing why) when an invariant broke.
  bool Run(bool verbose) {
    verbose_ = verbose;
    http::SetTimerClock(&monotonic_);
    http::SetLogSink(&log_sink_);
    if (!Open()) return false;
    const int orders = memory_ ? 0 : 1 + static_cast<int>(rng_() % 4);
    for (int o = 0; o < orders; ++o) {
      orders_.push_back({"order-" + std::to_string(o), {}});
      const int keys = rng_() % 4 == 0 ? 2 : 1;  // a second client pays the same order
      for (int k = 0; k < keys; ++k) {
        Key key;
        key.key = "sim-key-" + std::to_string(o) + "-" + std::to_string(k) + "-0000000000";
        key.order = o;
        key.scope =
            *Scope{"acme", "alice", std::string(idemd::kPaymentsCreateRoute), key.key}.Hash();
        orders_.back().keys.push_back(static_cast<int>(keys_.size()));
        keys_.push_back(std::move(key));
      }
    }
    // Gateway operations: none to three, each under a key of its own.
    const int operations =
        memory_ ? 1 + static_cast<int>(rng_() % 3) : static_cast<int>(rng_() % 4);
    next_op_ = static_cast<int>(rng_() % 10);
    for (int g = 0; g < operations; ++g) {
      Key key;
      key.key = "sim-gw-key-" + std::to_string(g) + "-0000000000";
      key.gateway = true;
      key.op = "op-" + std::to_string(next_op_++);
      key.scope = *Scope{"acme", "alice", route_.RouteId(), key.key}.Hash();
      keys_.push_back(std::move(key));
    }
    // A burst of requests: each key, some twice at once.
    for (std::size_t k = 0; k < keys_.size(); ++k) {
      Send(static_cast<int>(k));
      if (rng_() % 3 == 0) Send(static_cast<int>(k));
    }
    const int steps = 60 + static_cast<int>(rng_() % 240);
    for (int i = 0; i < steps && ok_; ++i) Tick(/*faults=*/true);
    faulty_->SetPlan(FaultPlan());
    provider_->SetFaults(false);
    upstream_->SetFaults(false);
    if (markers_) markers_->SetFaults(false);
    Log("faults stop");
    // Faults stop; time passes; clients keep retrying and the takeover loop runs until every key
    // has its final answer. A key still unanswered after that is blocked forever.
    Settle();
    // Past the gateway route's retention its keys are free: some clients begin a new operation
    // under the key they used before, which the upstream must execute as the new one it is.
    if (ok_ && AllFinal() &&
        std::any_of(keys_.begin(), keys_.end(), [](const Key& k) { return k.gateway; })) {
      Settle(/*drain=*/true);  // no earlier request reaches a record after it expired
      // Just past the last record's expiry: a replay kept anywhere longer than its record lives
      // would answer the new operation with the old one's answer.
      Timestamp last = world_.Now();
      for (const Key& key : keys_) {
        if (!key.gateway) continue;
        auto r = store_->Read(key.scope);
        if (r && *r) last = std::max(last, (*r)->expires_at);
      }
      Advance(std::chrono::duration_cast<Millis>(last - world_.Now()) +
              Millis(static_cast<int64_t>(1 + rng_() % 200)));
      for (std::size_t k = 0; k < keys_.size(); ++k) {
        Key& key = keys_[k];
        if (!key.gateway || !Expired(key) || rng_() % 2 == 0) continue;
        done_.push_back(key);
        key.op = "op-" + std::to_string(next_op_++);
        key.final.reset();
        Log(key.key + " expired; its client begins " + key.op + " under it");
        Send(static_cast<int>(k));
      }
      Settle();
    }
    if (ok_) CheckEnd();
    return ok_;
  }

 private:
  bool Open() {
    if (memory_) {
      store_ = testing::MakeMemoryStore(world_, random_);
    } else if (!OpenSqlite()) {
      return false;
    }
    // Store faults by the seed: calls that fail, commits that land but report failure, and
    // delays that move time on in the middle of a call (a slow commit).
    const double store_faults = rng_() % 3 == 0 ? 0.0 : 0.01 * static_cast<double>(1 + rng_() % 5);
    faulty_ = std::make_unique<FaultyStore>(
        *store_,
        testing::FaultyStoreOptions{
            .plan = FaultPlan::FromSeed(rng_(), store_faults, kLease),
            .clock = &world_,
            .on_delay = [this](const testing::StoreCall&, Millis d) { monotonic_.Advance(d); }});
    fingerprinter_ = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
    sealer_ = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, random_));
    const bool honours_keys = rng_() % 2 == 0;
    provider_ = std::make_unique<SimProvider>(
        SimProvider::Options{.honours_keys = honours_keys,
                             .call_timeout = kTimeout,
                             .lands_within = kLandsWithin,
                             .listed_within = kListedWithin},
        world_, rng_, [this](const std::string& line) { Log(acting_ + ": " + line); });
    refund_orphans_ = rng_() % 2 == 0;
    page_size_ = 1 + static_cast<int>(rng_() % 3);  // small pages: many cursors to resume from
    // With Redis (in-flight markers) or without; a replay cache in each instance or none.
    if (rng_() % 2 == 0) {
      markers_ = std::make_unique<SimMarkers>(
          monotonic_, rng_, [this](Millis d) { Advance(d); },
          [this](const std::string& line) { Log(acting_ + ": " + line); });
    }
    cache_entries_ = rng_() % 2 == 0 ? 0 : 1 + rng_() % 4;
    // As an operator configures idemd for this provider: [provider] deduplicates_by_key when it
    // does (then nothing settles), else settle_ms.
    dedup_ = honours_keys && rng_() % 2 == 0;
    // The gateway route, as its [[routes]] table would say for this upstream: a status URL or
    // not, upstream_deduplicates only when it does.
    const bool upstream_honours = rng_() % 2 == 0;
    upstream_ = std::make_unique<SimUpstream>(
        SimUpstream::Options{.honours_keys = upstream_honours,
                             .timeout = kTimeout,
                             .lands_within = kLandsWithin,
                             .large_body = 2 * kGatewayMaxStored},
        monotonic_, acting_monotonic_, rng_,
        [this](const std::string& line) { Log(acting_ + ": " + line); });
    route_.name = "orders";
    route_.method = "POST";
    std::string no_match = idemd::ParseGatewayMatch("POST /v1/orders", route_);
    if (!no_match.empty()) return Fail("route: " + no_match);
    route_.upstream = "http://orders.sim";
    route_.store_headers = {"content-type", "location"};
    route_.forward_key_header = std::string(kUpstreamKeyHeader);
    route_.upstream_deduplicates = upstream_honours && rng_() % 2 == 0;
    route_.nothing_done_statuses = {503};  // its 503 never passed the request on; its 500 may have
    if (rng_() % 2 == 0) route_.status_path = std::string(kStatusPath);
    route_.status_unknown_max = Millis(60'000);
    route_.late_execution = late_execution_ ? kLandsWithin : Millis(0);
    route_.lease = kLease;
    route_.retention = kGatewayRetention;
    route_.timeout = kTimeout;
    route_.max_stored_bytes = kGatewayMaxStored;
    const int instances = 1 + static_cast<int>(rng_() % 3);
    std::string skews;
    std::string drifts;
    for (int i = 0; i < instances; ++i) {
      // Most oscillators keep time well; some are off by up to kMaxDriftPpm.
      const int64_t drift =
          rng_() % 2 == 0 ? 0
                          : static_cast<int64_t>(rng_() % (2 * kMaxDriftPpm + 1)) - kMaxDriftPpm;
      instances_.push_back(std::make_unique<Instance>(world_, monotonic_, drift));
      instances_.back()->clock.Set(RandomSkew());
      Start(*instances_.back(), i);
      skews += " " + std::to_string(instances_.back()->clock.Skew().count());
      drifts += " " + std::to_string(drift);
    }
    Log("seed " + std::to_string(seed_) + ": provider " +
        (honours_keys ? "honours keys" : "ignores keys") +
        (dedup_ ? ", configured deduplicates_by_key" : "") + "; upstream " +
        (upstream_honours ? "honours" : "ignores") + " the forwarded key" +
        (route_.upstream_deduplicates ? ", declared upstream_deduplicates" : "") +
        (route_.status_path.empty() ? ", no status URL" : ", a status URL") +
        (memory_ ? std::string("; the in-memory store")
                 : "; SQLite; the books " + std::string(refund_orphans_ ? "refund" : "report") +
                       " orphans, pages of " + std::to_string(page_size_)) +
        "; " + (markers_ ? "in-flight markers" : "no markers") + ", " +
        (cache_entries_ > 0 ? "replay caches of " + std::to_string(cache_entries_)
                            : "no replay cache") +
        "; store faults " + std::to_string(store_faults) + "; " + std::to_string(instances) +
        " instances, wall clock skews (ms)" + skews + ", drifts (ppm)" + drifts);
    return true;
  }

  // The SQLite database of this thread, emptied, with the payments' namespace.
  bool OpenSqlite() {
    SqliteStoreOptions options;
    // Each schedule of a thread empties the tables of the one before: cheaper than a new file
    // and its migrations, and nothing of the earlier schedule is left to read.
    options.path = dir_ + "/sim.db";
    const bool reused = std::filesystem::exists(options.path);
    options.pool_size = 1;
    options.synchronous_full = false;
    options.max_group = 1;
    options.apps = idemd::IdemdMigrations();
    auto store = OpenSqliteStore(options, world_, random_);
    if (!store) return Fail("store: " + store.error().message);
    store_ = std::move(*store);
    if (reused) {
      auto txn = store_->Begin();
      if (!txn) return Fail("store: " + txn.error().message);
      for (const char* table :
           {"idem_records", "idem_retained", "payments", "payments_namespace", "reconcile_runs",
            "reconcile_findings", "reconcile_events", "idem_outbox"}) {
        if (auto emptied = (*txn)->Exec(std::string("DELETE FROM ") + table, {}); !emptied) {
          return Fail(std::string("store: emptying ") + table + ": " + emptied.error().message);
        }
      }
      if (auto committed = (*txn)->Commit(); !committed) {
        return Fail("store: " + committed.error().message);
      }
    }
    auto space = idemd::PaymentsNamespace(*store_, random_);
    if (!space) return Fail("payments namespace: " + space.error().message);
    namespace_ = *space;
    return true;
  }

  // Builds an instance's payments route as idemd's main does.
  void Start(Instance& in, int index) {
    in.pool = std::make_unique<http::BlockingPool>(http::BlockingPool::OnTheLoop{});
    in.store = std::make_unique<StoreWrapper>(static_cast<Store&>(*faulty_));
    if (cache_entries_ > 0) {
      // Its replay cache: tiny, so entries are evicted (lost) all the time; its entries' lives
      // measured on the instance's own monotonic clock, as in idemd.
      in.store = WrapWithReplayCache(
          std::move(in.store),
          {.max_entries = cache_entries_, .max_bytes = 1u << 20, .monotonic = &in.monotonic},
          in.clock);
    }
    in.engine =
        std::make_unique<Engine>(*in.store, *fingerprinter_, *sealer_, in.clock, markers_.get());
    in.metrics = std::make_unique<idemd::Metrics>();
    in.payments = std::make_unique<idemd::Payments>(
        *in.store, *in.pool, *provider_, in.clock, in.monotonic, namespace_,
        std::vector<std::string>{"USD"}, idemd::ChargeCover{kTimeout, kMargin}, dedup_,
        settle_ ? kSettle : Millis(0));
    idemd::FilterPolicy policy = idemd::PaymentsPolicy(KeyPolicy{}, kLease, Millis(3'600'000),
                                                       1'000'000, 1'000'000, Millis(10'000));
    policy.max_new_keys_per_second = 0;
    policy.takeover_concurrency = 1;  // the simulator's one thread
    in.filter = std::make_unique<idemd::IdempotencyFilter>(*in.engine, *in.pool, in.monotonic,
                                                           *in.metrics, policy, *in.payments);
    in.proxy = std::make_unique<idemd::ProxyOperation>(route_, *upstream_, *in.pool, in.monotonic,
                                                       *in.metrics, kMargin);
    idemd::FilterPolicy gateway =
        idemd::GatewayPolicy(route_, KeyPolicy{}, 1'000'000, 1'000'000, Millis(10'000));
    gateway.max_new_keys_per_second = 0;
    gateway.takeover_concurrency = 1;
    in.gateway = std::make_unique<idemd::IdempotencyFilter>(*in.engine, *in.pool, in.monotonic,
                                                            *in.metrics, gateway, *in.proxy);
    if (!memory_)
      in.books = std::make_unique<idemd::Reconciliation>(
          *in.store, *provider_, in.clock, random_, in.metrics.get(),
          idemd::ReconcileOptions{.refund_duplicates = true,
                                  .refund_orphans = refund_orphans_,
                                  .orphan_grace = kOrphanGrace,
                                  .lease = kLease,
                                  .page_size = page_size_,
                                  .instance = "i" + std::to_string(index)});
    in.loop = std::make_unique<http::EventLoop>();
    ++in.generation;
  }

  void Crash(int i) {
    Instance& in = *instances_[static_cast<std::size_t>(i)];
    Log("instance i" + std::to_string(i) + " crashes and restarts");
    in.loop.reset();  // every coroutine it ran dies here
    in.books.reset();
    in.gateway.reset();
    in.proxy.reset();
    in.filter.reset();
    in.payments.reset();
    in.metrics.reset();
    in.engine.reset();
    in.store.reset();
    in.pool.reset();
    Start(in, i);
  }

  void Advance(Millis d) {
    world_.Advance(d);
    monotonic_.Advance(d);
  }

  void Land() {
    provider_->Tick();
    upstream_->Tick();
  }

  // A client sends key k's request to a random instance.
  void Send(int k) {
    Key& key = keys_[static_cast<std::size_t>(k)];
    const int i = static_cast<int>(rng_() % instances_.size());
    Instance& in = *instances_[static_cast<std::size_t>(i)];
    auto call = std::make_shared<Call>();
    call->id = ++calls_made_;
    call->key = k;
    call->instance = i;
    call->generation = in.generation;
    call->sent = monotonic_.Now();
    http::Request request;
    request.method = "POST";
    request.headers.Set("Idempotency-Key", key.key);
    request.headers.Set("Content-Type", "application/json");
    // Some clients would rather wait for a running duplicate, or be told where to look.
    const std::string prefer = PreferOf(rng_() % 8);
    if (!prefer.empty()) request.headers.Set("Prefer", prefer);
    if (key.gateway) {
      request.target = "/v1/orders";
      request.body = "{\"op\":\"" + key.op + "\"}";
    } else {
      request.target = "/v1/payments";
      request.body = "{\"merchant_order_no\":\"" +
                     orders_[static_cast<std::size_t>(key.order)].merchant_order_no +
                     "\",\"amount\":\"" + std::string(kAmount) + "\",\"currency\":\"USD\"}";
    }
    Log("request " + std::to_string(call->id) + " for " + key.key +
        (key.gateway ? " (" + key.op + ")" : "") + (prefer.empty() ? "" : ", Prefer: " + prefer) +
        " to i" + std::to_string(i));
    in.loop->Spawn(Serve(key.gateway ? *in.gateway : *in.filter, *in.loop, in.monotonic,
                         std::move(request), Principal{"acme", "alice"}, call));
    ++key.in_flight;
    calls_.push_back(std::move(call));
  }

  // One step of the world: time moves, late charges land, something happens (a client sends, an
  // instance pauses or its clock steps, a takeover pass), and then the instances run whatever is
  // ready, interleaved at random, until none has anything left to do now; between two of their
  // steps an instance may crash.
  void Tick(bool faults) {
    Advance(Millis(static_cast<int64_t>(rng_() % 200)));
    Land();
    const uint64_t what = rng_() % 16;
    if (faults && what == 1 && rng_() % 3 == 0) {
      const std::size_t i = rng_() % instances_.size();
      instances_[i]->clock.Set(RandomSkew());
      Log("instance i" + std::to_string(i) + "'s wall clock steps to skew " +
          std::to_string(instances_[i]->clock.Skew().count()) + " ms");
    } else if (what == 2) {
      TakeOver(static_cast<int>(rng_() % instances_.size()));
    } else if (faults && what == 3 && rng_() % 2 == 0) {
      // The books among the faults; once they are over, CheckBooks runs them to the end.
      (void)Books(static_cast<int>(rng_() % instances_.size()));
    } else if (faults && what == 4 && !memory_ && rng_() % 8 == 0) {
      ChargeByHand();
    } else if (faults && what == 5 && markers_ && rng_() % 16 == 0) {
      acting_ = "the world";
      markers_->Vanish();
    } else if (what <= 8) {
      Retry();
    }
    std::vector<std::size_t> running;
    for (std::size_t i = 0; i < instances_.size(); ++i) {
      if (instances_[i]->paused_until <= monotonic_.Now()) running.push_back(i);
    }
    while (!running.empty() && ok_) {
      const std::size_t pick = rng_() % running.size();
      const std::size_t i = running[pick];
      const uint64_t fault = faults ? rng_() % 400 : 400;  // 400: none
      if (fault == 0) {
        Crash(static_cast<int>(i));
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(pick));
      } else if (fault <= 2) {
        // Stopped (a long GC, SIGSTOP, a VM migration) for longer than a lease.
        instances_[i]->paused_until =
            monotonic_.Now() + kLease + Millis(static_cast<int64_t>(rng_() % 3000));
        Log("instance i" + std::to_string(i) + " pauses");
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(pick));
      } else if (Acting(i, "i"); !instances_[i]->loop->RunOne()) {
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(pick));
      }
      AfterStep();
    }
    AfterStep();
  }

  // After each step: the store faults it met go into the trace, answers that arrived reach their
  // clients, and the effects are checked.
  void AfterStep() {
    LogInjected();
    Collect();
    CheckEffects();
  }

  // The clients: one whose last answer was not final retries after its back-off; now and then a
  // client whose answer was final sends once more (a double click), and must get it again.
  void Retry() {
    const std::size_t k = rng_() % keys_.size();
    Key& key = keys_[k];
    if (key.final) {
      // Well within its record's retention: past it, the same request is a new operation.
      if (!key.gateway || !ExpiresWithin(key, Millis(10'000))) {
        if (rng_() % 8 == 0) Send(static_cast<int>(k));
      }
      return;
    }
    if (key.in_flight == 0 && key.retry_at <= monotonic_.Now()) Send(static_cast<int>(k));
  }

  // Time passes without faults; clients keep retrying and the takeover loop runs until every key
  // has its final answer, or a bound: a key unanswered after it is blocked (CheckEnd).
  // With `drain`, also until no request is left in flight (those whose clients gave up included).
  void Settle(bool drain = false) {
    for (int round = 0; round < 60 && ok_ && !(AllFinal() && (!drain || calls_.empty())); ++round) {
      for (int i = 0; i < 40 && ok_; ++i) Tick(/*faults=*/false);
    }
  }

  // Whether the key's record expires within `d` by the store's clock, or has (its client reads
  // Idempotency-Key-Expires).
  bool ExpiresWithin(const Key& key, Millis d) {
    auto r = store_->Read(key.scope);
    return r && *r && (*r)->expires_at < world_.Now() + d;
  }
  bool Expired(const Key& key) { return ExpiresWithin(key, Millis(0)); }

  void TakeOver(int i) {
    Instance& in = *instances_[static_cast<std::size_t>(i)];
    if (in.paused_until > monotonic_.Now()) return;
    // The loop runs on its own thread in idemd, its provider calls blocking; here they answer
    // at once.
    provider_->SetAtOnce(true);
    upstream_->SetAtOnce(true);
    Acting(static_cast<std::size_t>(i), "the takeover loop on i");
    const int resolved = in.filter->TakeOverOnce(10, {}) + in.gateway->TakeOverOnce(10, {});
    provider_->SetAtOnce(false);
    upstream_->SetAtOnce(false);
    if (resolved > 0) Log(acting_ + " resolves " + std::to_string(resolved));
  }

  // A run of the books on instance i, as its periodic job makes one; nullopt when the instance is
  // paused.
  std::optional<Result<idemd::RunSummary>> Books(int i, bool even_paused = false) {
    Instance& in = *instances_[static_cast<std::size_t>(i)];
    if (!in.books || (!even_paused && in.paused_until > monotonic_.Now())) return std::nullopt;
    provider_->SetAtOnce(true);  // as the takeover loop's calls
    Acting(static_cast<std::size_t>(i), "the books on i");
    Result<idemd::RunSummary> ran = in.books->RunPeriodic(kBooksWindow, kBooksLag);
    provider_->SetAtOnce(false);
    if (!ran) {
      Log(acting_ + " stop: " + ran.error().message);
      return ran;
    }
    std::string line = acting_ + (ran->resumed ? " resume " : " run ") + ran->run_id + ": " +
                       std::to_string(ran->charges) + " charges, " + std::to_string(ran->matched) +
                       " matched, " + std::to_string(ran->pending) + " pending";
    for (const auto& [finding_class, n] : ran->by_class) {
      line += ", " + std::to_string(n) + " " + finding_class;
    }
    Log(line + ", " + std::to_string(ran->refunded) + " refunded");
    return ran;
  }

  // Someone charges by hand on the provider's console: a reference shaped like an idemd payment
  // id that no payment has (another deployment's, an old backup's), or one of another system.
  void ChargeByHand() {
    std::string reference = "manual-" + std::to_string(rng_() % 1000);
    if (rng_() % 2 == 0) {
      reference = "pay_";
      for (int d = 0; d < 24; ++d) reference += "0123456789abcdef"[rng_() % 16];
    }
    acting_ = "the world";
    provider_->ChargeByHand(reference, std::string(kAmount), "USD");
    by_hand_.push_back(reference);
  }

  // Answers that arrived, calls whose instance died, calls whose client gave up.
  void Collect() {
    for (auto it = calls_.begin(); it != calls_.end();) {
      Call& call = **it;
      Key& key = keys_[static_cast<std::size_t>(call.key)];
      const Instance& in = *instances_[static_cast<std::size_t>(call.instance)];
      const bool died = in.generation != call.generation && !call.answer;
      if (!call.answer && !died && !call.given_up &&
          monotonic_.Now() - call.sent > kClientTimeout) {
        call.given_up = true;
        --key.in_flight;
        key.retry_at = monotonic_.Now();
        Log("request " + std::to_string(call.id) + " for " + key.key + ": the client gives up");
      }
      if (!call.answer && !died) {
        ++it;
        continue;
      }
      if (!call.given_up) --key.in_flight;
      if (died) {
        if (!call.given_up) {
          Log("request " + std::to_string(call.id) + " for " + key.key +
              ": connection lost with its instance");
        }
        key.retry_at = monotonic_.Now() + Millis(static_cast<int64_t>(rng_() % 1000));
      } else {
        Answered(call, key, *call.answer);
      }
      it = calls_.erase(it);
    }
  }

  void Answered(const Call& call, Key& key, const http::Response& answer) {
    const std::string charge = ChargeOf(answer);
    Log("request " + std::to_string(call.id) + " for " + key.key + " answers on i" +
        std::to_string(call.instance) + ": " + std::to_string(answer.status) +
        (charge.empty() ? "" : " " + charge) + (call.given_up ? " (its client had given up)" : ""));
    if (answer.status == 422 || answer.status == 400 || answer.status == 415) {
      Fail(key.key + " answered " + std::to_string(answer.status) + ": " + answer.body);
      return;
    }
    if (key.gateway && IsFinal(key, answer) && answer.status < 300 && OpOf(answer) != key.op) {
      Fail(key.key + " answered " + std::to_string(answer.status) + " for " + key.op +
           " with another operation's answer: " + OpOf(answer));
      return;
    }
    if (!IsFinal(key, answer)) {
      key.retry_at = monotonic_.Now() + Millis(static_cast<int64_t>(200 + rng_() % 1500));
      return;
    }
    // A success names a charge the provider holds for this key's payment, as succeeded.
    if (!key.gateway && (answer.status == 200 || answer.status == 201)) {
      if (charge.empty() || !ChargeExists(charge)) {
        Fail(key.key + " answered " + std::to_string(answer.status) +
             " naming a charge the provider does not hold: " + answer.body);
        return;
      }
    }
    if (!key.final) {
      key.final = answer;
      return;
    }
    // Every answer after the first final one is the same: the one stored.
    if (key.final->status != answer.status || key.final->body != answer.body) {
      Fail("answers differ for " + key.key + ": " + std::to_string(key.final->status) + " " +
           key.final->body + " then " + std::to_string(answer.status) + " " + answer.body);
    }
  }

  bool ChargeExists(const std::string& id) const {
    for (const auto& [reference, made] : provider_->Charges()) {
      for (const SimCharge& c : made) {
        if (c.id == id && c.status == "succeeded") return true;
      }
    }
    return false;
  }

  // The merchant order a charge's reference (a payment id) belongs to, from the payments table.
  std::string OrderOfPayment(const std::string& payment) {
    auto it = payment_orders_.find(payment);
    if (it != payment_orders_.end()) return it->second;
    auto rows = store_->Query("SELECT merchant_order_no FROM payments WHERE id = ?", {payment});
    if (!rows || rows->empty()) return "?";
    return payment_orders_[payment] = idemd::Text((*rows)[0][0]);
  }

  // Succeeded, unrefunded charges per merchant order; with `idemds_only`, less the provider's own
  // duplicates (idemd's effects: the books' to refund).
  std::map<std::string, std::vector<std::string>> ChargesByOrder(bool idemds_only) {
    std::map<std::string, std::vector<std::string>> by_order;
    for (const auto& [reference, made] : provider_->Charges()) {
      for (const SimCharge& c : made) {
        if (c.status == "succeeded" && !c.refunded && !c.by_hand && !(idemds_only && c.doubled)) {
          by_order[OrderOfPayment(reference)].push_back(c.id);
        }
      }
    }
    return by_order;
  }

  // At most one effect per order and per gateway operation; the books refund only what they may.
  void CheckEffects() {
    CheckCharges();
    CheckRefunds();
    for (const auto& [op, n] : upstream_->Executions()) {
      if (n > 1) Fail(op + " was executed " + std::to_string(n) + " times upstream");
    }
  }

  void CheckCharges() {
    for (const auto& [order, charges] : ChargesByOrder(/*idemds_only=*/true)) {
      if (charges.size() > 1) {
        std::string list;
        for (const std::string& c : charges) list += " " + c;
        Fail(order + " was charged " + std::to_string(charges.size()) + " times:" + list);
      }
    }
  }

  // A refunded charge is the provider's own duplicate, or an orphan the books may refund; never
  // the charge a success answered with.
  void CheckRefunds() {
    for (const auto& [reference, made] : provider_->Charges()) {
      for (const SimCharge& c : made) {
        if (!c.refunded || c.doubled) continue;
        if (c.by_hand && refund_orphans_ && idemd::IsPaymentId(reference)) continue;
        Fail("the books refunded " + c.id + " of " + reference + ", which they must not: " +
             (c.by_hand ? "an orphan they may only report" : "the payment's own charge"));
      }
    }
  }

  // The books, once the faults are over and every charge has landed: runs until one walks the
  // whole schedule, then the money charged per order is the money paid (the provider's
  // duplicates refunded), each charge made by hand is an orphan reported (refunded when
  // configured and it is idemd's shape), and nothing is missing or mismatched.
  void CheckBooks() {
    if (memory_) return;  // no payments, no books
    // Past every lease, the grace of every orphan and the listing's delay, by the clock of the
    // instance that runs them.
    const Millis behind = std::max(Millis(0), -instances_[0]->clock.Skew());
    Advance(kOrphanGrace + kBooksLag + kListedWithin + kLease + behind + kMaxSkew);
    bool walked = false;
    for (int attempt = 0; attempt < 4 && !walked && ok_; ++attempt) {
      std::optional<Result<idemd::RunSummary>> ran = Books(0, /*even_paused=*/true);
      walked = *ran && !(**ran).resumed;
      if (!walked) Advance(kLease + Millis(1));  // a lease not given back runs out
    }
    if (!walked) {
      Fail("the books did not finish a run once the faults were over");
      return;
    }
    auto rows =
        store_->Query("SELECT class, charge_id, payment_id, action FROM reconcile_findings");
    if (!rows) {
      Fail("reading the findings: " + rows.error().message);
      return;
    }
    std::map<std::string, std::string> duplicates;  // charge -> action
    std::map<std::string, std::string> orphans;
    for (const SqlRow& r : *rows) {
      const std::string finding_class = idemd::Text(r[0]);
      const std::string charge = idemd::Text(r[1]);
      const std::string action = idemd::Text(r[3]);
      if (finding_class == "duplicate") {
        duplicates[charge] = action;
      } else if (finding_class == "orphan") {
        orphans[charge] = action;
      } else {
        Fail("the books found " + finding_class + " " + charge + " of payment " +
             idemd::Text(r[2]) + ": the payments and the provider disagree");
      }
    }
    for (const auto& [reference, made] : provider_->Charges()) {
      for (const SimCharge& c : made) {
        if (c.doubled && duplicates[c.id] != "refunded") {
          Fail("the provider's duplicate " + c.id + " of " + reference + " is '" +
               duplicates[c.id] + "' in the books, not refunded");
        }
        if (!c.doubled && duplicates.count(c.id) > 0) {
          Fail(c.id + " of " + reference +
               " is a duplicate in the books, but it is the one charge");
        }
        if (!c.by_hand) continue;
        const bool refundable = refund_orphans_ && idemd::IsPaymentId(reference);
        const std::string want = refundable ? "refunded" : "reported";
        if (orphans[c.id] != want || c.refunded != refundable) {
          Fail(c.id + ", charged by hand for " + reference + ", is '" + orphans[c.id] +
               "' in the books and " + (c.refunded ? "refunded" : "not refunded") + ", not " +
               want);
        }
      }
    }
  }

  // The outbox, at the end: each payment's final outcome announced exactly once, in its own
  // transaction — payment.succeeded for a succeeded payment (with its charge), payment.failed for a
  // declined one, nothing for one pending or abandoned — each refund the books made once, and
  // each payment's events numbered 1, 2, ... with no gap.
  void CheckEvents() {
    if (memory_) return;
    auto payments = store_->Query("SELECT id, status, provider_charge_id FROM payments");
    auto refunds = store_->Query(
        "SELECT payment_id, charge_id FROM reconcile_findings WHERE action = 'refunded' AND "
        "payment_id <> ''");
    auto events = store_->Query(
        "SELECT aggregate, type, sequence, event_id, payload FROM idem_outbox ORDER BY aggregate, "
        "sequence");
    if (!payments || !refunds || !events) {
      Fail("reading the payments, the refunds and the outbox");
      return;
    }
    std::map<std::string, std::vector<SqlRow>> by_payment;
    for (SqlRow& e : *events) by_payment[idemd::Text(e[0])].push_back(std::move(e));
    std::map<std::string, std::set<std::string>> refunded;  // payment -> charges refunded
    for (const SqlRow& r : *refunds) refunded[idemd::Text(r[0])].insert(idemd::Text(r[1]));
    std::set<std::string> known;
    for (const SqlRow& p : *payments) {
      const std::string id = idemd::Text(p[0]);
      const std::string status = idemd::Text(p[1]);
      known.insert(id);
      std::map<std::string, int> types;
      int64_t expected_sequence = 1;
      for (const SqlRow& e : by_payment[id]) {
        const std::string type = idemd::Text(e[1]);
        ++types[type];
        if (idemd::Integer(e[2]) != expected_sequence++) {
          Fail(id + "'s events are not numbered 1, 2, ...: " + type + " is " +
               std::to_string(idemd::Integer(e[2])));
        }
        if (type == "payment.succeeded" && ChargeOfEvent(idemd::Text(e[4])) != idemd::Text(p[2])) {
          Fail(id + "'s payment.succeeded names another charge than the payment's " +
               idemd::Text(p[2]));
        }
      }
      const int want_succeeded = status == "succeeded" ? 1 : 0;
      const int want_failed = status == "declined" ? 1 : 0;
      if (types["payment.succeeded"] != want_succeeded || types["payment.failed"] != want_failed) {
        Fail("payment " + id + " is " + status + " with " +
             std::to_string(types["payment.succeeded"]) + " payment.succeeded and " +
             std::to_string(types["payment.failed"]) + " payment.failed events");
      }
      const std::set<std::string>& charges = refunded[id];
      if (types["payment.refunded"] != static_cast<int>(charges.size())) {
        Fail("payment " + id + " had " + std::to_string(charges.size()) + " charges refunded and " +
             std::to_string(types["payment.refunded"]) + " payment.refunded events");
      }
      for (const SqlRow& e : by_payment[id]) {
        if (idemd::Text(e[1]) == "payment.refunded" &&
            std::none_of(charges.begin(), charges.end(), [&](const std::string& charge) {
              return idemd::Text(e[3]) == OutboxEventId(id, "payment.refunded", charge);
            })) {
          Fail("payment " + id + " has a payment.refunded event of a charge not refunded");
        }
      }
    }
    for (const auto& [aggregate, rows] : by_payment) {
      if (known.count(aggregate) == 0 && !rows.empty()) {
        Fail("the outbox announces " + aggregate + ", which is no payment");
      }
    }
  }

  bool AllFinal() const {
    return std::all_of(keys_.begin(), keys_.end(),
                       [](const Key& k) { return k.final.has_value(); });
  }

  // A gateway operation's final answer against what the upstream did: a 2xx or an answer too
  // large to keep, exactly one execution; an outcome held, at most one.
  void CheckOperation(const Key& key) {
    const int n = upstream_->ExecutionsOf(key.op);
    const http::Response& final = *key.final;
    const bool ran = (final.status >= 200 && final.status < 300) ||
                     StringMember(final.body, "type") == "urn:idem:problem:answer-too-large";
    if (ran && n != 1) {
      Fail(key.key + "'s " + key.op + " answered " + std::to_string(final.status) + ", and the " +
           "upstream executed it " + std::to_string(n) + " times");
    }
    if (n > 1) Fail(key.op + " was executed " + std::to_string(n) + " times upstream");
  }

  void CheckEnd() {
    Advance(kSettle + kLandsWithin);
    provider_->LandAll();
    upstream_->LandAll();
    CheckEffects();
    for (const Key& key : done_) CheckOperation(key);
    CheckBooks();
    CheckEvents();
    std::map<std::string, std::vector<std::string>> charged = ChargesByOrder(/*idemds_only=*/false);
    for (const Key& key : keys_) {
      if (!key.final) {
        Fail(key.key + " never got a final answer: blocked");
        continue;
      }
      if (key.gateway) {
        CheckOperation(key);
        CheckRecord(key);
        continue;
      }
      const Order& order = orders_[static_cast<std::size_t>(key.order)];
      const std::vector<std::string>& made = charged[order.merchant_order_no];
      const int status = key.final->status;
      if ((status == 200 || status == 201) &&
          (made.size() != 1 || made.front() != ChargeOf(*key.final))) {
        Fail(key.key + " answered " + std::to_string(status) + " for " + ChargeOf(*key.final) +
             ", and " + order.merchant_order_no + " has " + std::to_string(made.size()) +
             " charges");
      }
      if (status == 402 && !made.empty()) {
        Fail(key.key + " was declined, yet " + order.merchant_order_no + " was charged");
      }
      CheckRecord(key);
    }
  }

  void CheckRecord(const Key& key) {
    auto r = store_->Read(key.scope);
    if (r && !*r) Fail(key.key + "'s record is gone before it expired");
    if (r && *r && (*r)->state == RecordState::kProcessing) {
      Fail(key.key + " is still PROCESSING after faults stopped and the takeover loop ran");
    }
  }

  // Writes the store faults injected since the last call into the trace.
  void LogInjected() {
    const std::vector<testing::InjectedFault> injected = faulty_->Injected();
    for (; injected_logged_ < injected.size(); ++injected_logged_) {
      const testing::InjectedFault& f = injected[injected_logged_];
      std::string what = f.fault.kind == testing::Fault::Kind::kFailBefore ? "fails"
                         : f.fault.kind == testing::Fault::Kind::kDelay
                             ? "is delayed " + std::to_string(f.fault.delay.count()) + " ms"
                             : "commits, then reports failure";
      Log("store: " + std::string(StoreOperationName(f.call.op)) + " #" + std::to_string(f.call.n) +
          " " + what);
    }
  }
  // Instance i runs idemd's code now: its timers go by its monotonic clock, its words into the
  // trace under `who` and its number.
  void Acting(std::size_t i, const char* who) {
    acting_ = who + std::to_string(i);
    acting_monotonic_.Set(&instances_[i]->monotonic);
    http::SetTimerClock(&instances_[i]->monotonic);
  }

  // Up to kMaxSkew either way.
  Millis RandomSkew() {
    return Millis(static_cast<int64_t>(rng_() % (2 * kMaxSkew.count() + 1)) - kMaxSkew.count());
  }

  void Log(const std::string& line) {
    trace_.push_back("[" + std::to_string(ToUnixMillis(world_.Now()) - start_ms_) + " ms] " + line);
    if (verbose_) std::printf("%s\n", trace_.back().c_str());
  }
  bool Fail(const std::string& why) {
    if (ok_) Log("INVARIANT BROKEN: " + why);
    ok_ = false;
    return false;
  }

  std::string reproduce_;  // the command line, less the seed
  std::string dir_;
  bool settle_;
  bool late_execution_;
  bool memory_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  SeededRandom random_;
  FakeClock world_;
  FakeMonotonicClock monotonic_;
  ActingMonotonicClock acting_monotonic_{monotonic_};
  const int64_t start_ms_ = ToUnixMillis(world_.Now());
  std::unique_ptr<Store> store_;
  std::string namespace_;
  std::unique_ptr<Fingerprinter> fingerprinter_;
  std::unique_ptr<Sealer> sealer_;
  std::unique_ptr<FaultyStore> faulty_;
  std::unique_ptr<SimProvider> provider_;
  bool refund_orphans_ = false;       // [reconciliation] refund_orphans
  int page_size_ = 100;               // the books' page of the listing
  std::vector<std::string> by_hand_;  // references charged by hand at the provider
  std::unique_ptr<SimUpstream> upstream_;
  std::unique_ptr<SimMarkers> markers_;  // null: idemd runs without Redis
  std::size_t cache_entries_ = 0;        // each instance's replay cache; 0: none
  idemd::GatewayRoute route_;
  bool dedup_ = false;
  std::vector<std::unique_ptr<Instance>> instances_;
  std::size_t injected_logged_ = 0;
  std::vector<Order> orders_;
  std::vector<Key> keys_;
  std::vector<Key> done_;  // gateway operations whose key began another after it expired
  int next_op_ = 0;
  std::vector<std::shared_ptr<Call>> calls_;
  int calls_made_ = 0;
  std::map<std::string, std::string> payment_orders_;
  std::vector<std::string> trace_;
  std::string acting_;  // who is running idemd's code: "i0", "the takeover loop on i1"
  // What idemd logs goes into the trace, as an operator would read it.
  const http::LogSink log_sink_ = [this](http::LogLevel level, std::string_view msg,
                                         const json::object& fields) {
    if (level < http::LogLevel::kWarn) return;
    std::string line =
        acting_ + " logs: " + (level == http::LogLevel::kError ? "ERROR " : "") + std::string(msg);
    for (const auto& [name, value] : fields) {
      line += " " + std::string(name) + "=" +
              (value.is_string() ? std::string(value.as_string()) : json::serialize(value));
    }
    Log(line);
  };
  bool verbose_ = false;
  bool ok_ = true;
};

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const std::size_t n = std::strlen(flag);
      return arg.compare(0, n, flag) == 0 ? arg.c_str() + n : nullptr;
    };
    if (const char* seed = value("--seed=")) {
      o.seed = std::strtoull(seed, nullptr, 10);
    } else if (const char* schedules = value("--schedules=")) {
      o.schedules = std::atoi(schedules);
    } else if (const char* seconds = value("--seconds=")) {
      o.seconds = std::atof(seconds);
    } else if (arg == "--random") {
      o.seed = std::random_device{}();
    } else if (const char* without = value("--without=")) {
      o.without = without;
    } else if (arg == "--expect-failure") {
      o.expect_failure = true;
    } else if (arg == "--verbose") {
      o.verbose = true;
    } else if (arg == "--twice") {
      o.twice = true;
    } else if (const char* jobs = value("--jobs=")) {
      o.jobs = std::max(1, std::atoi(jobs));
    } else if (arg == "--store=memory" || arg == "--store=sqlite") {
      o.memory = arg == "--store=memory";
    } else {
      std::fprintf(
          stderr,
          "usage: idem_sim [--seed=N | --random] [--schedules=K] [--seconds=S] "
          "[--without=FIX,...] [--expect-failure] [--twice] [--jobs=N] [--store=sqlite|memory] "
          "[--verbose]\n"
          "  FIX: settle, late_execution, margin, unknown_5xx, too_large, "
          "status_vocabulary, upstream_key, gateway_5xx\n");
      return 2;
    }
  }
  bool settle = true;
  bool late_execution = true;
  std::string reverted;
  for (std::size_t at = 0; at < o.without.size();) {
    std::size_t comma = o.without.find(',', at);
    if (comma == std::string::npos) comma = o.without.size();
    const std::string fix = o.without.substr(at, comma - at);
    if (fix == "settle") {
      settle = false;
    } else if (fix == "late_execution") {
      late_execution = false;
    } else {
      reverted += (reverted.empty() ? "" : ",") + fix;
    }
    at = comma + 1;
  }
  if (Status taken = RevertFixes(reverted); !taken) {
    std::fprintf(stderr, "idem_sim: --without=%s: %s (or settle, late_execution)\n",
                 o.without.c_str(), taken.error().message.c_str());
    return 2;
  }
  std::string reproduce = "idem_sim";
  if (!o.without.empty()) reproduce += " --without=" + o.without;
  if (o.memory) reproduce += " --store=memory";
  // Each schedule writes a fresh database: in memory-backed /dev/shm when there is one (and no
  // TMPDIR says otherwise), it costs half as much.
  if (std::getenv("TMPDIR") == nullptr && std::filesystem::is_directory("/dev/shm")) {
    ::setenv("TMPDIR", "/dev/shm", 1);
  }
  TempDir dir;
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  // Each thread takes the next seed until there are none left or one failed. A failure stops
  // the taking, but every seed below it was taken already and runs to its end: the failure
  // reported is the smallest failing seed, however many threads ran.
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> ran{0};
  std::atomic<bool> stop{false};
  Mutex mu;
  struct Failure {
    uint64_t seed;
    std::string report;
  };
  std::optional<Failure> failed;  // guarded by mu
  auto work = [&](int worker) {
    const std::string db_dir = dir.File("w" + std::to_string(worker));
    std::filesystem::create_directories(db_dir);
    while (!stop) {
      const int64_t run = next++;
      if (o.seconds > 0 ? elapsed() >= o.seconds : run >= o.schedules) break;
      const uint64_t seed = o.seed + static_cast<uint64_t>(run);
      Schedule schedule(seed, db_dir, settle, late_execution, o.memory, reproduce);
      std::optional<std::string> report;
      if (!schedule.Run(o.verbose)) report = schedule.Report();
      if (o.twice) {
        Schedule again(seed, db_dir, settle, late_execution, o.memory, reproduce);
        (void)again.Run(/*verbose=*/false);
        if (again.Trace() != schedule.Trace()) {
          report = "seed " + std::to_string(seed) +
                   " ran differently the second time: the schedule is not a function of its "
                   "seed\n";
        }
      }
      ++ran;
      if (report) {
        MutexLock lock(mu);
        if (!failed || seed < failed->seed) failed = Failure{seed, std::move(*report)};
        stop = true;
      }
    }
  };
  {
    std::vector<std::jthread> threads;
    for (int w = 1; w < o.jobs; ++w) threads.emplace_back(work, w);
    work(0);
  }
  const int64_t run = ran.load();
  MutexLock lock(mu);
  if (failed) {
    std::printf("%s", failed->report.c_str());
    if (!o.expect_failure) return 1;
    std::printf("without %s, seed %llu broke an invariant, as expected\n", o.without.c_str(),
                static_cast<unsigned long long>(failed->seed));
    return 0;
  }
  if (o.expect_failure) {
    std::printf("without %s, no schedule of %lld broke an invariant: the simulator missed it\n",
                o.without.c_str(), static_cast<long long>(run));
    return 1;
  }
  std::printf("%lld schedules from seed %llu passed in %.1f s (%.0f schedules/s, %d threads)\n",
              static_cast<long long>(run), static_cast<unsigned long long>(o.seed), elapsed(),
              static_cast<double>(run) / std::max(elapsed(), 1e-9), o.jobs);
  return 0;
}

}  // namespace
}  // namespace idem::sim

int main(int argc, char** argv) { return idem::sim::Main(argc, argv); }
