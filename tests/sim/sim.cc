// tests/sim/sim.cc — the deterministic simulator (docs/testing.md): the real engine over a real
// store, driven through simulated time by many clients retrying one payment each, executors that
// crash or pause between any two steps, the takeover loop, and a simulated provider that declines,
// fails, loses answers, lets charges land after the caller gave up, and honours idempotency keys
// or not. One seed fixes the whole schedule; invariants are checked after every step and at the
// end. A failure prints `reproduce: idem_sim --seed=N` and the schedule's trace.
//
//   idem_sim --seed=N [--schedules=K] [--seconds=S] [--store=memory|sqlite] [--verbose]
//
// The operation is a model of the payments operation (its steps in the order payments takes
// them: look up a charge that may have left, advance under a covering lease, charge, finish),
// not server/idemd/payments/payments.cc itself, whose heartbeat runs on a thread of its own.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "idem/engine.h"
#include "idem/store/sqlite.h"
#include "testing/fakes.h"
#include "testing/faulty_store.h"
#include "testing/memory_store.h"

namespace idem::sim {
namespace {

using testing::FakeClock;
using testing::FaultPlan;
using testing::FaultyStore;
using testing::SeededRandom;
using testing::TempDir;

constexpr Millis kLease{3000};
constexpr Millis kTimeout{1000};  // the provider call's deadline
constexpr Millis kMargin{500};
constexpr Millis kLateLandsWithin{2400};  // the longest a charge takes to land after it left
// A send leaves within kMargin of sent_at (or not at all) and lands within kLateLandsWithin.
constexpr Millis kSettle{3000};
static_assert(kSettle > kMargin + kLateLandsWithin);
constexpr std::string_view kSent = "charge_sent";
constexpr std::string_view kAbandoned = "abandoned";

struct Options {
  uint64_t seed = 1;
  int schedules = 1;
  double seconds = 0;  // when > 0, run schedules until this much wall time has passed
  bool verbose = false;
  bool sqlite = false;  // the real SQL on a SQLite file instead of the in-memory model
  // A guard of the payments protocol switched off in the model, to show the simulator finds the
  // bug it prevents; with expect_failure, success is a broken invariant.
  std::string without;
  bool expect_failure = false;
};

// The guards of the payments operation the model keeps (Payments::Execute), each of which one
// --without= switches off.
struct Guards {
  bool settle = true;  // nothing is sent again within the settle window of an unknown outcome
  bool cover = true;   // a charge is sent only under a lease that outlasts the call
  bool margin = true;  // nor when the covered advance answered after the margin
};

// The provider: charges by reference. A late charge is created some time after the request,
// whether or not its caller still waits.
class Provider {
 public:
  explicit Provider(bool honours_keys) : honours_keys_(honours_keys) {}

  enum class Outcome { kCharged, kDeclined, k5xx, kLostAfterCharge, kLate, kLostBefore };

