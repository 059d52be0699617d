// tests/integration/idemctl_itest.cc — the idemctl binary's command line (usage errors, help,
// version) and its JSON output (-o json) against real idemd and provider-sim processes.
// tests/integration/client_itest.cc has its text output.
#include <fstream>
#include <iterator>

#include "tests/integration/idemd_fixture.h"
#include "tools/idemctl/commands.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

// A URL where nothing listens: were a command to run instead of failing on its command line, it
// would fail to connect (exit status 1), not exit 2.
constexpr const char* kNowhere = "http://127.0.0.1:1";

struct Ran {
  int status = -1;  // the exit status, -1 if it did not exit
  std::string out;
  std::string err;
};

// idemctl with `argv` and `env` (added to the test's environment), standard output and
// standard error apart.
Ran RunCtl(const testing::TempDir& dir, std::vector<std::string> argv,
           const std::map<std::string, std::string>& env = {}) {
  argv.insert(argv.begin(), IDEMCTL_PATH);
  static std::atomic<int> runs{0};
  const std::string errors = dir.File("idemctl-" + std::to_string(++runs) + ".log");
  auto p = testing::ChildProcess::Spawn(argv, env, dir.path().string(), errors);
  EXPECT_TRUE(p.has_value());
  if (!p) return {};
  Ran ran;
  while (auto line = p->WaitForLine("", std::chrono::seconds(30))) ran.out += *line + "\n";
  auto status = p->Wait(std::chrono::seconds(30));
  if (status && WIFEXITED(*status)) ran.status = WEXITSTATUS(*status);
  std::ifstream err(errors);
  ran.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  return ran;
}

// Standard output as one JSON value (an empty object if it is not JSON, and the test fails).
json::value ParseJson(const Ran& ran) {
  boost::system::error_code ec;
  json::value v = json::parse(ran.out, ec);
  EXPECT_FALSE(ec) << "not JSON: " << ran.out << "[stderr] " << ran.err;
  return ec ? json::value(json::object{}) : v;
}

// ---- The command line ---------------------------------------------------------------------------

TEST(IdemctlCommandLine, AnUnknownFlagIsAUsageErrorThatNamesIt) {
  testing::TempDir dir;
  const std::vector<std::string> pay = {"pay",  "--url",      kNowhere, "--api-key",
                                        "k",    "--order",    "ORD-U1", "--amount",
                                        "1.00", "--currency", "EUR",    "--bogus-flag"};
  Ran ran = RunCtl(dir, pay);
  EXPECT_EQ(ran.status, ctl::kExitUsage) << ran.err;
  EXPECT_NE(ran.err.find("--bogus-flag"), std::string::npos) << ran.err;
  EXPECT_TRUE(ran.out.empty()) << ran.out;

  // Named even when a required option is missing too: it may be the misspelt one.
  ran = RunCtl(dir, {"pay", "--url", kNowhere, "--api-key", "k", "--oder", "ORD-U1", "--amount",
                     "1.00", "--currency", "EUR"});
  EXPECT_EQ(ran.status, ctl::kExitUsage);
  EXPECT_NE(ran.err.find("--oder"), std::string::npos) << ran.err;

  // Another command's flag is unknown here (the old parser took any flag anywhere).
  ran = RunCtl(dir, {"sweep", "--config", dir.File("none.toml"), "--dry-run"});
  EXPECT_EQ(ran.status, ctl::kExitUsage);
  EXPECT_NE(ran.err.find("--dry-run"), std::string::npos) << ran.err;

  ran = RunCtl(dir, {"frobnicate"});
  EXPECT_EQ(ran.status, ctl::kExitUsage);
  EXPECT_NE(ran.err.find("frobnicate"), std::string::npos) << ran.err;
  ran = RunCtl(dir, {"payment", "get", "pay_1", "pay_2", "--url", kNowhere, "--api-key", "k"});
  EXPECT_EQ(ran.status, ctl::kExitUsage);
  EXPECT_NE(ran.err.find("pay_2"), std::string::npos) << ran.err;
}

