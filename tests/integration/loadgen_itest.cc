// tests/integration/loadgen_itest.cc — idem-bench (bench/loadgen) against a real idemd and
// provider-sim: each scenario for about two seconds must measure something and pass the
// exactly-once check, and the check must fail when the provider's books break exactly-once.
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

class LoadgenTest : public IdemdTest {
 protected:
  // idem-bench with `args`: its exit status and what it printed (standard error appended).
  std::pair<int, std::string> RunBench(const std::vector<std::string>& args) {
    std::vector<std::string> argv{IDEM_BENCH_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    static int runs = 0;
    const std::string errors = dir_.File("bench-" + std::to_string(++runs) + ".log");
    auto p = testing::ChildProcess::Spawn(argv, {}, dir_.path().string(), errors);
    EXPECT_TRUE(p.has_value());
    if (!p) return {-1, ""};
    std::string out;
    while (auto line = p->WaitForLine("", std::chrono::seconds(60))) out += *line + "\n";
    const auto status = p->Wait(std::chrono::seconds(30));
    std::ifstream err(errors);
    const std::string said((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
    if (!said.empty()) out += "[stderr] " + said;
    return {status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, out};
  }

  std::vector<std::string> Targets() const {
    return {"--url",      "http://127.0.0.1:" + std::to_string(idemd_url_.port),
            "--provider", "http://127.0.0.1:" + std::to_string(provider_url_.port),
            "--api-key",  kAlice};
  }

  json::object ReadJson(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return ParseObject(text.str());
  }
};

struct ScenarioCase {
  const char* name;
  std::vector<std::string> args;
};

class LoadgenScenarioTest : public LoadgenTest,
                            public ::testing::WithParamInterface<ScenarioCase> {};

// A short run of the scenario passes the check, measured requests, and got the answers the
// scenario is about.
TEST_P(LoadgenScenarioTest, RunsAndPassesTheExactlyOnceCheck) {
  const std::string report = dir_.File("bench.json");
  std::vector<std::string> args = Targets();
  args.insert(args.end(), {"--duration", "2", "--json", report});
  args.insert(args.end(), GetParam().args.begin(), GetParam().args.end());
  const auto [status, out] = RunBench(args);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("\nPASS: "), std::string::npos) << out;

  json::object r = ReadJson(report);
  const json::object& measured = r["measured"].as_object();
  const json::object& check = r["check"].as_object();
  const auto requests = measured.at("requests").to_number<int64_t>();
  EXPECT_GT(requests, 0) << out;
  EXPECT_TRUE(check.at("pass").as_bool()) << out;
  EXPECT_GT(check.at("succeeded").to_number<int64_t>(), 0) << out;
  EXPECT_EQ(check.at("duplicate_charges").to_number<int64_t>(), 0) << out;
  EXPECT_EQ(measured.at("latency_us").as_object().at("count").to_number<int64_t>(), requests);
  EXPECT_GT(measured.at("latency_us").as_object().at("p99").to_number<double>(), 0.0);

  // What each scenario is about shows in its answers.
  const json::object& statuses = measured.at("statuses").as_object();
  const auto count = [&](const char* s) {
    const json::value* v = statuses.if_contains(s);
    return v ? v->to_number<int64_t>() : 0;
  };
  const std::string name = GetParam().name;
  const auto replayed = measured.at("replayed").to_number<int64_t>();
  if (name == "replay") {
    EXPECT_EQ(replayed, requests) << out;  // every retry a replay of a created payment
    EXPECT_EQ(count("201"), requests) << out;
  } else if (name == "mix") {
    EXPECT_GT(replayed, 0) << out;  // copies were answered from the stored response
    EXPECT_GT(count("201"), replayed) << out;
  } else if (name == "burst") {
    // Copies that arrive while the first executes are told so (409), later ones replayed.
    EXPECT_GT(count("201"), 0) << out;
    EXPECT_GT(count("409") + replayed, 0) << out;
  } else {
    EXPECT_EQ(replayed, 0) << out;
    EXPECT_EQ(count("201"), requests) << out;
  }
  // Scenarios that repeat nothing make one charge per request; the provider agrees.
  if (name == "unique" || name == "open_loop") {
    EXPECT_EQ(TotalCharges(), check.at("succeeded").to_number<int64_t>());
  }
}

// gtest's name for a case; its lambda parameter would shadow gtest's own.
std::string NameOf(const ::testing::TestParamInfo<ScenarioCase>& param) { return param.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Scenarios, LoadgenScenarioTest,
    ::testing::Values(
        ScenarioCase{"unique", {"--scenario", "unique", "--connections", "4"}},
        ScenarioCase{"replay", {"--scenario", "replay", "--connections", "4", "--keys", "20"}},
        ScenarioCase{
            "mix",
            {"--scenario", "mix", "--connections", "4", "--duplicates", "40", "--warmup", "0.5"}},
        ScenarioCase{"burst", {"--scenario", "burst", "--connections", "6", "--burst", "3"}},
        // Open loop: 100 requests/s scheduled over 4 connections.
        ScenarioCase{"open_loop", {"--scenario", "unique", "--connections", "4", "--rate", "100"}}),
    NameOf);

// The check can fail: after a clean run, a second charge for one of its payments (made at the
// provider behind idemd's back) must turn --check-only's PASS into a FAIL naming that payment.
TEST_F(LoadgenTest, CheckFailsOnASecondChargeOfAPayment) {
  const std::string intents = dir_.File("intents.json");
  std::vector<std::string> args = Targets();
  args.insert(args.end(), {"--duration", "1", "--connections", "2", "--intents", intents});
  const auto [status, out] = RunBench(args);
  ASSERT_EQ(status, 0) << out;

  json::object file = ReadJson(intents);
  const json::array& list = file["intents"].as_array();
  ASSERT_FALSE(list.empty());
  const std::string payment(list.front().as_object().at("payment_id").as_string());
  ASSERT_TRUE(payment.starts_with("pay_")) << payment;

  const std::vector<std::string> check{"--check-only", "--intents", intents, "--provider",
                                       "http://127.0.0.1:" + std::to_string(provider_url_.port)};
  const auto [clean, clean_out] = RunBench(check);
  EXPECT_EQ(clean, 0) << clean_out;
  EXPECT_NE(clean_out.find("PASS: "), std::string::npos) << clean_out;

  InjectCharge(payment, "100.00", "CNY");
  const auto [broken, broken_out] = RunBench(check);
  EXPECT_EQ(broken, 1) << broken_out;
  EXPECT_NE(broken_out.find("FAIL: payments charged more than once: 1"), std::string::npos)
      << broken_out;
  EXPECT_NE(broken_out.find("payment " + payment), std::string::npos) << broken_out;
}

// A charge no success of the run names — as for an intent whose client never heard of a
// success — fails the check too.
TEST_F(LoadgenTest, CheckFailsOnAChargeNoSuccessAccountsFor) {
  const std::string intents = dir_.File("intents.json");
  std::vector<std::string> args = Targets();
  args.insert(args.end(), {"--duration", "1", "--connections", "2", "--intents", intents});
  const auto [status, out] = RunBench(args);
  ASSERT_EQ(status, 0) << out;

  InjectCharge("pay_00000000000000000000beef", "100.00", "CNY");
  const auto [broken, broken_out] =
      RunBench({"--check-only", "--intents", intents, "--provider",
                "http://127.0.0.1:" + std::to_string(provider_url_.port)});
  EXPECT_EQ(broken, 1) << broken_out;
  EXPECT_NE(broken_out.find("FAIL: charges no success accounts for: 1"), std::string::npos)
      << broken_out;
  EXPECT_NE(broken_out.find("pay_00000000000000000000beef"), std::string::npos) << broken_out;
}

// --no-check: load without the provider and without a check (scripts/bench measures nginx this
// way); the report says nothing was checked, its JSON has no check, and the run still counts.
TEST_F(LoadgenTest, NoCheckLoadsWithoutTheProvider) {
  const std::string report = dir_.File("no-check.json");
  const auto [status, out] =
      RunBench({"--no-check", "--url", "http://127.0.0.1:" + std::to_string(idemd_url_.port),
                "--api-key", kAlice, "--duration", "1", "--connections", "2", "--json", report});
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("exactly-once   not checked (--no-check)"), std::string::npos) << out;
  EXPECT_EQ(out.find("PASS"), std::string::npos) << out;
  json::object r = ReadJson(report);
  EXPECT_TRUE(r["check"].is_null()) << out;
  EXPECT_TRUE(r["config"].as_object().at("no_check").as_bool());
  const json::object& measured = r["measured"].as_object();
  EXPECT_GT(measured.at("requests").to_number<int64_t>(), 0) << out;
  EXPECT_EQ(measured.at("errors").to_number<int64_t>(), 0) << out;

  // Nothing answered 200/201: exit status 1.
  const auto [refused, refused_out] =
      RunBench({"--no-check", "--url", "http://127.0.0.1:" + std::to_string(idemd_url_.port),
                "--api-key", "not-a-key", "--duration", "0.5", "--connections", "1"});
  EXPECT_EQ(refused, 1) << refused_out;
  EXPECT_NE(refused_out.find("FAIL: nothing succeeded"), std::string::npos) << refused_out;
}

TEST_F(LoadgenTest, UsageErrorsExitWithTwo) {
  EXPECT_EQ(RunBench({"--scenario", "nope"}).first, 2);
  std::vector<std::string> args = Targets();
  args.insert(args.end(), {"--scenario", "burst", "--connections", "5", "--burst", "2"});
  EXPECT_EQ(RunBench(args).first, 2);  // connections not a multiple of the burst
  EXPECT_EQ(RunBench({"--url", "http://127.0.0.1:1"}).first, 2);  // no --provider
  EXPECT_EQ(RunBench({"--no-check", "--url", "http://127.0.0.1:1", "--scenario", "slow"}).first,
            2);  // slow sets the provider's fault
}

}  // namespace
}  // namespace idem::itest
