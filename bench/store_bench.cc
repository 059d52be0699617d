// bench/store_bench.cc — claim + finish on a SQLite file, one operation per transaction pair, as
// idemd runs them; and the replay read path.
#include <benchmark/benchmark.h>

#include "include/idem/engine.h"
#include "include/idem/store/sqlite.h"
#include "testing/fakes.h"

namespace idem {
namespace {

struct Fixture {
  explicit Fixture(bool synchronous_full) {
    SqliteStoreOptions options;
    options.path = dir.File("bench.db");
    options.synchronous_full = synchronous_full;
    store = std::move(*OpenSqliteStore(options, SystemClock(), SystemRandom()));
    fingerprinter = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
    sealer = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, SystemRandom()));
    engine = std::make_unique<Engine>(*store, *fingerprinter, *sealer, SystemClock());
    policy.route = "payments.create";
    policy.rules.money_fields = {"amount"};
    policy.max_retained = 1'000'000'000;
  }

  Request Req(const std::string& key) {
    Request r;
    r.principal = {"acme", "alice"};
    r.key_header = key;
    r.method = "POST";
    r.content_type = "application/json";
    r.api_version = "v1";
    r.body = R"({"merchant_order_no":"ORD-1","amount":"100.00","currency":"CNY"})";
    return r;
  }

  testing::TempDir dir;
  std::unique_ptr<Store> store;
  std::unique_ptr<Fingerprinter> fingerprinter;
  std::unique_ptr<Sealer> sealer;
  std::unique_ptr<Engine> engine;
  RoutePolicy policy;
};

const StoredResponse kCreated{
    201,
    {{"Location", "/v1/payments/pay_1"}, {"Content-Type", "application/json"}},
    R"({"id":"pay_1","amount":"100.00","status":"succeeded"})"};

// Engine::Start (claim transaction) + Engine::Finish (completion transaction) per operation.
void BM_SqliteClaimAndFinish(benchmark::State& state) {
  Fixture f(/*synchronous_full=*/state.range(0) == 1);
  int64_t n = 0;
  for (auto _ : state) {
    const std::string key = "bench-key-" + std::to_string(n++);
    auto d = f.engine->Start(f.policy, f.Req(key));
    if (!d || d->kind != Decision::Kind::kExecute) {
      state.SkipWithError("claim failed");
      break;
    }
    if (!f.engine->Finish(d->ticket, RecordState::kSucceeded, kCreated)) {
      state.SkipWithError("finish failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(state.range(0) == 1 ? "synchronous=FULL" : "synchronous=NORMAL");
}
BENCHMARK(BM_SqliteClaimAndFinish)->Arg(1)->Arg(0)->UseRealTime();

// Claim + finish for a principal that already retains state.range(0) records: the quota checks
// must cost the same whatever the history (synchronous=NORMAL, so the figure is the statements'
// cost, not the disk's).
void BM_SqliteClaimWithHistory(benchmark::State& state) {
  Fixture f(/*synchronous_full=*/false);
  f.policy.max_retained = 1'000'000'000;  // every retained record counts against a huge quota
  {
    const int64_t now = ToUnixMillis(SystemClock().Now());
    auto txn = f.store->Begin();
    auto filled =
        txn ? (*txn)->Exec(
                  "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                  "INSERT INTO idem_records (scope_hash, tenant, user_id, route, request_hash, "
                  "fp_version, secret_id, state, recovery_point, resource_id, status_code, "
                  "response, owner_token, fence, lease_until, created_at, updated_at, "
                  "expires_at, sent_at) SELECT randomblob(32), 'acme', 'alice', "
                  "'payments.create', randomblob(32), 1, 1, 'SUCCEEDED', 'done', '', 201, NULL, "
                  "randomblob(16), 1, 0, ?, ?, ?, 0 FROM n",
                  {state.range(0), now, now, now + 86'400'000})
            : Result<std::vector<SqlRow>>(txn.error());
    if (!filled || !(*txn)->Commit()) {
      state.SkipWithError("filling the history failed");
      return;
    }
  }
  int64_t n = 0;
  for (auto _ : state) {
    auto d = f.engine->Start(f.policy, f.Req("bench-history-" + std::to_string(n++)));
    if (!d || d->kind != Decision::Kind::kExecute ||
        !f.engine->Finish(d->ticket, RecordState::kSucceeded, kCreated)) {
      state.SkipWithError("claim or finish failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SqliteClaimWithHistory)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->UseRealTime();

// A retry of a finished operation: snapshot read, fingerprint check, unseal.
void BM_SqliteReplay(benchmark::State& state) {
  Fixture f(true);
  auto d = f.engine->Start(f.policy, f.Req("bench-replay-key"));
  (void)f.engine->Finish(d->ticket, RecordState::kSucceeded, kCreated);
  for (auto _ : state) {
    auto again = f.engine->Start(f.policy, f.Req("bench-replay-key"));
    if (!again || again->kind != Decision::Kind::kReplay) {
      state.SkipWithError("replay failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SqliteReplay)->UseRealTime();

}  // namespace
}  // namespace idem
