// tests/integration/metrics_itest.cc — a real idemd's /metrics as Prometheus reads it: promtool
// accepts the exposition, every series with known labels is there from the start, the records
// gauges count what the store holds; and what deploy/ ships for operators (the Grafana dashboard,
// the alerting rules) refers only to series idemd exposes and passes promtool.
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

constexpr const char* kPromtool = "/usr/bin/promtool";

// promtool comes with Debian's prometheus package (scripts/packages.txt): missing, the test fails
// under IDEM_REQUIRE_SERVICES (as CI runs) and is skipped otherwise.
#define IDEM_NEED_PROMTOOL()                                                   \
  do {                                                                         \
    if (access(kPromtool, X_OK) != 0) {                                        \
      IDEM_SKIP_OR_FAIL("no " << kPromtool << " (Debian package prometheus)"); \
    }                                                                          \
  } while (false)

std::string Deploy(const std::string& path) {
  return std::string(IDEM_SOURCE_DIR) + "/deploy/" + path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value of one series (name and labels as rendered), or nullopt when it is not rendered.
std::optional<double> Value(const std::string& text, const std::string& series) {
  const std::size_t at = ("\n" + text).find("\n" + series + " ");
  if (at == std::string::npos) return std::nullopt;
  return std::stod(text.substr(at + series.size() + 1));
}

// The names of every sample in an exposition (histograms' _bucket, _sum and _count apart).
std::set<std::string> SampleNames(const std::string& text) {
  std::set<std::string> names;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    names.insert(line.substr(0, line.find_first_of("{ ")));
  }
  return names;
}

// The metric names (idem_..., process_...) that `text` (PromQL, or a file of it) refers to.
std::set<std::string> MetricNamesIn(const std::string& text) {
  static const std::regex kName(R"(\b(idem|process)_[a-zA-Z0-9_:]*)");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kName);
       it != std::sregex_iterator(); ++it) {
    names.insert(it->str());
  }
  return names;
}

// Every string in a JSON document.
void Strings(const json::value& v, std::vector<std::string>& out) {
  if (v.is_string()) out.emplace_back(v.as_string());
  if (v.is_array()) {
    for (const json::value& e : v.as_array()) Strings(e, out);
  }
  if (v.is_object()) {
    for (const auto& member : v.as_object()) Strings(member.value(), out);
  }
}

class MetricsTest : public IdemdTest {
 protected:
  // promtool with `args` in `cwd`, standard input from `input_file` when given: its exit status
  // and what it printed (both streams).
  std::pair<int, std::string> Promtool(const std::string& args, const std::string& cwd,
                                       const std::string& input_file = "") {
    const std::string out = dir_.File("promtool.out");
    std::string command = std::string("exec ") + kPromtool + " " + args;
    if (!input_file.empty()) command += " < '" + input_file + "'";
    command += " > '" + out + "' 2>&1";
    auto child = testing::ChildProcess::Spawn({"/bin/sh", "-c", command}, {}, cwd,
                                              dir_.File("promtool.err"));
    EXPECT_TRUE(child.has_value()) << child.error().message;
    if (!child) return {-1, ""};
    const std::optional<int> status = child->Wait(std::chrono::seconds(60));
    EXPECT_TRUE(status.has_value()) << "promtool did not finish";
    const int code = status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
    return {code, ReadFile(out)};
  }

