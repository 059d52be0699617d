// server/idemd/metrics_test.cc — the exposition: bucket bounds from the configured timeouts,
// series present from the start, one HELP and TYPE per family, the gauges and process metrics.
#include "server/idemd/metrics.h"

#include <gtest/gtest.h>

#include <ctime>
#include <map>
#include <set>
#include <sstream>

#include "server/idemd/config/config.h"
#include "testing/fakes.h"
#include "testing/memory_store.h"

namespace idem::idemd {
namespace {

// The value of one series (name and labels as rendered), or nullopt when it is not rendered.
std::optional<double> Value(const std::string& text, const std::string& series) {
  const std::size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return std::nullopt;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(MetricsTest, BucketsReachTwiceTheLongestTimeoutAndNeverStopBelowTenSeconds) {
  const std::vector<double> five = LatencyBuckets(Millis(5000));
  EXPECT_EQ(five.front(), 0.0005);
  EXPECT_EQ(five.back(), 10.0);
  EXPECT_TRUE(std::is_sorted(five.begin(), five.end()));
  EXPECT_EQ(LatencyBuckets(Millis(10000)).back(), 25.0);
  EXPECT_EQ(LatencyBuckets(Millis(30000)).back(), 100.0) << "60 s needed: 50 is short";
  EXPECT_EQ(LatencyBuckets(Millis(50000)).back(), 100.0);
  EXPECT_EQ(LatencyBuckets(Millis(100)).back(), 10.0);
}

TEST(MetricsTest, TheLongestTimeoutIsTheLongestTheConfigurationSets) {
  Config config;  // provider 5 s; wait_max, statement and unmatched upstream 10 s
  EXPECT_EQ(LongestTimeout(config), Millis(10000));
  config.gateway.routes.push_back(GatewayRoute{});
  config.gateway.routes.back().timeout = Millis(45000);
  EXPECT_EQ(LongestTimeout(config), Millis(45000));
  config.provider.timeout = Millis(60000);
  EXPECT_EQ(LongestTimeout(config), Millis(60000));
  config.store.timeouts.statement = Millis(120000);
  EXPECT_EQ(LongestTimeout(config), Millis(120000));
}

// The outcome labels dashboards and alerts match on (deploy/): each outcome keeps its own.
TEST(MetricsTest, EachRequestOutcomeKeepsItsPublishedLabel) {
  const std::vector<std::pair<RequestOutcome, std::string_view>> published = {
      {RequestOutcome::kAccepted, "accepted"},
      {RequestOutcome::kError, "error"},
      {RequestOutcome::kExecuted, "executed"},
      {RequestOutcome::kInProgress, "in_progress"},
      {RequestOutcome::kInvalid, "invalid"},
      {RequestOutcome::kMismatch, "mismatch"},
      {RequestOutcome::kQuota, "quota"},
      {RequestOutcome::kReplayed, "replayed"},
      {RequestOutcome::kUnauthorized, "unauthorized"},
      {RequestOutcome::kPassedThrough, "passed_through"},
      {RequestOutcome::kForwardedWithoutKey, "forwarded_without_key"},
  };
  for (const auto& [outcome, label] : published) EXPECT_EQ(RequestOutcomeName(outcome), label);
  Metrics metrics({.longest_timeout = Millis(5000), .version = "1", .store = "sqlite"});
  metrics.DeclareRoute("r");
  metrics.CountRequest("r", RequestOutcome::kPassedThrough);
  const std::string text = metrics.Render();
  for (std::size_t i = 0; i < kFilterOutcomes; ++i) {
    const std::string series =
        "idem_requests_total{route=\"r\",outcome=\"" + std::string(published[i].second) + "\"} 0";
    EXPECT_NE(text.find(series), std::string::npos) << series << " is not rendered from the start";
  }
  EXPECT_NE(text.find(R"(idem_requests_total{route="r",outcome="passed_through"} 1)"),
            std::string::npos);
  EXPECT_EQ(text.find("forwarded_without_key"), std::string::npos) << "counted by no route";
}

TEST(MetricsTest, EverySeriesWithKnownLabelsIsRenderedFromTheStartAsZero) {
  Metrics metrics({.longest_timeout = Millis(5000), .version = "1.2.3", .store = "sqlite"});
  metrics.DeclareRoute("payments.create");
  metrics.DeclareUpstream("orders.create");
  const std::string text = "\n" + metrics.Render();
  for (const std::string series : {
           R"(idem_build_info{version="1.2.3",store="sqlite"})",
           R"(idem_requests_total{route="payments.create",outcome="executed"})",
           R"(idem_requests_total{route="payments.create",outcome="replayed"})",
           R"(idem_requests_total{route="payments.create",outcome="mismatch"})",
           R"(idem_requests_total{route="payments.create",outcome="in_progress"})",
           R"(idem_requests_total{route="payments.create",outcome="error"})",
           R"(idem_store_operation_duration_seconds_count{operation="claim"})",
           R"(idem_store_operation_duration_seconds_count{operation="commit"})",
           R"(idem_store_operation_duration_seconds_count{operation="advance_covered"})",
           R"(idem_provider_request_duration_seconds_count{operation="charge"})",
           R"(idem_provider_request_duration_seconds_count{operation="lookup"})",
           R"(idem_provider_request_duration_seconds_count{operation="refund"})",
           R"(idem_upstream_request_duration_seconds_bucket{route="orders.create",le="10"})",
           R"(idem_records{state="PROCESSING"})",
           R"(idem_records{state="FAILED_RETRYABLE"})",
           "idem_records_retained",
           "idem_oldest_processing_record_age_seconds",
           "idem_http_requests_in_flight",
           "idem_http_requests_parked",
           "idem_fencing_rejections_total",
           "idem_redis_fallbacks_total",
           "idem_reconciler_runs_total",
           "idem_reconciler_run_failures_total",
           R"(idem_reconciler_records_total{result="unknown"})",
           "idem_reconcile_runs_total",
           "idem_reconcile_run_failures_total",
           R"(idem_reconcile_findings_total{class="missing"})",
       }) {
    const std::optional<double> value = Value(text, series);
    ASSERT_TRUE(value.has_value()) << "missing: " << series << "\n" << text;
    EXPECT_EQ(*value, series.rfind("idem_build_info", 0) == 0 ? 1 : 0) << series;
  }
}

// promtool checks the same of a running idemd (tests/integration/metrics_itest.cc); this says
// where a mistake is without it.
TEST(MetricsTest, EachFamilyHasOneHelpAndOneTypeAndCountersEndInTotal) {
  Metrics metrics;
  metrics.DeclareRoute("payments.create");
  metrics.ObserveHttpRequest("payments.create", 201, 0.01);
  metrics.ObserveUpstream("unmatched", 0.2);
  std::map<std::string, std::string> types;
  std::set<std::string> helps;
  std::istringstream lines(metrics.Render());
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string hash, kind, name, type;
    words >> hash >> kind >> name >> type;
    if (hash == "#" && kind == "TYPE") {
      EXPECT_TRUE(types.emplace(name, type).second) << "two TYPE lines: " << name;
      EXPECT_EQ(name.ends_with("_total"), type == "counter") << name;
      if (type == "histogram") {
        // Latencies in seconds; the one count histogram counts deliveries, a unitless count.
        EXPECT_TRUE(name.ends_with("_seconds") || name == "idem_consumer_deliveries") << name;
      }
    } else if (hash == "#" && kind == "HELP") {
      EXPECT_TRUE(helps.insert(name).second) << "two HELP lines: " << name;
    } else {
      std::string family = line.substr(0, line.find_first_of("{ "));
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string base = family.substr(0, family.size() - std::strlen(suffix));
        if (family.ends_with(suffix) && types.count(base) && types[base] == "histogram") {
          family = base;
        }
      }
      EXPECT_TRUE(types.count(family)) << "a sample before its TYPE line: " << line;
    }
  }
  for (const auto& [name, type] : types) EXPECT_TRUE(helps.count(name)) << "no HELP: " << name;
}

TEST(MetricsTest, AnObservationPastEveryBucketCountsInInfOnlyAndBucketsAreCumulative) {
  Metrics metrics({.longest_timeout = Millis(5000), .version = "", .store = ""});
  metrics.ObserveProvider(ProviderOperation::kCharge, 12.0);
  metrics.ObserveProvider(ProviderOperation::kCharge, 0.003);
  const std::string text = "\n" + metrics.Render();
  const std::string charge = R"(idem_provider_request_duration_seconds_bucket{operation="charge",)";
  EXPECT_EQ(Value(text, charge + R"(le="0.0025"})"), 0);
  EXPECT_EQ(Value(text, charge + R"(le="0.005"})"), 1);
  EXPECT_EQ(Value(text, charge + R"(le="10"})"), 1);
  EXPECT_EQ(Value(text, charge + R"(le="+Inf"})"), 2);
  EXPECT_EQ(Value(text, R"(idem_provider_request_duration_seconds_sum{operation="charge"})"),
            12.003);
  EXPECT_EQ(Value(text, R"(idem_provider_request_duration_seconds_count{operation="charge"})"), 2);
}

TEST(MetricsTest, TheGaugesShowTheLastCensusAndTheServersLoad) {
  Metrics metrics;
  RecordCensus census;
  census.processing = 3;
  census.failed_retryable = 2;
  census.retained = 40;
  census.oldest_processing_age = Millis(90500);
  metrics.SetRecords(census, Timestamp(Millis(1'700'000'000'000)));
  metrics.WatchServer([] { return Metrics::ServerLoad{.in_flight = 7, .parked = 4}; });
  const std::string text = "\n" + metrics.Render();
  EXPECT_EQ(Value(text, R"(idem_records{state="PROCESSING"})"), 3);
  EXPECT_EQ(Value(text, R"(idem_records{state="FAILED_RETRYABLE"})"), 2);
  EXPECT_EQ(Value(text, "idem_records_retained"), 40);
  EXPECT_EQ(Value(text, "idem_oldest_processing_record_age_seconds"), 90.5);
  EXPECT_EQ(Value(text, "idem_records_census_timestamp_seconds"), 1'700'000'000);
  EXPECT_EQ(Value(text, "idem_http_requests_in_flight"), 7);
  EXPECT_EQ(Value(text, "idem_http_requests_parked"), 4);
}

// PROCESSING records of a route this instance does not serve (a gateway route removed from the
// config) are counted by route and logged whenever their count changes; a served route's are not.
TEST(MetricsTest, TheCensusCountsRecordsOfRoutesNoLongerServed) {
  testing::FakeClock clock;
  testing::SeededRandom random(3);
  std::unique_ptr<Store> store = testing::MakeMemoryStore(clock, random);
  auto claim = [&](const std::string& route, const std::string& key) {
    ClaimSpec spec;
    spec.scope = *Scope{"acme", "alice", route, key}.Hash();
    spec.tenant = "acme";
    spec.user = "alice";
    spec.route = route;
    auto txn = store->Begin();
    ASSERT_TRUE(txn.has_value());
    ASSERT_TRUE((*txn)->Claim(spec).has_value());
    ASSERT_TRUE((*txn)->Commit().has_value());
  };
  claim("gw.gone", "key-00000001");
  claim("gw.gone", "key-00000002");
  claim("payments.create", "key-00000003");
  Metrics metrics;
  const auto served = [](std::string_view route) { return route == "payments.create"; };
  TakeCensus(*store, metrics, clock, served);
  const std::string text = "\n" + metrics.Render();
  EXPECT_EQ(Value(text, R"(idem_records_unserved{route="gw.gone"})"), 2);
  EXPECT_EQ(text.find(R"(idem_records_unserved{route="payments.create"})"), std::string::npos);
  EXPECT_EQ(Value(text, R"(idem_records{state="PROCESSING"})"), 3);

  EXPECT_TRUE(metrics.SetUnserved({{"gw.gone", 2}}).empty()) << "unchanged: not logged again";
  EXPECT_EQ(metrics.SetUnserved({}), (std::map<std::string, int64_t>{{"gw.gone", 0}}));
}

TEST(MetricsTest, ProcessMetricsAreReadFromProc) {
  const std::string text = "\n" + Metrics().Render();
  const double now = static_cast<double>(std::time(nullptr));
  const std::optional<double> started = Value(text, "process_start_time_seconds");
  ASSERT_TRUE(started.has_value());
  EXPECT_GT(*started, now - 3600) << "this test process started within the hour";
  EXPECT_LE(*started, now + 2) << "the boot time is in whole seconds";
  EXPECT_GT(Value(text, "process_resident_memory_bytes").value_or(0), 1 << 20);
  EXPECT_GT(Value(text, "process_open_fds").value_or(0), 2);
  EXPECT_GT(Value(text, "process_max_fds").value_or(0),
            Value(text, "process_open_fds").value_or(0));
  EXPECT_GE(Value(text, "process_cpu_seconds_total").value_or(-1), 0);
}

}  // namespace
}  // namespace idem::idemd
