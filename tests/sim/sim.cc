// tests/sim/sim.cc — the deterministic simulator (docs/testing.md): the real engine over a real
// store, driven through simulated time by many clients retrying one payment each, executors that
// crash or pause between any two steps, the reconciler, and a simulated provider that declines,
// fails, loses answers, lets charges land after the caller gave up, and honours idempotency keys
// or not. One seed fixes the whole schedule; invariants are checked after every step and at the
// end. A failure prints `reproduce: idem_sim --seed=N` and the schedule's trace.
//
//   idem_sim --seed=N [--schedules=K] [--seconds=S] [--store=memory|sqlite] [--verbose]
//
// The operation is a model of the payments operation (its steps in the order payments takes
// them: look up a charge that may have left, advance under a covering lease, charge, finish),
// not server/idemd/payments.cc itself, whose heartbeat runs on a thread of its own.
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

#include "include/idem/engine.h"
#include "include/idem/store/sqlite.h"
#include "testing/fakes.h"
#include "testing/memory_store.h"

namespace idem::sim {
namespace {

using testing::FakeClock;
using testing::SeededRandom;
using testing::TempDir;

constexpr Millis kLease{3000};
constexpr Millis kTimeout{1000};  // the provider call's deadline
constexpr Millis kMargin{500};
constexpr Millis kSettle{2500};  // > kTimeout + the longest a late charge takes to land
constexpr Millis kLateLandsWithin{2400};
constexpr std::string_view kSent = "charge_sent";
constexpr std::string_view kAbandoned = "abandoned";

struct Options {
  uint64_t seed = 1;
  int schedules = 1;
  double seconds = 0;  // when > 0, run schedules until this much wall time has passed
  bool verbose = false;
  bool sqlite = false;  // the real SQL on a SQLite file instead of the in-memory model
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

// One attempt at one key: a client's request on some instance, or a reconciler takeover.
struct Attempt {
  enum class Step { kStart, kLookup, kAdvance, kAwait, kFinish, kRelease, kDone };
  int id = 0;
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

class Schedule {
 public:
  Schedule(uint64_t seed, bool sqlite)
      : sqlite_(sqlite),
        seed_(seed),
        rng_(seed),
        random_(seed ^ 0x9e3779b97f4a7c15ULL),
        provider_(rng_() % 2 == 0) {}

  // Runs the schedule; returns false (after printing why) when an invariant broke.
  bool Run(bool verbose) {
    verbose_ = verbose;
    if (!Open()) return false;
    const int keys = 1 + static_cast<int>(rng_() % 4);
    for (int k = 0; k < keys; ++k) keys_.push_back("sim-key-" + std::to_string(k));
    // A burst of requests: each key, some twice at once.
    for (const std::string& key : keys_) {
      NewAttempt(key, false);
      if (rng_() % 3 == 0) NewAttempt(key, false);
    }
    const int steps = 40 + static_cast<int>(rng_() % 160);
    for (int i = 0; i < steps && ok_; ++i) Tick(/*faults=*/true);
    // Faults stop; time passes; clients keep retrying and the reconciler runs until every key
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
    fingerprinter_ = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
    sealer_ = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, random_));
    engine_ = std::make_unique<Engine>(*store_, *fingerprinter_, *sealer_, clock_);
    policy_.route = "payments.create";
    policy_.lease = kLease;
    policy_.retention = Millis(3'600'000);
    policy_.sent_points = {std::string(kSent)};
    Log("seed " + std::to_string(seed_) + ": provider " +
        (provider_.HonoursKeys() ? "honours keys" : "ignores keys"));
    return true;
  }

  void NewAttempt(const std::string& key, bool reconciler) {
    Attempt a;
    a.id = ++attempts_made_;
    a.key = key;
    a.reconciler = reconciler;
    attempts_.push_back(std::move(a));
  }

  // One step of the world: time moves, late charges land, and one actor acts.
  void Tick(bool faults) {
    clock_.Advance(Millis(static_cast<int64_t>(rng_() % 400)));
    provider_.Tick(clock_.Now());
    for (const std::string& key : keys_) CheckCharges(key);
    const uint64_t what = rng_() % 10;
    if (what == 0) {
      Reconcile();
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
        Log("attempt " + std::to_string(a.id) + " (" + a.key + ") crashes");
        a.step = Attempt::Step::kDone;
      } else if (faults && rng_() % 25 == 0) {
        a.paused_until = clock_.Now() + kLease + Millis(static_cast<int64_t>(rng_() % 3000));
        Log("attempt " + std::to_string(a.id) + " (" + a.key + ") pauses");
      } else {
        Act(a, faults);
      }
    }
    std::erase_if(attempts_, [](const Attempt& a) { return a.step == Attempt::Step::kDone; });
  }