  // Takes the request of attempt `by` at `now`; what its caller will learn. A charge is made
  // when the provider gets to it: before `answer_at` when the caller is answered (a slow
  // provider), any time within kLateLandsWithin when it is not (LandedFor tells which charge).
  Outcome Charge(const std::string& reference, int by, Outcome fault, Timestamp now,
                 Timestamp answer_at, std::mt19937_64& rng) {
    // A provider that honours keys answers a repeat with the first request's outcome: the
    // charge made, or a retryable conflict while the first is still being executed.
    if (honours_keys_ && fault == Outcome::kDeclined) {
      if (Find(reference)) fault = Outcome::kCharged;
      if (std::any_of(late_.begin(), late_.end(),
                      [&](const Late& l) { return l.reference == reference; })) {
        fault = Outcome::k5xx;
      }
    }
    if (fault == Outcome::kDeclined || fault == Outcome::k5xx || fault == Outcome::kLostBefore) {
      return fault;
    }
    const Millis window = fault == Outcome::kCharged
                              ? std::chrono::duration_cast<Millis>(answer_at - now)
                              : kLateLandsWithin;
    late_.push_back(
        {now + Millis(static_cast<int64_t>(rng() % (window.count() + 1))), reference, by});
    return fault;
  }
  // The charge made for attempt `by`'s request, once made.
  std::optional<std::string> LandedFor(int by) const {
    auto it = landed_.find(by);
    if (it == landed_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<std::string> Find(const std::string& reference) const {
    auto it = charges_.find(reference);
    if (it == charges_.end() || it->second.empty()) return std::nullopt;
    return it->second.front();
  }
  void Tick(Timestamp now) {
    for (auto it = late_.begin(); it != late_.end();) {
      if (it->at <= now) {
        landed_[it->by] = Make(it->reference);
        it = late_.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::size_t ChargesOf(const std::string& reference) const {
    auto it = charges_.find(reference);
    return it == charges_.end() ? 0 : it->second.size();
  }
  bool Has(const std::string& reference, const std::string& id) const {
    auto it = charges_.find(reference);
    return it != charges_.end() &&
           std::find(it->second.begin(), it->second.end(), id) != it->second.end();
  }
  bool HonoursKeys() const { return honours_keys_; }

 private:
  std::string Make(const std::string& reference) {
    std::vector<std::string>& made = charges_[reference];
    if (honours_keys_ && !made.empty()) return made.front();
    made.push_back("ch_" + std::to_string(++next_));
    return made.back();
  }
  struct Late {
    Timestamp at;
    std::string reference;
    int by;
  };
  std::map<int, std::string> landed_;
  bool honours_keys_;
  int next_ = 0;
  std::map<std::string, std::vector<std::string>> charges_;
  std::vector<Late> late_;
};

// An executor's wall clock: the world's time (the store's, as a database server's) plus this
// instance's skew, which jumps now and then. Decisions about a record must not depend on it.
class InstanceClock final : public Clock {
 public:
  explicit InstanceClock(const FakeClock& world) : world_(world) {}
  Timestamp Now() const override { return world_.Now() + skew_; }
  void Set(Millis skew) { skew_ = skew; }
  Millis Skew() const { return skew_; }

 private:
  const FakeClock& world_;
  Millis skew_{0};
};

// One attempt at one key: a client's request on some instance, or a takeover.
struct Attempt {
  enum class Step { kStart, kLookup, kAdvance, kAwait, kFinish, kRelease, kDone };
  int id = 0;
  int instance = 0;  // the executor it runs on
  std::string key;
  bool reconciler = false;
  Step step = Step::kStart;
  Ticket ticket;
  RecordState finish_state = RecordState::kSucceeded;
  StoredResponse answer;     // what kFinish stores
  std::string finish_point;  // kFinish's recovery point for a retryable failure
  Millis hold{0};            // kRelease's hold
  Timestamp paused_until{};  // not scheduled before this: a pause, or a call's answer to come
  int outcome = 0;           // kAwait: a Provider::Outcome
};

// An executor: its own clock, and an engine over the shared store.
struct Instance {
  explicit Instance(const FakeClock& world) : clock(world) {}
  InstanceClock clock;
  std::unique_ptr<Engine> engine;
};

class Schedule {
 public:
  Schedule(uint64_t seed, bool sqlite, Guards guards, std::string reproduce)
      : guards_(guards),
        reproduce_(std::move(reproduce)),
        sqlite_(sqlite),
        seed_(seed),
        rng_(seed),
        random_(seed ^ 0x9e3779b97f4a7c15ULL),
        provider_(rng_() % 2 == 0) {}

  // Runs the schedule; returns false (after printing why) when an invariant broke.
  bool Run(bool verbose) {
    verbose_ = verbose;
    if (!Open()) return false;
    const int keys = 1 + static_cast<int>(rng_() % 4);
    for (int k = 0; k < keys; ++k) {
      keys_.push_back("sim-key-" + std::to_string(k));
      // Known up front: a claim whose commit landed but reported failure names no scope.
      scopes_[*Scope{"acme", "alice", policy_.route, keys_.back()}.Hash()] = keys_.back();
    }
    // A burst of requests: each key, some twice at once.
    for (const std::string& key : keys_) {
      NewAttempt(key, false);
      if (rng_() % 3 == 0) NewAttempt(key, false);
    }
    const int steps = 40 + static_cast<int>(rng_() % 160);
    for (int i = 0; i < steps && ok_; ++i) Tick(/*faults=*/true);
    faulty_->SetPlan(FaultPlan());
    Log("faults stop");
    // Faults stop; time passes; clients keep retrying and the takeover loop runs until every key
    // has its final answer. An order still unanswered after that is blocked forever.
    for (int round = 0; round < 60 && ok_ && !AllFinal(); ++round) {
      clock_.Advance(kLease);
      for (int i = 0; i < 30 && ok_; ++i) Tick(/*faults=*/false);
    }
    if (ok_) CheckEnd();
    if (!ok_) PrintTrace();
    return ok_;
  }

 private:
  bool Open() {
    if (sqlite_) {
      dir_.emplace();
      SqliteStoreOptions options;
      options.path = dir_->File("sim.db");
      options.pool_size = 1;
      options.synchronous_full = false;
      auto store = OpenSqliteStore(options, clock_, random_);
      if (!store) return Fail("store: " + store.error().message);
      store_ = std::move(*store);
    } else {
      store_ = testing::MakeMemoryStore(clock_, random_);
    }
    // Store faults by the seed: calls that fail, commits that land but report failure, and
    // delays that advance the world's time in the middle of a call (a slow commit).
    const double store_faults = rng_() % 3 == 0 ? 0.0 : 0.01 * static_cast<double>(1 + rng_() % 5);
    faulty_ = std::make_unique<FaultyStore>(
        *store_,
        testing::FaultyStoreOptions{.plan = FaultPlan::FromSeed(rng_(), store_faults, kLease),
                                    .clock = &clock_,
                                    .on_delay = {}});
    fingerprinter_ = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
    sealer_ = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, random_));
    const int instances = 1 + static_cast<int>(rng_() % 3);
    std::string skews;
    for (int i = 0; i < instances; ++i) {
      auto instance = std::make_unique<Instance>(clock_);
      instance->clock.Set(RandomSkew());
      instance->engine =
          std::make_unique<Engine>(*faulty_, *fingerprinter_, *sealer_, instance->clock);
      skews += " " + std::to_string(instance->clock.Skew().count());
      instances_.push_back(std::move(instance));
    }
    policy_.route = "payments.create";
    policy_.lease = kLease;
    policy_.retention = Millis(3'600'000);
    policy_.sent_points = {std::string(kSent)};
    Log("seed " + std::to_string(seed_) + ": provider " +
        (provider_.HonoursKeys() ? "honours keys" : "ignores keys") + "; store faults " +
        std::to_string(store_faults) + "; instance clock skews (ms)" + skews);
    return true;
  }

  void NewAttempt(const std::string& key, bool reconciler) {
    Attempt a;
    a.id = ++attempts_made_;
    a.instance = static_cast<int>(rng_() % instances_.size());
    a.key = key;
    a.reconciler = reconciler;
    attempts_.push_back(std::move(a));
  }

  // One step of the world: time moves, late charges land, and one actor acts.
  void Tick(bool faults) {
    clock_.Advance(Millis(static_cast<int64_t>(rng_() % 400)));
    provider_.Tick(clock_.Now());
    for (const std::string& key : keys_) CheckCharges(key);
    if (faults && rng_() % 50 == 0) {
      Instance& jumped = *instances_[rng_() % instances_.size()];
      jumped.clock.Set(RandomSkew());
      Log("an instance's clock jumps to skew " + std::to_string(jumped.clock.Skew().count()) +
          " ms");
    }
    const uint64_t what = rng_() % 12;
    if (what == 0) {
      Reconcile();
    } else if (what == 2) {
      // The sweeper deletes only expired finished records; nothing here expires within a
      // schedule, so whatever it deletes shows at the end as a record gone.
      (void)SweepExpired(*faulty_, policy_.sent_points);
    } else if (what == 1) {
      // A client whose last answer was not final retries (or a fresh duplicate arrives).
      const std::string& key = keys_[rng_() % keys_.size()];
      if (!final_.count(key) || rng_() % 4 == 0) NewAttempt(key, false);
    } else {
      std::vector<std::size_t> ready;
      for (std::size_t i = 0; i < attempts_.size(); ++i) {
        if (attempts_[i].paused_until <= clock_.Now()) ready.push_back(i);
      }
      if (ready.empty()) return;
      Attempt& a = attempts_[ready[rng_() % ready.size()]];
      // Faults between steps: the process dies, or stops for longer than the lease (while a
      // call is out too). The covered advance and the send are one step, as in the payments
      // operation: nothing but lease_margin covers the time between them.
      if (faults && rng_() % 25 == 0) {
        Log(Who(a) + " (" + a.key + ") crashes");
        a.step = Attempt::Step::kDone;
      } else if (faults && rng_() % 25 == 0) {
        a.paused_until = clock_.Now() + kLease + Millis(static_cast<int64_t>(rng_() % 3000));
        Log(Who(a) + " (" + a.key + ") pauses");
      } else {
        Act(a, faults);
      }
    }
    LogInjected();
    std::erase_if(attempts_, [](const Attempt& a) { return a.step == Attempt::Step::kDone; });
  }

  void Reconcile() {
    const int on = static_cast<int>(rng_() % instances_.size());
    Engine& engine = *instances_[on]->engine;
    auto stale = engine.ListStale(policy_, 10);
    if (!stale) return;
    for (const Record& r : *stale) {
      auto ticket = engine.TakeOver(policy_, r);
      if (!ticket) continue;
      const std::string key = KeyOf(r.scope);
      if (!Acquired(key, *ticket)) return;
      Attempt a;
      a.id = ++attempts_made_;
      a.instance = on;
      a.key = key;
      a.reconciler = true;
      a.ticket = std::move(*ticket);
      a.step = Attempt::Step::kLookup;
      Log("reconciler takes " + key + " over at fence " + std::to_string(a.ticket.lease.fence));
      attempts_.push_back(std::move(a));
    }
  }

  void Act(Attempt& a, bool faults) {
    switch (a.step) {
      case Attempt::Step::kStart: {
        Request request;
        request.principal = {"acme", "alice"};
        request.key_header = a.key;
        request.method = "POST";
        request.content_type = "application/json";
        const std::string body = "{\"order\":\"" + a.key + "\"}";
        request.body = body;
        auto d = Eng(a).Start(policy_, request);
        if (!d) {
          Log(Who(a) + " start: " + d.error().message);
          a.step = Attempt::Step::kDone;
          return;
        }
        if (d->kind == Decision::Kind::kReplay) {
          Answer(a, d->response, true);
          a.step = Attempt::Step::kDone;
        } else if (d->kind == Decision::Kind::kInProgress) {
          a.step = Attempt::Step::kDone;
        } else {
          if (!Acquired(a.key, d->ticket)) return;
          a.ticket = std::move(d->ticket);
          const std::string& point = a.ticket.record.recovery_point;
          a.step = a.ticket.resumed && (point == kSent || point == kAbandoned)
                       ? Attempt::Step::kLookup
                       : Attempt::Step::kAdvance;
          Log(Who(a) + " executes " + a.key + " at fence " + std::to_string(a.ticket.lease.fence) +
              (a.ticket.resumed ? " (resumed)" : ""));
        }
        return;
      }
      case Attempt::Step::kLookup: {
        if (auto found = provider_.Find(a.key)) {
          Finish(a, RecordState::kSucceeded, {201, {}, "charged " + *found});
          return;
        }
        const Record& r = a.ticket.record;
        const std::optional<Millis> unsettled = UntilSettled(r, kSettle);
        // As idemd configured with [provider] deduplicates_by_key = true when it does.
        if (guards_.settle && !provider_.HonoursKeys() &&
            a.ticket.resumed_from == RecordState::kProcessing && r.recovery_point == kSent &&
            unsettled) {
          a.hold = std::min(*unsettled, policy_.retry_after);
          a.step = Attempt::Step::kRelease;
          return;
        }
        if (a.reconciler) {
          // Nothing left, nothing to find: the order is free again for the client's retry.
          a.finish_point = std::string(kAbandoned);
          Finish(a, RecordState::kFailedRetryable, {503, {}, "retry"});
          return;
        }
        a.step = Attempt::Step::kAdvance;
        return;
      }
      case Attempt::Step::kAdvance: {
        const Timestamp asked = clock_.Now();  // the world's time, as a monotonic clock counts
        auto advanced = Eng(a).AdvanceBeforeCall(a.ticket, kSent,
                                                 guards_.cover ? kTimeout + kMargin : Millis(0));
        if (!advanced) {
          Log(Who(a) + " advance: " + advanced.error().message);
          a.step = advanced.error().code == Errc::kConflict ? Attempt::Step::kRelease
                                                            : Attempt::Step::kDone;
          return;
        }
        // The store answered after the margin: the lease may not outlast the call, and nothing
        // has left yet (Payments::Execute).
        if (guards_.margin && clock_.Now() - asked > kMargin) {
          Log(Who(a) + " advance answered after the margin: nothing sent");
          a.finish_point = std::string(kSent);
          Finish(a, RecordState::kFailedRetryable, {503, {}, "store too slow"});
          return;
        }
        // The request leaves at once; its answer comes back within the call's deadline, while
        // everyone else goes on.
        Provider::Outcome fault = Provider::Outcome::kCharged;
        if (faults) {
          static constexpr Provider::Outcome kFaults[] = {
              Provider::Outcome::kCharged, Provider::Outcome::kCharged,
              Provider::Outcome::kCharged, Provider::Outcome::kDeclined,
              Provider::Outcome::k5xx,     Provider::Outcome::kLostAfterCharge,
              Provider::Outcome::kLate,    Provider::Outcome::kLostBefore};
          fault = kFaults[rng_() % std::size(kFaults)];
        }
        const bool answered = fault == Provider::Outcome::kCharged ||
                              fault == Provider::Outcome::kDeclined ||
                              fault == Provider::Outcome::k5xx;
        a.paused_until =
            clock_.Now() +
            (answered ? Millis(static_cast<int64_t>(rng_() % kTimeout.count())) : kTimeout);
        a.outcome = static_cast<int>(
            provider_.Charge(a.key, a.id, fault, clock_.Now(), a.paused_until, rng_));
        Log(Who(a) + " sends a charge for " + a.key + ": " + Name(fault));
        a.step = Attempt::Step::kAwait;
        return;
      }
      case Attempt::Step::kAwait:
        switch (static_cast<Provider::Outcome>(a.outcome)) {
          case Provider::Outcome::kCharged: {
            provider_.Tick(clock_.Now());
            const std::optional<std::string> id = provider_.LandedFor(a.id);
            if (!id) {
              Fail("the provider answered before it charged");
              return;
            }
            Finish(a, RecordState::kSucceeded, {201, {}, "charged " + *id});
            return;
          }
          case Provider::Outcome::kDeclined:
            Finish(a, RecordState::kFailedFinal, {402, {}, "declined"});
            return;
          case Provider::Outcome::k5xx:
            Finish(a, RecordState::kFailedRetryable, {503, {}, "provider 5xx"});
            return;
          default:  // the call timed out: the record stays PROCESSING for a lookup
            a.hold = Millis(0);
            a.step = Attempt::Step::kRelease;
            return;
        }
      case Attempt::Step::kFinish: {
        auto finished = Eng(a).Finish(a.ticket, a.finish_state, a.answer, {}, a.finish_point);
        if (finished) {
          if (a.finish_state != RecordState::kFailedRetryable) {
            if (++completions_[a.key] > 1) Fail("two executors completed " + a.key);
            Answer(a, a.answer, false);
          }
        } else {
          Log(Who(a) + " finish: " + finished.error().message);
          // A commit that landed but reported failure completed the record all the same.
          auto r = store_->Read(a.ticket.scope);
          if (r && *r && (*r)->state != RecordState::kProcessing &&
              (*r)->lease.fence == a.ticket.lease.fence &&
              a.finish_state != RecordState::kFailedRetryable && ++completions_[a.key] > 1) {
            Fail("two executors completed " + a.key);
          }
        }
        a.step = Attempt::Step::kDone;
        return;
      }
      case Attempt::Step::kRelease:
        (void)Eng(a).Release(a.ticket, a.hold);
        a.step = Attempt::Step::kDone;
        return;
      case Attempt::Step::kDone:
        return;
    }
  }

  void Finish(Attempt& a, RecordState state, StoredResponse answer) {
    a.finish_state = state;
    a.answer = std::move(answer);
    a.step = Attempt::Step::kFinish;
  }

  // A claim or takeover won: fences of one record only ever grow.
  bool Acquired(const std::string& key, const Ticket& ticket) {
    int64_t& last = fences_[key];
    if (ticket.lease.fence <= last) {
      return Fail("fence of " + key + " went from " + std::to_string(last) + " to " +
                  std::to_string(ticket.lease.fence));
    }
    last = ticket.lease.fence;
    return true;
  }

  // A final answer a client saw: every one for a key after the first is the same, and a
  // success names a charge the provider made for that key.
  void Answer(const Attempt& a, const StoredResponse& answer, bool replayed) {
    Log(Who(a) + " answers " + a.key + ": " + std::to_string(answer.status) + " " + answer.body +
        (replayed ? " (replay)" : ""));
    auto [it, first] = final_.emplace(a.key, answer);
    if (!first && !(it->second == answer)) {
      Fail("answers differ for " + a.key + ": " + it->second.body + " then " + answer.body);
    }
    if (answer.status == 201 && !provider_.Has(a.key, answer.body.substr(8))) {
      Fail("a 201 for " + a.key + " names a charge the provider did not make");
    }
  }

  void CheckCharges(const std::string& key) {
    if (provider_.ChargesOf(key) > 1) Fail(key + " was charged twice");
  }

  bool AllFinal() const {
    for (const std::string& key : keys_) {
      if (!final_.count(key)) return false;
    }
    return true;
  }

  void CheckEnd() {
    provider_.Tick(clock_.Now() + kSettle);
    for (const std::string& key : keys_) {
      if (!final_.count(key)) {
        Fail(key + " never got a final answer: blocked");
        continue;
      }
      CheckCharges(key);
      const std::size_t charged = provider_.ChargesOf(key);
      const int status = final_.at(key).status;
      if (status == 201 && charged != 1)
        Fail(key + " answered 201 with " + std::to_string(charged) + " charges");
      if (status == 402 && charged != 0) Fail(key + " was declined yet charged");
    }
    for (const std::string& key : keys_) {
      if (const auto scope = ScopeOf(key)) {
        auto r = store_->Read(*scope);
        if (r && !*r) Fail(key + "'s record is gone before it expired");
        if (r && *r && (*r)->state == RecordState::kProcessing) {
          Fail(key + " is still PROCESSING after faults stopped and the reconciler ran");
        }
      }
    }
  }

  static std::string Who(const Attempt& a) {
    return "attempt " + std::to_string(a.id) + "@i" + std::to_string(a.instance);
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
  Engine& Eng(const Attempt& a) { return *instances_[a.instance]->engine; }
  // Up to ten seconds either way.
  Millis RandomSkew() { return Millis(static_cast<int64_t>(rng_() % 20001) - 10000); }

  std::optional<ScopeHash> ScopeOf(const std::string& key) const {
    for (const auto& [scope, k] : scopes_) {
      if (k == key) return scope;
    }
    return std::nullopt;
  }
  std::string KeyOf(const ScopeHash& scope) const {
    auto it = scopes_.find(scope);
    return it == scopes_.end() ? std::string("?") : it->second;
  }

  static std::string Name(Provider::Outcome o) {
    switch (o) {
      case Provider::Outcome::kCharged:
        return "charged";
      case Provider::Outcome::kDeclined:
        return "declined";
      case Provider::Outcome::k5xx:
        return "5xx, nothing charged";
      case Provider::Outcome::kLostAfterCharge:
        return "charged, answer lost";
      case Provider::Outcome::kLate:
        return "no answer, lands late";
      case Provider::Outcome::kLostBefore:
        return "no answer, nothing charged";
    }
    return "?";
  }

  void Log(const std::string& line) {
    trace_.push_back("[" + std::to_string(ToUnixMillis(clock_.Now()) - start_ms_) + " ms] " + line);
    if (verbose_) std::printf("%s\n", trace_.back().c_str());
  }
  bool Fail(const std::string& why) {
    if (ok_) Log("INVARIANT BROKEN: " + why);
    ok_ = false;
    return false;
  }
  void PrintTrace() const {
    std::printf("FAILED seed %llu\n", static_cast<unsigned long long>(seed_));
    if (!verbose_) {
      for (const std::string& line : trace_) std::printf("  %s\n", line.c_str());
    }
    std::printf("reproduce: %s --seed=%llu\n", reproduce_.c_str(),
                static_cast<unsigned long long>(seed_));
  }

  Guards guards_;
  std::string reproduce_;  // the command line, less the seed
  bool sqlite_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  SeededRandom random_;
  Provider provider_;
  FakeClock clock_;
  const int64_t start_ms_ = ToUnixMillis(clock_.Now());
  std::optional<TempDir> dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Fingerprinter> fingerprinter_;
  std::unique_ptr<Sealer> sealer_;
  std::unique_ptr<FaultyStore> faulty_;
  std::vector<std::unique_ptr<Instance>> instances_;
  std::size_t injected_logged_ = 0;
  RoutePolicy policy_;
  std::vector<std::string> keys_;
  std::vector<Attempt> attempts_;
  int attempts_made_ = 0;
  std::map<std::string, StoredResponse> final_;
  std::map<std::string, int64_t> fences_;
  std::map<std::string, int> completions_;
  std::map<ScopeHash, std::string> scopes_;
  std::vector<std::string> trace_;
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
    } else if (arg == "--store=sqlite") {
      o.sqlite = true;
    } else if (arg == "--store=memory") {
      o.sqlite = false;
    } else {
      std::fprintf(stderr,
                   "usage: idem_sim [--seed=N | --random] [--schedules=K] [--seconds=S] "
                   "[--store=memory|sqlite] [--without=settle|cover|margin] "
                   "[--expect-failure] [--verbose]\n");
      return 2;
    }
  }
  Guards guards;
  for (std::size_t at = 0; at < o.without.size();) {
    std::size_t comma = o.without.find(',', at);
    if (comma == std::string::npos) comma = o.without.size();
    const std::string guard = o.without.substr(at, comma - at);
    if (guard == "settle") {
      guards.settle = false;
    } else if (guard == "cover") {
      guards.cover = false;
    } else if (guard == "margin") {
      guards.margin = false;
    } else {
      std::fprintf(stderr, "idem_sim: --without=%s: not a guard (settle, cover, margin)\n",
                   guard.c_str());
      return 2;
    }
    at = comma + 1;
  }
  std::string reproduce = "idem_sim";
  if (o.sqlite) reproduce += " --store=sqlite";
  if (!o.without.empty()) reproduce += " --without=" + o.without;
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  int run = 0;
  for (; o.seconds > 0 ? elapsed() < o.seconds : run < o.schedules; ++run) {
    Schedule schedule(o.seed + static_cast<uint64_t>(run), o.sqlite, guards, reproduce);
    if (!schedule.Run(o.verbose)) {
      if (!o.expect_failure) return 1;
      std::printf("without %s, schedule %d (seed %llu) broke an invariant, as expected\n",
                  o.without.c_str(), run + 1, static_cast<unsigned long long>(o.seed + run));
      return 0;
    }
  }
  if (o.expect_failure) {
    std::printf("without %s, no schedule of %d broke an invariant: the simulator missed it\n",
                o.without.c_str(), run);
    return 1;
  }
  std::printf("%d schedules from seed %llu passed in %.1f s (%.0f schedules/s)\n", run,
              static_cast<unsigned long long>(o.seed), elapsed(), run / std::max(elapsed(), 1e-9));
  return 0;
}

}  // namespace
}  // namespace idem::sim

int main(int argc, char** argv) { return idem::sim::Main(argc, argv); }