TEST(IdemctlCommandLine, AMissingRequiredOptionIsAUsageErrorThatNamesIt) {
  testing::TempDir dir;
  struct Case {
    std::vector<std::string> argv;
    std::string missing;
  };
  const std::vector<Case> cases = {
      {{"pay", "--url", kNowhere, "--api-key", "k", "--amount", "1.00", "--currency", "EUR"},
       "--order"},
      // No --api-key and no IDEM_API_KEY (set empty below, which counts as unset).
      {{"pay", "--url", kNowhere, "--order", "ORD-M1", "--amount", "1.00", "--currency", "EUR"},
       "--api-key"},
      {{"payment", "get", "--url", kNowhere, "--api-key", "k"}, "ID"},
      {{"operation", "get", "--url", kNowhere, "--api-key", "k"}, "KEY"},
      {{"record", "inspect", "--config", dir.File("none.toml"), "--tenant", "acme", "--user",
        "alice"},
       "--key"},
      {{"record", "inspect", "--tenant", "acme", "--user", "alice", "--key", "k"}, "--config"},
      {{"sweep"}, "--config"},
      {{"reconcile", "--config", dir.File("none.toml")}, "--since"},
      {{"reconcile", "report"}, "--config"},
      {{"apikey", "add", "--config", dir.File("keys.toml"), "--tenant", "acme"}, "--user"},
      {{"payment"}, "subcommand"},
  };
  for (const Case& c : cases) {
    Ran ran = RunCtl(dir, c.argv, {{"IDEM_API_KEY", ""}});
    EXPECT_EQ(ran.status, ctl::kExitUsage)
        << c.argv[0] << " without " << c.missing << ": " << ran.err;
    EXPECT_NE(ran.err.find(c.missing), std::string::npos) << ran.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("keys.toml"))) << "apikey add wrote nothing";
}

TEST(IdemctlCommandLine, ABadValueIsAUsageErrorThatNamesIt) {
  testing::TempDir dir;
  const std::string config = dir.File("none.toml");
  struct Case {
    std::vector<std::string> argv;
    std::string named;
  };
  const std::vector<Case> cases = {
      {{"reconcile", "report", "--config", config, "--limit", "ten"}, "--limit"},
      {{"reconcile", "report", "--config", config, "--limit", "0"}, "--limit"},
      {{"reconcile", "report", "--config", config, "--limit", "100001"}, "--limit"},
      {{"reconcile", "--config", config, "--since", "yesterday"}, "--since"},
      {{"reconcile", "--config", config, "--since", "2026-11-29T00:00:00Z", "--until", "later"},
       "--until"},
      {{"sweep", "--config", config, "-o", "yaml"}, "yaml"},
      {{"payment", "get", "pay_1", "--api-key", "k", "--url", "127.0.0.1:8080"}, "--url"},
      {{"apikey", "add", "--config", dir.File("keys.toml"), "--tenant", "Acme Corp", "--user",
        "carol"},
       "--tenant"},
      // A run's options with `report` would be silently ignored.
      {{"reconcile", "--since", "2026-11-29T00:00:00Z", "report", "--config", config}, "--since"},
  };
  for (const Case& c : cases) {
    Ran ran = RunCtl(dir, c.argv);
    EXPECT_EQ(ran.status, ctl::kExitUsage) << c.named << ": " << ran.err;
    EXPECT_NE(ran.err.find(c.named), std::string::npos) << ran.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("keys.toml"))) << "apikey add wrote nothing";
}