  void Reconcile() {
    auto stale = engine_->ListStale(policy_, 10);
    if (!stale) return;
    for (const Record& r : *stale) {
      auto ticket = engine_->TakeOver(policy_, r);
      if (!ticket) continue;
      const std::string key = KeyOf(r.scope);
      if (!Acquired(key, *ticket)) return;
      Attempt a;
      a.id = ++attempts_made_;
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
        auto d = engine_->Start(policy_, request);
        if (!d) {
          Log("attempt " + std::to_string(a.id) + " start: " + d.error().message);
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
          Log("attempt " + std::to_string(a.id) + " executes " + a.key + " at fence " +
              std::to_string(a.ticket.lease.fence) + (a.ticket.resumed ? " (resumed)" : ""));
        }
        return;
      }
      case Attempt::Step::kLookup: {
        if (auto found = provider_.Find(a.key)) {
          Finish(a, RecordState::kSucceeded, {201, {}, "charged " + *found});
          return;
        }
        const Record& r = a.ticket.record;
        const Timestamp sent = r.sent_at != Timestamp{} ? r.sent_at : r.updated_at;
        if (a.ticket.resumed_from == RecordState::kProcessing && r.recovery_point == kSent &&
            r.observed_at < sent + kSettle) {
          a.hold = std::min(std::chrono::duration_cast<Millis>(sent + kSettle - r.observed_at),
                            policy_.retry_after);
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
        auto advanced = engine_->AdvanceBeforeCall(a.ticket, kSent, kTimeout + kMargin);
        if (!advanced) {
          Log("attempt " + std::to_string(a.id) + " advance: " + advanced.error().message);
          a.step = advanced.error().code == Errc::kConflict ? Attempt::Step::kRelease
                                                            : Attempt::Step::kDone;
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
        Log("attempt " + std::to_string(a.id) + " sends a charge for " + a.key + ": " +
            Name(fault));
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
        auto finished = engine_->Finish(a.ticket, a.finish_state, a.answer, {}, a.finish_point);
        if (finished) {
          if (a.finish_state != RecordState::kFailedRetryable) {
            if (++completions_[a.key] > 1) Fail("two executors completed " + a.key);
            Answer(a, a.answer, false);
          }
        } else {
          Log("attempt " + std::to_string(a.id) + " finish: " + finished.error().message);
        }
        a.step = Attempt::Step::kDone;
        return;
      }
      case Attempt::Step::kRelease:
        (void)engine_->Release(a.ticket, a.hold);
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
    scopes_[ticket.scope] = key;
    return true;
  }

  // A final answer a client saw: every one for a key after the first is the same, and a
  // success names a charge the provider made for that key.
  void Answer(const Attempt& a, const StoredResponse& answer, bool replayed) {
    Log("attempt " + std::to_string(a.id) + " answers " + a.key + ": " +
        std::to_string(answer.status) + " " + answer.body + (replayed ? " (replay)" : ""));
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
        if (r && *r && (*r)->state == RecordState::kProcessing) {
          Fail(key + " is still PROCESSING after faults stopped and the reconciler ran");
        }
      }
    }
  }

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
    std::printf("reproduce: idem_sim --seed=%llu\n", static_cast<unsigned long long>(seed_));
  }

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
  std::unique_ptr<Engine> engine_;
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
    } else if (arg == "--verbose") {
      o.verbose = true;
    } else if (arg == "--store=sqlite") {
      o.sqlite = true;
    } else if (arg == "--store=memory") {
      o.sqlite = false;
    } else {
      std::fprintf(stderr,
                   "usage: idem_sim [--seed=N | --random] [--schedules=K] [--seconds=S] "
                   "[--store=memory|sqlite] [--verbose]\n");
      return 2;
    }
  }
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  int run = 0;
  for (; o.seconds > 0 ? elapsed() < o.seconds : run < o.schedules; ++run) {
    Schedule schedule(o.seed + static_cast<uint64_t>(run), o.sqlite);
    if (!schedule.Run(o.verbose)) return 1;
  }
  std::printf("%d schedules from seed %llu passed in %.1f s (%.0f schedules/s)\n", run,
              static_cast<unsigned long long>(o.seed), elapsed(), run / std::max(elapsed(), 1e-9));
  return 0;
}

}  // namespace
}  // namespace idem::sim

int main(int argc, char** argv) { return idem::sim::Main(argc, argv); }