  // /metrics, scraped until `ok` holds of it or 5 s passed: a request's latency is observed just
  // after its answer was written, so its client may scrape before that.
  std::string ScrapeUntil(const std::function<bool(const std::string&)>& ok) {
    std::string text;
    for (int i = 0; i < 100; ++i) {
      text = Get("/metrics", "").body;
      if (ok(text)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return text;
  }

  // `exposition` through `promtool check metrics`: lint problems fail the test.
  void ExpectPromtoolAccepts(const std::string& exposition) {
    const std::string file = dir_.File("exposition.txt");
    std::ofstream(file) << exposition;
    auto [code, printed] = Promtool("check metrics", dir_.path().string(), file);
    EXPECT_EQ(code, 0) << printed;
    EXPECT_EQ(printed, "") << "promtool's lint:\n" << printed;
  }

  // idemd with a gateway route whose timeout (30 s) is the longest of the configuration.
  void StartWithRoute() {
    IdemdOptions options;
    options.extra_tables =
        "[[routes]]\nname = \"orders.create\"\nmatch = \"POST /v1/orders\"\n"
        "upstream = \"http://127.0.0.1:" +
        std::to_string(provider_url_.port) + "\"\ntimeout_ms = 30000\nlease_ms = 40000\n";
    StartIdemd(options);
  }
};

TEST_F(MetricsTest, TheExpositionPassesPromtoolWithEverySeriesFromTheStart) {
  IDEM_NEED_PROMTOOL();
  StartWithRoute();
  const http::Response first = Get("/metrics", "");
  ASSERT_EQ(first.status, 200);
  ExpectPromtoolAccepts(first.body);

  // Before any request: every series whose labels are known, as 0.
  for (const std::string series : {
           R"(idem_requests_total{route="payments.create",outcome="executed"})",
           R"(idem_requests_total{route="payments.create",outcome="replayed"})",
           R"(idem_requests_total{route="orders.create",outcome="executed"})",
           R"(idem_store_operation_duration_seconds_count{operation="finish"})",
           R"(idem_store_operation_duration_seconds_count{operation="advance_covered"})",
           R"(idem_provider_request_duration_seconds_count{operation="charge"})",
           R"(idem_provider_request_duration_seconds_count{operation="lookup"})",
           R"(idem_upstream_request_duration_seconds_count{route="orders.create"})",
           R"(idem_records{state="PROCESSING"})",
           R"(idem_records{state="FAILED_RETRYABLE"})",
           "idem_records_retained",
           "idem_oldest_processing_record_age_seconds",
           "idem_http_requests_parked",
           "idem_fencing_rejections_total",
           "idem_redis_fallbacks_total",
           "idem_lease_takeovers_total",
           "idem_reconciler_runs_total",
           "idem_reconciler_run_failures_total",
           "idem_reconcile_run_failures_total",
       }) {
    EXPECT_EQ(Value(first.body, series), 0) << series << "\n" << first.body;
  }
  EXPECT_EQ(Value(first.body, "idem_http_requests_in_flight"), 1) << "this scrape";
  EXPECT_EQ(Value(first.body, R"(idem_build_info{version=")" IDEM_VERSION R"(",store="sqlite"})"),
            1)
      << first.body;
  EXPECT_GT(Value(first.body, "idem_records_census_timestamp_seconds").value_or(0), 1.7e9)
      << "the census ran at start";
  EXPECT_GT(Value(first.body, "process_start_time_seconds").value_or(0), 1.7e9);
  EXPECT_GT(Value(first.body, "process_open_fds").value_or(0), 3);
  // The buckets reach twice the route's 30 s timeout: 100 s is the first step past 60 s.
  const std::string claim = R"(idem_store_operation_duration_seconds_bucket{operation="claim",)";
  EXPECT_TRUE(Value(first.body, claim + R"(le="100"})").has_value()) << first.body;
  EXPECT_FALSE(Value(first.body, claim + R"(le="250"})").has_value());

  // A payment and its replay.
  ASSERT_EQ(Pay("metrics-key-1", Body("ORD-METRICS-1")).status, 201);
  ASSERT_EQ(Pay("metrics-key-1", Body("ORD-METRICS-1")).status, 201);
  const std::string after = ScrapeUntil([](const std::string& text) {
    return Value(
               text,
               R"(idem_http_request_duration_seconds_count{route="payments.create",code="201"})") ==
           2;
  });
  ExpectPromtoolAccepts(after);
  EXPECT_EQ(Value(after, R"(idem_requests_total{route="payments.create",outcome="executed"})"), 1);
  EXPECT_EQ(Value(after, R"(idem_requests_total{route="payments.create",outcome="replayed"})"), 1);
  EXPECT_EQ(
      Value(after,
            R"(idem_http_request_duration_seconds_count{route="payments.create",code="201"})"),
      2);
  EXPECT_GE(Value(after, R"(idem_http_request_duration_seconds_count{route="metrics",code="200"})")
                .value_or(0),
            1);
  EXPECT_EQ(Value(after, R"(idem_provider_request_duration_seconds_count{operation="charge"})"), 1);
  EXPECT_GE(
      Value(after, R"(idem_store_operation_duration_seconds_count{operation="claim"})").value_or(0),
      1);
  EXPECT_GE(Value(after, R"(idem_store_operation_duration_seconds_count{operation="finish"})")
                .value_or(0),
            1);
  EXPECT_GE(Value(after, R"(idem_store_operation_duration_seconds_count{operation="commit"})")
                .value_or(0),
            2);
}

// The records gauges count what the store holds: a payment whose idemd died after the charge
// left stays PROCESSING, and the census of the restarted idemd sees it, and its age.
TEST_F(MetricsTest, TheRecordsGaugesCountAProcessingRecordLeftByACrash) {
  StartIdemd({.env = {{"IDEM_FAILPOINTS", "after_provider_charge=stall:60000"}}});
  std::thread doomed([&] {
    http::Request request{"POST", "/v1/payments", {}, Body("ORD-METRICS-CRASH")};
    request.headers.Set("Authorization", std::string("Bearer ") + kAlice);
    request.headers.Set("Content-Type", "application/json");
    request.headers.Set("Idempotency-Key", "metrics-crash-key");
    (void)http::Call(idemd_url_, std::move(request));  // never answered: idemd dies
  });
  for (int i = 0; i < 100 && TotalCharges() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(TotalCharges(), 1) << "the provider was never reached";
  KillIdemd();
  doomed.join();

  StartIdemd();
  ASSERT_EQ(Pay("metrics-done-key", Body("ORD-METRICS-DONE")).status, 201);
  const std::string text = Get("/metrics", "").body;
  EXPECT_EQ(Value(text, R"(idem_records{state="PROCESSING"})"), 1) << text;
  EXPECT_EQ(Value(text, R"(idem_records{state="FAILED_RETRYABLE"})"), 0);
  EXPECT_EQ(Value(text, "idem_records_retained"), 1) << "the census ran before the second payment";
  const double age = Value(text, "idem_oldest_processing_record_age_seconds").value_or(-1);
  EXPECT_GT(age, 0);
  EXPECT_LT(age, 60);
}

// The dashboard and the alerts refer only to series a running idemd exposes (names, with the
// _bucket, _sum, _count of histograms); the dashboard is JSON Grafana can import.
TEST_F(MetricsTest, TheDashboardAndTheAlertsUseOnlySeriesIdemdExposes) {
  StartWithRoute();
  // A scrape observed, so that idem_http_request_duration_seconds has a series.
  const std::set<std::string> exposed = SampleNames(ScrapeUntil([](const std::string& text) {
    return SampleNames(text).count("idem_http_request_duration_seconds_bucket") > 0;
  }));
  ASSERT_TRUE(exposed.count("idem_http_request_duration_seconds_bucket"));

  boost::system::error_code ec;
  const json::value dashboard = json::parse(ReadFile(Deploy("grafana/idem.json")), ec);
  ASSERT_FALSE(ec) << "deploy/grafana/idem.json is not JSON: " << ec.message();
  ASSERT_TRUE(dashboard.is_object());
  EXPECT_EQ(dashboard.at("uid"), "idem-idemd");
  std::set<std::string> used;
  int queries = 0;
  for (const json::value& panel : dashboard.at("panels").as_array()) {
    if (panel.at("type") == "row") continue;
    ASSERT_TRUE(panel.as_object().contains("targets")) << json::serialize(panel);
    for (const json::value& target : panel.at("targets").as_array()) {
      const std::string expr(target.at("expr").as_string());
      EXPECT_FALSE(MetricNamesIn(expr).empty()) << "a query of no idem series: " << expr;
      ++queries;
    }
  }
  EXPECT_GE(queries, 20);
  std::vector<std::string> strings;
  Strings(dashboard, strings);
  for (const std::string& s : strings) {
    for (const std::string& name : MetricNamesIn(s)) used.insert(name);
  }
  for (const std::string& name : MetricNamesIn(ReadFile(Deploy("prometheus/alerts.yml")))) {
    used.insert(name);
  }
  for (const std::string& name : used) {
    EXPECT_TRUE(exposed.count(name)) << name << " is not a series idemd exposes";
  }
  // What the dashboard must show (records by state, in flight, parked, fallbacks, latencies).
  for (const char* name :
       {"idem_records", "idem_http_requests_in_flight", "idem_http_requests_parked",
        "idem_redis_fallbacks_total", "idem_store_operation_duration_seconds_bucket",
        "idem_provider_request_duration_seconds_bucket",
        "idem_http_request_duration_seconds_count"}) {
    EXPECT_TRUE(used.count(name)) << "the dashboard does not show " << name;
  }
}

// promtool checks the rules and runs their unit tests (deploy/prometheus/alerts_test.yml).
TEST_F(MetricsTest, TheAlertingRulesPassPromtoolAndTheirUnitTests) {
  IDEM_NEED_PROMTOOL();
  const std::string dir = Deploy("prometheus");
  auto [checked, check_output] = Promtool("check rules alerts.yml", dir);
  EXPECT_EQ(checked, 0) << check_output;
  EXPECT_NE(check_output.find("SUCCESS"), std::string::npos) << check_output;
  auto [tested, test_output] = Promtool("test rules alerts_test.yml", dir);
  EXPECT_EQ(tested, 0) << test_output;
  EXPECT_NE(test_output.find("SUCCESS"), std::string::npos) << test_output;
}

}  // namespace
}  // namespace idem::itest