TEST(IdemctlCommandLine, HelpDescribesEachCommandAndExitsZero) {
  testing::TempDir dir;
  // --help wins over everything else on the line, required options missing included.
  Ran pay = RunCtl(dir, {"pay", "--help"}, {{"IDEM_API_KEY", ""}});
  EXPECT_EQ(pay.status, ctl::kExitDone) << pay.err;
  for (const char* described : {"--order", "--amount", "--currency", "--key", "--async", "--url",
                                "IDEM_URL", "--api-key", "IDEM_API_KEY", "json"}) {
    EXPECT_NE(pay.out.find(described), std::string::npos) << described << " in\n" << pay.out;
  }
  EXPECT_TRUE(pay.err.empty()) << pay.err;

  Ran report = RunCtl(dir, {"reconcile", "report", "--help"});
  EXPECT_EQ(report.status, ctl::kExitDone);
  EXPECT_NE(report.out.find("--limit"), std::string::npos) << report.out;
  EXPECT_EQ(report.out.find("--dry-run"), std::string::npos) << "reconcile's, not report's";

  // The top level lists the commands and every exit status, from the constants.
  Ran top = RunCtl(dir, {"--help"});
  EXPECT_EQ(top.status, ctl::kExitDone);
  for (const char* command :
       {"pay", "payment", "operation", "record", "sweep", "reconcile", "gen-secret", "apikey"}) {
    EXPECT_NE(top.out.find("  " + std::string(command) + " "), std::string::npos) << command;
  }
  for (const ctl::ExitStatus& s : ctl::kExitStatuses) {
    const std::string line = "  " + std::to_string(s.code) + "  " + s.meaning + "\n";
    EXPECT_NE(top.out.find(line), std::string::npos) << line << "in\n" << top.out;
  }
  // With no command at all, the same help, and nothing went wrong.
  Ran bare = RunCtl(dir, {});
  EXPECT_EQ(bare.status, ctl::kExitDone);
  EXPECT_EQ(bare.out, top.out);
}

TEST(IdemctlCommandLine, VersionIsTheProjectVersion) {
  testing::TempDir dir;
  Ran ran = RunCtl(dir, {"--version"});
  EXPECT_EQ(ran.status, ctl::kExitDone) << ran.err;
  EXPECT_EQ(ran.out, std::string("idemctl ") + IDEM_VERSION + "\n");
}

// ---- -o json against idemd --------------------------------------------------------------------

