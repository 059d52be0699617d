// tests/integration/reconcile_itest.cc — reconciliation of the books end to end: idemd and
// provider-sim processes, `idemctl reconcile` against them, on SQLite and on PostgreSQL. A
// provider that ignores idempotency keys, duplicates injected at the provider, runs repeated,
// run at once and killed mid-run: each extra charge is refunded exactly once.
#include <atomic>
#include <random>
#include <thread>

#include "http/message.h"
#include "idem/clock.h"
#include "server/idemd/config/store_url.h"
#include "server/idemd/payments/books.h"
#include "server/idemd/payments/table.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

// Runs one statement on the store behind `store_url`, as an operator's SQL would.
void ExecSql(const std::string& store_url, const std::string& sql) {
  std::unique_ptr<Store> store = OpenExistingStore(store_url);
  ASSERT_NE(store, nullptr);
  auto txn = store->Begin();
  ASSERT_TRUE(txn.has_value());
  auto done = (*txn)->Exec(sql, {});
  ASSERT_TRUE(done.has_value()) << done.error().message;
  ASSERT_TRUE((*txn)->Commit().has_value());
}

// The rows of one query on the store behind `store_url`.
std::vector<SqlRow> QuerySql(const std::string& store_url, const std::string& sql) {
  std::unique_ptr<Store> store = OpenExistingStore(store_url);
  if (store == nullptr) return {};
  auto rows = store->Query(sql);
  EXPECT_TRUE(rows.has_value()) << rows.error().message;
  return rows ? std::move(*rows) : std::vector<SqlRow>();
}

std::string Now(Millis offset = Millis(0)) {
  return http::Rfc3339(ToUnixMillis(SystemClock().Now() + offset));
}

std::string IdOf(const http::Response& r) {
  return std::string(IdemdTest::ParseObject(r.body)["id"].as_string());
}

std::string ChargeOf(const http::Response& r) {
  return std::string(IdemdTest::ParseObject(r.body)["provider_charge_id"].as_string());
}

class ReconcileTest : public IdemdTest {
 public:
  // The store URL this test's idemd uses; PostgreSQL tests override it.
  virtual std::string StoreUrl() { return "sqlite://" + dir_.File("idem.db"); }

