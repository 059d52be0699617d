// tests/integration/client_itest.cc — the retrying client and idemctl against real processes.
#include <sys/wait.h>

#include <fstream>
#include <regex>
#include <thread>

#include "client/client.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

client::Client MakeClient(IdemdTest& t, std::vector<Millis>* sleeps, int max_attempts = 10) {
  client::ClientOptions options;
  options.base_url = "http://127.0.0.1:" + std::to_string(t.idemd_url_.port);
  options.api_key = kAlice;
  options.max_attempts = max_attempts;
  options.initial_backoff = Millis(20);
  options.max_backoff = Millis(200);
  options.sleep = [sleeps](Millis d) {
    sleeps->push_back(d);
    std::this_thread::sleep_for(std::min(d, Millis(200)));
  };
  return *client::Client::Create(options);
}

TEST(OperationKey, IsAUuidV7AcceptedByTheDefaultKeyPolicy) {
  testing::FakeClock clock;
  testing::SeededRandom random(5);
  const std::string a = client::NewOperationKey(clock, random);
  const std::string b = client::NewOperationKey(clock, random);
  EXPECT_NE(a, b);
  EXPECT_TRUE(std::regex_match(
      a, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")))
      << a;
  // The first 48 bits are the time in milliseconds.
  EXPECT_EQ(std::stoll(a.substr(0, 8) + a.substr(9, 4), nullptr, 16), ToUnixMillis(clock.Now()));
}

TEST_F(IdemdTest, ClientRetriesRetryableFailuresWithOneKey) {
  StartIdemd({.extra_provider = "nothing_charged_statuses = [503]"});
  std::vector<Millis> sleeps;
  client::Client c = MakeClient(*this, &sleeps);
  Fault(R"({"fault":"error","times":2})");
  auto outcome = c.Post("/v1/payments", Body("ORD-C1"));
  ASSERT_TRUE(outcome.has_value()) << outcome.error().message;
  EXPECT_EQ(outcome->response.status, 201);
  EXPECT_EQ(outcome->attempts, 3);
  EXPECT_EQ(TotalCharges(), 1);
  // Retry-After: 1 from each 503 is honoured.
  ASSERT_EQ(sleeps.size(), 2u);
  for (Millis s : sleeps) EXPECT_GE(s, Millis(1000));
  // The same key was used throughout: the operation is known under it.
  EXPECT_EQ(Get("/v1/operations/" + outcome->key).status, 200);
}

TEST_F(IdemdTest, ClientNeverRetriesAFinal4xx) {
  std::vector<Millis> sleeps;
  client::Client c = MakeClient(*this, &sleeps);
  Fault(R"({"fault":"decline","times":1})");
  auto declined = c.Post("/v1/payments", Body("ORD-C2"));
  ASSERT_TRUE(declined.has_value());
  EXPECT_EQ(declined->response.status, 402);
  EXPECT_EQ(declined->attempts, 1);
  auto invalid = c.Post("/v1/payments", Body("bad order!"));
  EXPECT_EQ(invalid->response.status, 400);
  EXPECT_EQ(invalid->attempts, 1);
  EXPECT_TRUE(sleeps.empty());
}

TEST_F(IdemdTest, ClientWaitsOutARunningDuplicate) {
  std::vector<Millis> sleeps;
  client::Client c = MakeClient(*this, &sleeps);
  Fault(R"({"fault":"slow","delay_ms":600,"times":1})");
  const std::string key = "client-dup-key-1";
  std::thread first([&] { Pay(key, Body("ORD-C3")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto outcome = c.Post("/v1/payments", Body("ORD-C3"), key);
  first.join();
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->response.status, 201);
  EXPECT_GE(outcome->attempts, 2) << "the first attempt met the running execution (409)";
  EXPECT_EQ(outcome->response.headers.Get("idempotent-replayed").value_or(""), "true");
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, ClientFollowsA202ToTheFinalAnswer) {
  std::vector<Millis> sleeps;
  client::Client c = MakeClient(*this, &sleeps);
  Fault(R"({"fault":"slow","delay_ms":300,"times":1})");
  auto outcome = c.Post("/v1/payments", Body("ORD-C4"), {}, {{"Prefer", "respond-async"}});
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->response.status, 201) << outcome->response.body;
  EXPECT_EQ(ParseObject(outcome->response.body)["merchant_order_no"], "ORD-C4");
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, ClientReportsTheNetworkErrorWhenNothingAnswers) {
  std::vector<Millis> sleeps;
  client::Client c = MakeClient(*this, &sleeps, 3);
  KillIdemd();
  auto outcome = c.Post("/v1/payments", Body("ORD-C5"));
  ASSERT_FALSE(outcome.has_value());
  EXPECT_EQ(outcome.error().code, Errc::kUnavailable);
  EXPECT_EQ(sleeps.size(), 2u);
}

// idemctl end to end: pay, read back, inspect the record from the store.
TEST_F(IdemdTest, IdemctlPaysAndInspects) {
  const std::string url = "http://127.0.0.1:" + std::to_string(idemd_url_.port);
  auto run = [&](std::vector<std::string> argv) { return RunIdemctl(std::move(argv)); };
  auto [paid, pay_out] = run({"pay", "--url", url, "--api-key", kAlice, "--order", "ORD-CTL",
                              "--amount", "12.50", "--currency", "EUR", "--key", "ctl-key-0001"});
  EXPECT_EQ(paid, 0) << pay_out;
  EXPECT_NE(pay_out.find("HTTP 201"), std::string::npos) << pay_out;
  EXPECT_NE(pay_out.find("\"amount\":\"12.50\""), std::string::npos);
  auto [again, again_out] = run({"pay", "--url", url, "--api-key", kAlice, "--order", "ORD-CTL",
                                 "--amount", "12.5", "--currency", "EUR", "--key", "ctl-key-0001"});
  EXPECT_NE(again_out.find("idempotent-replayed: true"), std::string::npos) << again_out;
  auto [op, op_out] = run({"operation", "get", "ctl-key-0001", "--url", url, "--api-key", kAlice});
  EXPECT_NE(op_out.find("\"state\":\"SUCCEEDED\""), std::string::npos) << op_out;

  auto [inspected, inspect_out] =
      run({"record", "inspect", "--config", dir_.File("idemd.toml"), "--tenant", "acme", "--user",
           "alice", "--key", "ctl-key-0001", "--show-response"});
  EXPECT_EQ(inspected, 0) << inspect_out;
  EXPECT_NE(inspect_out.find("state           SUCCEEDED"), std::string::npos) << inspect_out;
  EXPECT_NE(inspect_out.find("recovery_point  done"), std::string::npos);
  EXPECT_NE(inspect_out.find("fence           1"), std::string::npos);
  EXPECT_NE(inspect_out.find("HTTP 201"), std::string::npos) << "decrypted with the secret";
  auto [hidden, hidden_out] = run({"record", "inspect", "--config", dir_.File("idemd.toml"),
                                   "--tenant", "acme", "--user", "alice", "--key", "ctl-key-0001"});
  EXPECT_EQ(hidden_out.find("HTTP 201"), std::string::npos) << "shown only if asked";
  auto [missing, missing_out] = run({"record", "inspect", "--config", dir_.File("idemd.toml"),
                                     "--tenant", "acme", "--user", "bob", "--key", "ctl-key-0001"});
  EXPECT_EQ(missing, 4);

  auto [swept, sweep_out] = run({"sweep", "--config", dir_.File("idemd.toml")});
  EXPECT_EQ(swept, 0);
  EXPECT_NE(sweep_out.find("swept 0"), std::string::npos) << sweep_out;
}

TEST_F(IdemdTest, IdemctlAddsAnApiKeyThatIdemdAccepts) {
  auto p = testing::ChildProcess::Spawn(
      {IDEMCTL_PATH, "apikey", "add", "--config", dir_.File("idemd.toml"), "--tenant", "initech",
       "--user", "peter"},
      {}, dir_.path().string(), dir_.File("idemctl.log"));
  ASSERT_TRUE(p.has_value());
  auto key = p->WaitForLine("idem_", std::chrono::seconds(10));
  ASSERT_TRUE(key.has_value());
  StartIdemd({.keep_config = true});  // reloads the config with the new principal
  http::Response r = Pay("apikey-order-1", Body("ORD-AK"), "idem_" + *key);
  EXPECT_EQ(r.status, 201) << r.body;
  auto gen = testing::ChildProcess::Spawn({IDEMCTL_PATH, "gen-secret"}, {}, dir_.path().string(),
                                          dir_.File("idemctl.log"));
  ASSERT_TRUE(gen.has_value());
  EXPECT_TRUE(gen->WaitForLine("hmac_current = 1", std::chrono::seconds(10)).has_value());
}

}  // namespace
}  // namespace idem::itest