TEST_F(IdemdTest, IdemctlPrintsJsonThatParses) {
  const std::string url = "http://127.0.0.1:" + std::to_string(idemd_url_.port);
  const std::string config = dir_.File("idemd.toml");
  auto run = [&](std::vector<std::string> argv, std::map<std::string, std::string> env = {}) {
    env["IDEM_SECRETS"] = secrets_toml_;
    return RunCtl(dir_, std::move(argv), env);
  };

  Ran paid = run({"pay", "--url", url, "--api-key", kAlice, "--order", "ORD-JSON", "--amount",
                  "12.50", "--currency", "EUR", "--key", "ctl-json-key-1", "-o", "json"});
  ASSERT_EQ(paid.status, ctl::kExitDone) << paid.err;
  const json::object pay = ParseJson(paid).as_object();
  EXPECT_EQ(pay.at("status"), 201);
  EXPECT_EQ(pay.at("idempotency_key"), "ctl-json-key-1");
  EXPECT_EQ(pay.at("attempts"), 1);
  EXPECT_EQ(pay.at("headers").as_object().at("content-type"), "application/json");
  const json::object payment = pay.at("body").as_object();
  EXPECT_EQ(payment.at("merchant_order_no"), "ORD-JSON");
  EXPECT_EQ(payment.at("amount"), "12.50");
  const std::string payment_id(payment.at("id").as_string());
  EXPECT_NE(paid.err.find("Idempotency-Key: ctl-json-key-1 (1 attempt)"), std::string::npos)
      << "the key is still reported on standard error: " << paid.err;

  Ran got = run({"payment", "get", payment_id, "--url", url, "--api-key", kAlice, "-o", "json"});
  ASSERT_EQ(got.status, ctl::kExitDone) << got.err;
  const json::object read = ParseJson(got).as_object();
  EXPECT_EQ(read.at("status"), 200);
  EXPECT_EQ(read.at("body").at("id").as_string(), payment_id);

  // --url and --api-key from the environment.
  Ran op = run({"operation", "get", "ctl-json-key-1", "--output", "json"},
               {{"IDEM_URL", url}, {"IDEM_API_KEY", kAlice}});
  ASSERT_EQ(op.status, ctl::kExitDone) << op.err;
  const json::object operation = ParseJson(op).as_object();
  EXPECT_EQ(operation.at("status"), 200);
  EXPECT_EQ(operation.at("body").at("state"), "SUCCEEDED") << op.out;

  // idemd's error answer, as JSON too, and exit status 3.
  Ran unknown =
      run({"payment", "get", "pay_doesnotexist", "--url", url, "--api-key", kAlice, "-o", "json"});
  EXPECT_EQ(unknown.status, ctl::kExitIdemdError);
  const json::object problem = ParseJson(unknown).as_object();
  EXPECT_EQ(problem.at("status"), 404);
  EXPECT_EQ(problem.at("body").at("status"), 404) << "problem+json, parsed";

  Ran inspected = run({"record", "inspect", "--config", config, "--tenant", "acme", "--user",
                       "alice", "--key", "ctl-json-key-1", "--show-response", "-o", "json"});
  ASSERT_EQ(inspected.status, ctl::kExitDone) << inspected.err;
  const json::object record = ParseJson(inspected).as_object();
  EXPECT_EQ(record.at("state"), "SUCCEEDED");
  EXPECT_EQ(record.at("tenant"), "acme");
  EXPECT_EQ(record.at("user"), "alice");
  EXPECT_EQ(record.at("route"), "payments.create");
  EXPECT_EQ(record.at("recovery_point"), "done");
  EXPECT_EQ(record.at("resource_id").as_string(), payment_id);
  EXPECT_EQ(record.at("status_code"), 201);
  EXPECT_EQ(record.at("fence"), 1);
  EXPECT_EQ(record.at("expired"), false);
  EXPECT_EQ(record.at("scope_hash").as_string().size(), 64u);
  EXPECT_GT(record.at("sealed_response_bytes").to_number<int64_t>(), 0);
  EXPECT_EQ(record.at("response").at("status"), 201) << "opened with the config's secrets";
  EXPECT_EQ(record.at("response").at("body").at("id").as_string(), payment_id);
  Ran hidden = run({"record", "inspect", "--config", config, "--tenant", "acme", "--user", "alice",
                    "--key", "ctl-json-key-1", "-o", "json"});
  EXPECT_FALSE(ParseJson(hidden).as_object().contains("response")) << "shown only if asked";

  // No record: exit status 4, nothing on standard output to mistake for one.
  Ran missing = run({"record", "inspect", "--config", config, "--tenant", "acme", "--user", "bob",
                     "--key", "ctl-json-key-1", "-o", "json"});
  EXPECT_EQ(missing.status, ctl::kExitNoRecord);
  EXPECT_TRUE(missing.out.empty()) << missing.out;
  EXPECT_NE(missing.err.find("no record"), std::string::npos) << missing.err;

  Ran swept = run({"sweep", "--config", config, "-o", "json"});
  ASSERT_EQ(swept.status, ctl::kExitDone) << swept.err;
  EXPECT_EQ(ParseJson(swept), (json::object{{"swept", 0}}));

  // -o text is the default, spelt out.
  Ran text = run({"sweep", "--config", config, "-o", "text"});
  EXPECT_EQ(text.out, "swept 0 expired records\n");

  Ran added = run({"apikey", "add", "--config", config, "--tenant", "initech", "--user", "peter",
                   "-o", "json"});
  ASSERT_EQ(added.status, ctl::kExitDone) << added.err;
  const json::object key = ParseJson(added).as_object();
  EXPECT_TRUE(key.at("api_key").as_string().starts_with("idem_")) << added.out;
  EXPECT_EQ(key.at("tenant"), "initech");
  EXPECT_EQ(key.at("user"), "peter");
}

}  // namespace
}  // namespace idem::itest