  std::pair<int, std::string> Reconcile(std::vector<std::string> extra = {},
                                        const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> argv{
        "reconcile", "--config", dir_.File("idemd.toml"), "--since", since_, "--until", until_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunIdemctl(argv, env);
  }

  json::array Report() {
    auto [status, out] =
        RunIdemctl({"reconcile", "report", "--config", dir_.File("idemd.toml"), "-o", "json"});
    EXPECT_EQ(status, 0) << out;
    boost::system::error_code ec;
    json::value v = json::parse(out, ec);
    EXPECT_FALSE(ec) << out;
    return v.is_array() ? v.as_array() : json::array();
  }

  // One window for the whole test, as an operator would pass it every time.
  std::string since_ = Now(Millis(-60'000));
  std::string until_ = Now(Millis(60'000));
};

// The core: a provider that ignores keys, one payment, a duplicate charge injected for it. The
// run refunds exactly the extra charge, never the payment's own; a second run refunds nothing;
// the payment shows the refunded duplicate; the report and the audit say what happened.
void DuplicateIsRefundedOnce(ReconcileTest& t) {
  t.ProviderMode(/*ignore_keys=*/true);
  const http::Response paid = t.Pay("books-key-0001", IdemdTest::Body("ORD-BOOKS-1"));
  ASSERT_EQ(paid.status, 201) << paid.body;
  const std::string payment = IdOf(paid);
  const std::string own = ChargeOf(paid);
  const std::string extra = t.InjectCharge(payment, "100.00", "CNY");
  const std::string other_paid =
      IdOf(t.Pay("books-key-0002", IdemdTest::Body("ORD-BOOKS-2", "\"5.00\"")));

  auto [dry, dry_out] = t.Reconcile({"--dry-run"});
  EXPECT_EQ(dry, 0) << dry_out;
  EXPECT_NE(dry_out.find("would refund 100.00"), std::string::npos) << dry_out;
  EXPECT_EQ(t.RefundsOf(extra), 0) << "a dry run refunded";

  auto [ran, out] = t.Reconcile({"-o", "json"});
  ASSERT_EQ(ran, 0) << out;
  json::object summary = IdemdTest::ParseObject(out);
  EXPECT_EQ(summary["charges"].as_int64(), 3) << out;
  EXPECT_EQ(summary["matched"].as_int64(), 2) << out;
  EXPECT_EQ(summary["refunded"].as_int64(), 1) << out;
  EXPECT_EQ(summary["findings_by_class"].as_object()["duplicate"].as_int64(), 1) << out;
  EXPECT_EQ(t.RefundsOf(extra), 1);
  EXPECT_EQ(t.RefundsOf(own), 0) << "the payment's own charge was refunded";

  auto [again, again_out] = t.Reconcile();
  EXPECT_EQ(again, 0) << again_out;
  EXPECT_EQ(t.RefundsOf(extra), 1) << "a second run refunded again";

  const http::Response shown = t.Get("/v1/payments/" + payment);
  ASSERT_EQ(shown.status, 200);
  json::object body = IdemdTest::ParseObject(shown.body);
  ASSERT_TRUE(body.contains("refunded_duplicates")) << shown.body;
  json::object refunded = body["refunded_duplicates"].as_array().at(0).as_object();
  EXPECT_EQ(refunded["charge"].as_string(), extra);
  EXPECT_EQ(refunded["amount"].as_string(), "100.00");
  EXPECT_FALSE(refunded["refund"].as_string().empty());
  EXPECT_EQ(t.Get("/v1/payments/" + other_paid).body.find("refunded_duplicates"), std::string::npos)
      << "a payment without refunds answers as its POST did";

  json::array report = t.Report();
  ASSERT_EQ(report.size(), 1u);
  json::object finding = report[0].as_object();
  EXPECT_EQ(finding["class"].as_string(), "duplicate");
  EXPECT_EQ(finding["charge"].as_string(), extra);
  EXPECT_EQ(finding["payment"].as_string(), payment);
  EXPECT_EQ(finding["action"].as_string(), "refunded");
  EXPECT_NE(finding["instance"].as_string().find("idemctl@"), std::string::npos);

  // The audit trail: the intent, then the refund, each a row naming the charge, the refund and
  // the instance; the second run added none.
  const std::vector<SqlRow> events =
      QuerySql(t.StoreUrl(),
               "SELECT action, refund_id, instance FROM reconcile_events WHERE "
               "charge_id = '" +
                   extra + "' ORDER BY at, action");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(std::get<std::string>(events[0][0]), "refund_pending");
  EXPECT_EQ(std::get<std::string>(events[1][0]), "refunded");
  EXPECT_EQ(std::get<std::string>(events[1][1]), std::string(refunded["refund"].as_string()));
  EXPECT_NE(std::get<std::string>(events[1][2]).find("idemctl@"), std::string::npos);

  // Announced: the payment's success, then the refund of its extra charge, once for both runs.
  const std::vector<OutboxEvent> announced = OutboxEventsAt(t.StoreUrl(), payment);
  ASSERT_EQ(announced.size(), 2u);
  EXPECT_EQ(announced[0].type, "payment.succeeded");
  EXPECT_EQ(announced[1].type, "payment.refunded");
  EXPECT_EQ(announced[1].sequence, 2);
  EXPECT_EQ(announced[1].id, OutboxEventId(payment, "payment.refunded", extra));
  json::object refund = IdemdTest::ParseObject(announced[1].payload)["refund"].as_object();
  EXPECT_EQ(refund["charge_id"].as_string(), extra);
  EXPECT_EQ(refund["refund_id"].as_string(), refunded["refund"].as_string());
  EXPECT_EQ(refund["amount"].as_string(), "100.00");
  EXPECT_EQ(refund["currency"].as_string(), "CNY");
}

TEST_F(ReconcileTest, ADuplicateChargeIsRefundedExactlyOnce) { DuplicateIsRefundedOnce(*this); }

// Two runs of the same window at once (two operators, or two instances): one holds the lease,
// the other is refused or finds the work done; every extra charge is refunded once.
void TwoRunsAtOnceRefundEachDuplicateOnce(ReconcileTest& t) {
  t.ProviderMode(/*ignore_keys=*/true);
  std::vector<std::string> extras;
  for (int i = 0; i < 12; ++i) {
    const http::Response paid = t.Pay("books-both-" + std::to_string(i),
                                      IdemdTest::Body("ORD-BOTH-" + std::to_string(i), "\"3.00\""));
    ASSERT_EQ(paid.status, 201);
    extras.push_back(t.InjectCharge(IdOf(paid), "3.00", "CNY"));
  }
  std::pair<int, std::string> a, b;
  std::thread first([&] { a = t.Reconcile(); });
  std::thread second([&] { b = t.Reconcile(); });
  first.join();
  second.join();
  EXPECT_TRUE(a.first == 0 || b.first == 0) << a.second << b.second;
  for (const auto& run : {a, b}) {
    if (run.first != 0) {
      EXPECT_NE(run.second.find("another reconciliation holds the lease"), std::string::npos)
          << run.second;
    }
  }
  auto [last, out] = t.Reconcile();  // whatever the refused one did not do
  EXPECT_EQ(last, 0) << out;
  for (const std::string& extra : extras) EXPECT_EQ(t.RefundsOf(extra), 1) << extra;
}

TEST_F(ReconcileTest, TwoRunsAtOnceRefundEachDuplicateOnce) {
  TwoRunsAtOnceRefundEachDuplicateOnce(*this);
}

// A run killed right after a refund left, before it was recorded (kill -9 at that line): the
// next run repeats nothing the provider already did, and finishes the window.
TEST_F(ReconcileTest, ARunKilledAfterARefundRefundsNothingTwice) {
  // Long enough for the run just after the crash to meet the lease even in a sanitizer build.
  StartIdemd({.extra_tables = "[reconciliation]\nlease_ms = 5000\n"});
  ProviderMode(/*ignore_keys=*/true);
  std::vector<std::string> extras;
  for (int i = 0; i < 3; ++i) {
    const http::Response paid =
        Pay("books-kill-" + std::to_string(i), Body("ORD-KILL-" + std::to_string(i), "\"7.00\""));
    ASSERT_EQ(paid.status, 201);
    extras.push_back(InjectCharge(IdOf(paid), "7.00", "CNY"));
  }
  auto [crashed, crash_out] = Reconcile({}, {{"IDEM_FAILPOINTS", "reconcile_after_refund=crash"}});
  EXPECT_EQ(crashed, 86) << "the failpoint's exit status: " << crash_out;
  int refunded = 0;
  for (const std::string& extra : extras) refunded += static_cast<int>(RefundsOf(extra));
  EXPECT_EQ(refunded, 1) << "one refund left before the crash";
  json::array report = Report();
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].as_object()["action"].as_string(), "refund_pending");

  auto [early, early_out] = Reconcile();
  EXPECT_EQ(early, 1) << "the crashed runner's lease still held: " << early_out;
  // Once its lease has run out the next run takes the window over where it stopped.
  std::this_thread::sleep_for(std::chrono::milliseconds(5200));
  auto [resumed, out] = Reconcile();
  EXPECT_EQ(resumed, 0) << out;
  EXPECT_NE(out.find("(resumed)"), std::string::npos) << out;
  for (const std::string& extra : extras) EXPECT_EQ(RefundsOf(extra), 1) << extra;
  report = Report();
  ASSERT_EQ(report.size(), 3u);
  for (const json::value& f : report) EXPECT_EQ(f.as_object().at("action").as_string(), "refunded");
}

// A charge whose reference is no payment is an orphan: reported, never refunded unless the
// configuration says so, and then only once older than the grace period, and only if its
// reference is shaped like an idemd payment id: a charge someone else made on a shared provider
// account (reference "ext-order-77") is never idemd's to refund.
TEST_F(ReconcileTest, AnOrphanIsReportedThenRefundedAfterItsGraceWhenConfigured) {
  const std::string young = InjectCharge("pay_00000000000000000000000a", "9.00", "CNY");
  const std::string old =
      InjectCharge("pay_00000000000000000000000b", "4.00", "CNY", Now(Millis(-30'000)));
  const std::string foreign = InjectCharge("ext-order-77", "6.00", "CNY", Now(Millis(-30'000)));
  auto [ran, out] = Reconcile();
  EXPECT_EQ(ran, 0) << out;
  EXPECT_NE(out.find("orphan"), std::string::npos) << out;
  EXPECT_EQ(RefundsOf(young) + RefundsOf(old) + RefundsOf(foreign), 0)
      << "refunded without being configured to";

  StartIdemd(
      {.extra_tables = "[reconciliation]\nrefund_orphans = true\norphan_grace_ms = 20000\n"});
  auto [again, again_out] = Reconcile();
  EXPECT_EQ(again, 0) << again_out;
  EXPECT_EQ(RefundsOf(old), 1) << again_out;
  EXPECT_EQ(RefundsOf(young), 0) << "refunded within its grace period";
  EXPECT_EQ(RefundsOf(foreign), 0) << "refunded a charge that is not idemd's";
  json::array report = Report();
  ASSERT_EQ(report.size(), 3u);
  for (const json::value& v : report) {
    const json::object& f = v.as_object();
    EXPECT_EQ(f.at("class").as_string(), "orphan");
    EXPECT_EQ(f.at("action").as_string(),
              f.at("charge").as_string() == old ? "refunded" : "reported");
  }
}

// A payment that succeeded locally with no charge at the provider is missing; one whose charge
// differs from it in amount is mismatched. Both are reported, never "fixed", and make idemctl
// exit 5 and idemd count them.
void MissingAndMismatchedAreReported(ReconcileTest& t) {
  const http::Response a = t.Pay("books-miss-1", IdemdTest::Body("ORD-MISS-1"));
  const http::Response b = t.Pay("books-miss-2", IdemdTest::Body("ORD-MISS-2"));
  ASSERT_EQ(a.status, 201);
  ASSERT_EQ(b.status, 201);
  const int64_t now = ToUnixMillis(SystemClock().Now());
  // A payment recorded as succeeded whose charge the provider never made (a bug, a restore).
  ExecSql(t.StoreUrl(),
          "INSERT INTO payments (id, tenant, merchant_order_no, amount_minor, currency, status, "
          "provider_charge_id, created_at, updated_at) VALUES ('pay_ghost', 'acme', 'ORD-GHOST', "
          "500, 'CNY', 'succeeded', 'ch_ghost', " +
              std::to_string(now) + ", " + std::to_string(now) + ")");
  ExecSql(t.StoreUrl(), "UPDATE payments SET amount_minor = 9999 WHERE id = '" + IdOf(b) + "'");
  auto [ran, out] = t.Reconcile({"-o", "json"});
  EXPECT_EQ(ran, 5) << out;
  json::object by_class = IdemdTest::ParseObject(out)["findings_by_class"].as_object();
  EXPECT_EQ(by_class["missing"].as_int64(), 1) << out;
  EXPECT_EQ(by_class["mismatched"].as_int64(), 1) << out;
  EXPECT_EQ(by_class["duplicate"].as_int64(), 0) << out;
  EXPECT_EQ(t.RefundsOf(ChargeOf(b)), 0) << "a mismatched charge was refunded";
  for (const json::value& v : t.Report()) {
    const json::object& f = v.as_object();
    EXPECT_EQ(f.at("action").as_string(), "reported");
    if (f.at("class").as_string() == "missing") {
      EXPECT_EQ(f.at("payment").as_string(), "pay_ghost");
    } else {
      EXPECT_EQ(f.at("charge").as_string(), ChargeOf(b));
    }
  }
}

TEST_F(ReconcileTest, MissingAndMismatchedPaymentsAreReportedNeverFixed) {
  MissingAndMismatchedAreReported(*this);
}

// idemd's own periodic job finds and refunds a duplicate with nobody running idemctl, and counts
// what it found.
TEST_F(ReconcileTest, IdemdsPeriodicJobRefundsADuplicate) {
  StartIdemd(
      {.extra_tables = "[reconciliation]\ninterval_ms = 300\nwindow_ms = 600000\nlag_ms = 0\n"});
  ProviderMode(/*ignore_keys=*/true);
  const http::Response paid = Pay("books-periodic-1", Body("ORD-PERIODIC-1"));
  ASSERT_EQ(paid.status, 201);
  const std::string extra = InjectCharge(IdOf(paid), "100.00", "CNY");
  int64_t refunds = 0;
  for (int i = 0; i < 50 && refunds == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    refunds = RefundsOf(extra);
  }
  EXPECT_EQ(refunds, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // more runs, no more refunds
  EXPECT_EQ(RefundsOf(extra), 1);
  EXPECT_EQ(RefundsOf(ChargeOf(paid)), 0);
  const std::string metrics = Get("/metrics", "").body;
  EXPECT_NE(metrics.find("idem_reconcile_findings_total{class=\"duplicate\"} 1"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("idem_reconcile_refunds_total{outcome=\"refunded\"} 1"), std::string::npos)
      << metrics;
  // The payment's payment.succeeded and the books' payment.refunded, each written once.
  EXPECT_NE(metrics.find("\nidem_outbox_written_total 2\n"), std::string::npos) << metrics;
}

// A store made before the books had migrations of their own, when the payments' version 3 made
// their tables, opens with them: the books' version 1 finds its tables there and keeps what they
// hold; a new store gets them from it.
void BooksTakeOverTheirTables(const std::string& old_url, const std::string& new_url) {
  std::vector<Migration> before = idemd::PaymentsMigrations();
  std::string v3 = idemd::BooksMigrations().at(0).sql;  // as version 3 wrote it: no IF NOT EXISTS
  for (std::size_t at; (at = v3.find(" IF NOT EXISTS")) != std::string::npos;) v3.erase(at, 14);
  before.insert(before.begin() + 2, Migration{3, v3});
  ASSERT_EQ(before.at(1).version, 2);
  ASSERT_EQ(before.at(3).version, 4);
  auto open = [](const std::string& url, std::vector<AppMigrations> apps) {
    idemd::StoreUrlOptions options;
    options.pool_size = 1;
    options.apps = std::move(apps);
    return idemd::OpenStoreUrl(url, options);
  };
  {
    auto old = open(old_url, {{"payments", before}});
    ASSERT_TRUE(old.has_value()) << old.error().message;
  }
  ExecSql(old_url,
          "INSERT INTO reconcile_runs (id, since_ms, until_ms, cursor, state, instance, charges, "
          "started_at, finished_at) VALUES ('run-1', 1, 2, '', 'done', 'old', 3, 4, 5)");
  auto now = open(old_url, idemd::IdemdMigrations());
  ASSERT_TRUE(now.has_value()) << now.error().message;
  auto count = [](const std::string& url, const std::string& sql) {
    const std::vector<SqlRow> rows = QuerySql(url, sql);
    return rows.size() == 1 && std::holds_alternative<int64_t>(rows[0].at(0))
               ? std::get<int64_t>(rows[0][0])
               : -1;
  };
  EXPECT_EQ(count(old_url, "SELECT count(*) FROM reconcile_runs WHERE id = 'run-1'"), 1);
  EXPECT_EQ(count(old_url, "SELECT max(version) FROM idem_schema WHERE component = 'books'"), 1);
  EXPECT_EQ(count(old_url, "SELECT max(version) FROM idem_schema WHERE component = 'payments'"), 4);

  auto fresh = open(new_url, idemd::IdemdMigrations());
  ASSERT_TRUE(fresh.has_value()) << fresh.error().message;
  EXPECT_EQ(count(new_url, "SELECT count(*) FROM reconcile_findings"), 0);
  EXPECT_EQ(count(new_url,
                  "SELECT count(*) FROM idem_schema WHERE component = 'payments' AND "
                  "version = 3"),
            0)
      << "a new store never runs the payments' version 3";
}

TEST(BooksMigration, TheBooksTakeOverTheirTablesOnSqlite) {
  testing::TempDir dir;
  BooksTakeOverTheirTables("sqlite://" + dir.File("old.db"), "sqlite://" + dir.File("new.db"));
}

TEST(BooksMigration, TheBooksTakeOverTheirTablesOnPostgres) {
  IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
  BooksTakeOverTheirTables(FreshPostgresStoreUrl(), FreshPostgresStoreUrl());
}

// The same on PostgreSQL, with two idemd instances' worth of runners.
class PostgresReconcileTest : public ReconcileTest {
 public:
  void SetUp() override {
    IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
    ReconcileTest::SetUp();
    store_url_ = FreshPostgresStoreUrl();
    StartIdemd({.store_url = store_url_});
  }
  std::string StoreUrl() override { return store_url_; }
  std::string store_url_;
};

TEST_F(PostgresReconcileTest, ADuplicateChargeIsRefundedExactlyOnce) {
  DuplicateIsRefundedOnce(*this);
}

TEST_F(PostgresReconcileTest, TwoRunsAtOnceRefundEachDuplicateOnce) {
  TwoRunsAtOnceRefundEachDuplicateOnce(*this);
}

TEST_F(PostgresReconcileTest, MissingAndMismatchedPaymentsAreReportedNeverFixed) {
  MissingAndMismatchedAreReported(*this);
}

}  // namespace
}  // namespace idem::itest
