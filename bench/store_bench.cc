// bench/store_bench.cc — claim + finish on a SQLite file, one operation per transaction pair, as
// idemd runs them; the same with a long history on SQLite and PostgreSQL (IDEM_TEST_PG_URL, as
// scripts/with-services sets it; skipped without); and the replay read path.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "idem/engine.h"
#include "idem/store/postgres.h"
#include "idem/store/sqlite.h"
#include "testing/fakes.h"

namespace idem {
namespace {

struct Fixture {
  explicit Fixture(bool synchronous_full) {
    SqliteStoreOptions options;
    options.path = dir.File("bench.db");
    options.synchronous_full = synchronous_full;
    Init(std::move(*OpenSqliteStore(options, SystemClock(), SystemRandom())));
  }
  explicit Fixture(std::unique_ptr<Store> opened) { Init(std::move(opened)); }

  void Init(std::unique_ptr<Store> opened) {
    store = std::move(opened);
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

// The same from several threads at once on one store, as idemd's store threads run it: with
// group commit, transactions waiting to write share one commit (one sync) with the one before.
void BM_SqliteClaimAndFinishConcurrent(benchmark::State& state) {
  static Fixture f(/*synchronous_full=*/true);
  static std::atomic<int64_t> next{0};
  for (auto _ : state) {
    const std::string key = "bench-concurrent-" + std::to_string(next++);
    auto d = f.engine->Start(f.policy, f.Req(key));
    if (!d || d->kind != Decision::Kind::kExecute ||
        !f.engine->Finish(d->ticket, RecordState::kSucceeded, kCreated)) {
      state.SkipWithError("claim or finish failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel("synchronous=FULL");
}
BENCHMARK(BM_SqliteClaimAndFinishConcurrent)->Threads(1)->Threads(4)->Threads(16)->UseRealTime();

bool Report(const Error& e) {
  std::fprintf(stderr, "filling the history: %s\n", e.message.c_str());
  return false;
}

// Fills f's store with `records` finished records of alice's, in one transaction. `postgres`
// picks the dialect of the generating statement.
bool FillHistory(Fixture& f, int64_t records, bool postgres) {
  const std::string columns =
      "INSERT INTO idem_records (scope_hash, tenant, user_id, route, request_hash, fp_version, "
      "secret_id, state, recovery_point, resource_id, status_code, response, owner_token, fence, "
      "lease_until, created_at, updated_at, expires_at, sent_at) ";
  const std::string sql =
      postgres ? columns +
                     "SELECT decode(md5(i::text) || md5((-i)::text), 'hex'), 'acme', 'alice', "
                     "'payments.create', decode(md5(i::text) || md5(i::text), 'hex'), 1, 1, "
                     "'SUCCEEDED', 'done', '', 201, NULL, decode(md5(i::text), 'hex'), 1, 0, "
                     "?, ?, ?, 0 FROM generate_series(1, ?) AS i"
               : "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) " +
                     columns +
                     "SELECT randomblob(32), 'acme', 'alice', 'payments.create', randomblob(32), "
                     "1, 1, 'SUCCEEDED', 'done', '', 201, NULL, randomblob(16), 1, 0, ?, ?, ?, 0 "
                     "FROM n";
  const int64_t now = ToUnixMillis(SystemClock().Now());
  const int64_t expires = now + 86'400'000;
  const std::vector<SqlValue> params = postgres ? std::vector<SqlValue>{now, now, expires, records}
                                                : std::vector<SqlValue>{records, now, now, expires};
  auto txn = f.store->Begin();
  if (!txn) return Report(txn.error());
  // PostgreSQL's counter trigger would update one row a million times in one transaction, each
  // time walking the versions the transaction made before (quadratic): fill without it, then
  // set the count. (A claim is one insert per transaction; see docs/design.md.)
  const std::vector<std::string> around =
      postgres ? std::vector<std::string>{"ALTER TABLE idem_records DISABLE TRIGGER "
                                          "idem_retained_insert"}
               : std::vector<std::string>{};
  for (const std::string& before : around) {
    if (auto done = (*txn)->Exec(before, {}); !done) return Report(done.error());
  }
  if (auto filled = (*txn)->Exec(sql, params); !filled) return Report(filled.error());
  if (postgres) {
    for (const char* after : {"ALTER TABLE idem_records ENABLE TRIGGER idem_retained_insert",
                              "INSERT INTO idem_retained (tenant, user_id, records) "
                              "SELECT tenant, user_id, count(*) FROM idem_records "
                              "GROUP BY tenant, user_id"}) {
      if (auto done = (*txn)->Exec(after, {}); !done) return Report(done.error());
    }
  }
  if (auto committed = (*txn)->Commit(); !committed) return Report(committed.error());
  return true;
}

void ClaimAndFinishLoop(Fixture& f, benchmark::State& state) {
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

// Claim + finish for a principal that already retains state.range(0) records: the quota checks
// must cost the same whatever the history (synchronous=NORMAL, so the figure is the statements'
// cost, not the disk's).
void BM_SqliteClaimWithHistory(benchmark::State& state) {
  Fixture f(/*synchronous_full=*/false);
  f.policy.max_retained = 1'000'000'000;  // every retained record counts against a huge quota
  if (!FillHistory(f, state.range(0), false)) {
    state.SkipWithError("filling the history failed");
    return;
  }
  ClaimAndFinishLoop(f, state);
}
BENCHMARK(BM_SqliteClaimWithHistory)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->UseRealTime();

// The same on PostgreSQL, each size in a schema of its own.
void BM_PostgresClaimWithHistory(benchmark::State& state) {
  const char* url = std::getenv("IDEM_TEST_PG_URL");
  if (url == nullptr || *url == '\0') {
    state.SkipWithError("IDEM_TEST_PG_URL is not set");
    return;
  }
  PostgresStoreOptions options;
  options.conninfo = url;
  // Google Benchmark may call this more than once per size: a fresh schema each time.
  static int runs = 0;
  options.schema = "bench_history_" + std::to_string(getpid()) + "_" + std::to_string(++runs);
  options.timeouts.statement = Millis(3'600'000);  // filling a million records takes a while
  options.timeouts.idle_in_transaction = Millis(3'600'000);
  auto store = OpenPostgresStore(options, SystemRandom());
  if (!store) {
    state.SkipWithError(store.error().message.c_str());
    return;
  }
  Fixture f(std::move(*store));
  f.policy.max_retained = 1'000'000'000;
  if (!FillHistory(f, state.range(0), true)) {
    state.SkipWithError("filling the history failed");
    return;
  }
  (void)f.store->Query("ANALYZE idem_records");
  ClaimAndFinishLoop(f, state);
}
BENCHMARK(BM_PostgresClaimWithHistory)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->UseRealTime();

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
