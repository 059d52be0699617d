// tests/integration/provider_sim_itest.cc — provider-sim's own contract over real loopback HTTP:
// charge listing by time window and page, refunds with and without honoured idempotency keys,
// injected charges, stats, the record cap and the connection bound (the provider calls in
// tools/provider_sim/main.cc).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "http/client.h"
#include "idem/clock.h"
#include "testing/fakes.h"
#include "testing/process.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

constexpr int64_t kT0 = 1'800'000'000'000;  // 2027-01-15T08:00:00.000Z

constexpr int64_t kFuture = 4'102'444'800'000;  // 2100-01-01: after every charge made now

std::string At(int64_t unix_ms) { return http::Rfc3339(unix_ms); }

class ProviderSimTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(const std::vector<std::string>& extra_args) {
    sim_.reset();
    std::vector<std::string> argv = {PROVIDER_SIM_PATH, "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    auto sim = testing::ChildProcess::Spawn(argv, {}, dir_.path().string(), dir_.File("sim.log"));
    ASSERT_TRUE(sim.has_value()) << sim.error().message;
    sim_.emplace(std::move(*sim));
    auto url = sim_->WaitForLine("provider-sim listening on ", std::chrono::seconds(10));
    ASSERT_TRUE(url.has_value()) << url.error().message;
    url_ = *http::ParseHttpUrl(*url);
  }

  http::Response Call(const std::string& method, const std::string& target,
                      const std::string& body = {}, const std::string& key = {}) {
    http::Request req{method, target, {}, body};
    if (!body.empty()) req.headers.Set("Content-Type", "application/json");
    if (!key.empty()) req.headers.Set("Idempotency-Key", key);
    auto r = http::Call(url_, std::move(req));
    EXPECT_TRUE(r.has_value()) << r.error().message;
    return r ? *r : http::Response{0, {}, {}};
  }

  static json::object Object(const http::Response& r) {
    boost::system::error_code ec;
    json::value v = json::parse(r.body, ec);
    EXPECT_FALSE(ec) << r.body;
    return !ec && v.is_object() ? v.as_object() : json::object{};
  }

  json::object CreateCharge(const std::string& reference, const std::string& amount = "100.00",
                            const std::string& key = {}) {
    const http::Response r =
        Call("POST", "/v1/charges",
             json::serialize(
                 json::object{{"amount", amount}, {"currency", "CNY"}, {"reference", reference}}),
             key.empty() ? reference : key);
    EXPECT_EQ(r.status, 201) << r.body;
    return Object(r);
  }

  // POST /admin/charges; `created_at` empty: the simulator's now.
  http::Response InjectRaw(const std::string& reference, const std::string& created_at,
                           const std::string& amount = "100.00") {
    json::object body{{"reference", reference}, {"amount", amount}, {"currency", "CNY"}};
    if (!created_at.empty()) body["created_at"] = created_at;
    return Call("POST", "/admin/charges", json::serialize(body));
  }
  std::string Inject(const std::string& reference, int64_t created_ms) {
    const http::Response r = InjectRaw(reference, At(created_ms));
    EXPECT_EQ(r.status, 201) << r.body;
    return std::string(Object(r)["id"].as_string());
  }

  http::Response Refund(const std::string& key, const std::string& charge,
                        const std::string& amount) {
    return Call("POST", "/v1/refunds",
                json::serialize(
                    json::object{{"charge", charge}, {"amount", amount}, {"reason", "duplicate"}}),
                key);
  }

  // GET /v1/charges?<query>, which must answer 200.
  json::object List(const std::string& query) {
    const http::Response r = Call("GET", "/v1/charges?" + query);
    EXPECT_EQ(r.status, 200) << query << " → " << r.body;
    return Object(r);
  }
  static std::vector<std::string> Ids(json::object& page) {
    std::vector<std::string> ids;
    for (const json::value& c : page["data"].as_array()) {
      ids.emplace_back(c.as_object().at("id").as_string());
    }
    return ids;
  }
  // Every page of the window `query` with `limit`, following starting_after to the end.
  std::vector<std::vector<std::string>> AllPages(const std::string& query, int limit) {
    std::vector<std::vector<std::string>> pages;
    std::string after;
    for (int i = 0; i < 100; ++i) {
      json::object page = List(query + "&limit=" + std::to_string(limit) +
                               (after.empty() ? "" : "&starting_after=" + after));
      pages.push_back(Ids(page));
      if (!page["has_more"].as_bool()) break;
      EXPECT_FALSE(pages.back().empty());
      if (pages.back().empty()) break;
      after = pages.back().back();
    }
    return pages;
  }

  json::object Stats() { return Object(Call("GET", "/admin/stats")); }
  json::object ChargeByReference(const std::string& reference) {
    const http::Response r = Call("GET", "/v1/charges?reference=" + reference);
    EXPECT_EQ(r.status, 200) << r.body;
    return Object(r);
  }

  testing::TempDir dir_;
  std::optional<testing::ChildProcess> sim_;
  http::Url url_;
};

std::string Str(const json::object& o, const char* k) {
  const json::value* v = o.if_contains(k);
  return v && v->is_string() ? std::string(v->as_string()) : std::string("<missing>");
}

bool IsRfc3339Millis(const std::string& s) {
  return std::regex_match(s, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"));
}

TEST_F(ProviderSimTest, EveryChargeAnswerCarriesCreatedAtAndAmountRefunded) {
  const std::string before = At(ToUnixMillis(SystemClock().Now()));
  json::object created = CreateCharge("REF-1", "100.00");
  const std::string after = At(ToUnixMillis(SystemClock().Now()));
  const std::string created_at = Str(created, "created_at");
  EXPECT_TRUE(IsRfc3339Millis(created_at)) << created_at;
  EXPECT_LE(before, created_at);  // same fixed format, so string order is time order
  EXPECT_GE(after, created_at);
  EXPECT_EQ(Str(created, "amount_refunded"), "0.00");
  EXPECT_EQ(Str(created, "status"), "succeeded");
  EXPECT_EQ(Str(created, "reference"), "REF-1");

  // The same charge, with the same fields, from every call that returns it.
  json::object repeat = CreateCharge("REF-1", "100.00", "REF-1");
  EXPECT_EQ(repeat, created);
  EXPECT_EQ(ChargeByReference("REF-1"), created);
  json::object listed = List("limit=5");
  ASSERT_EQ(listed["data"].as_array().size(), 1u);
  EXPECT_EQ(listed["data"].as_array()[0].as_object(), created);

  // amount_refunded has as many fractional digits as the amount.
  EXPECT_EQ(Str(CreateCharge("REF-2", "7"), "amount_refunded"), "0");
  EXPECT_EQ(Str(CreateCharge("REF-3", "1.500"), "amount_refunded"), "0.000");

  http::Response injected = InjectRaw("REF-4", At(kFuture));
  ASSERT_EQ(injected.status, 201) << injected.body;
  json::object inj = Object(injected);
  EXPECT_EQ(Str(inj, "created_at"), At(kFuture));
  EXPECT_EQ(Str(inj, "amount_refunded"), "0.00");
  EXPECT_EQ(Str(inj, "status"), "succeeded");
  EXPECT_EQ(Str(inj, "currency"), "CNY");
  EXPECT_EQ(Str(inj, "amount"), "100.00");
  EXPECT_EQ(Str(inj, "id").rfind("ch_", 0), 0u);

  // After a refund every answer shows it.
  ASSERT_EQ(Refund("rf-1", Str(created, "id"), "30.5").status, 201);
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "30.50");
  json::object again = CreateCharge("REF-1", "100.00", "REF-1");
  EXPECT_EQ(Str(again, "amount_refunded"), "30.50");
  EXPECT_EQ(Str(again, "created_at"), created_at);
  json::object page = List("limit=1");
  EXPECT_EQ(Str(page["data"].as_array()[0].as_object(), "amount_refunded"), "30.50");
}

TEST_F(ProviderSimTest, ListsAWindowOldestFirstInStablePages) {
  // Injected out of order, with ties, plus charges on and outside both edges.
  std::vector<std::pair<int64_t, std::string>> in_window;  // (created, id), in creation order
  const std::string before_window = Inject("OUT-before", kT0 - 1);
  in_window.emplace_back(kT0, Inject("IN-edge", kT0));  // created_gte is inclusive
  for (int i = 0; i < 24; ++i) {
    const int64_t created = kT0 + 1000 * ((i * 7) % 12);  // 12 distinct times, two charges each
    in_window.emplace_back(created, Inject("IN-" + std::to_string(i), created));
  }
  const std::string on_end = Inject("OUT-end", kT0 + 60'000);  // created_lt is exclusive
  // Oldest first; ties in creation order (stable_sort keeps it).
  std::stable_sort(in_window.begin(), in_window.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> expected;
  for (const auto& [created, id] : in_window) expected.push_back(id);

  const std::string window = "created_gte=" + At(kT0) + "&created_lt=" + At(kT0 + 60'000);
  auto pages = AllPages(window, 10);
  ASSERT_EQ(pages.size(), 3u);
  EXPECT_EQ(pages[0].size(), 10u);
  EXPECT_EQ(pages[1].size(), 10u);
  EXPECT_EQ(pages[2].size(), 5u);
  std::vector<std::string> all;
  for (const auto& p : pages) all.insert(all.end(), p.begin(), p.end());
  EXPECT_EQ(all, expected);

  // Each page is the same when asked again, and its has_more says whether another follows.
  json::object first = List(window + "&limit=10");
  EXPECT_EQ(Ids(first), pages[0]);
  EXPECT_TRUE(first["has_more"].as_bool());
  json::object last = List(window + "&limit=10&starting_after=" + pages[1].back());
  EXPECT_EQ(Ids(last), pages[2]);
  EXPECT_FALSE(last["has_more"].as_bool());
  // A page that ends exactly at the last match has no more.
  json::object exact = List(window + "&limit=5&starting_after=" + pages[1].back());
  EXPECT_EQ(Ids(exact), pages[2]);
  EXPECT_FALSE(exact["has_more"].as_bool());
  json::object short_by_one = List(window + "&limit=4&starting_after=" + pages[1].back());
  EXPECT_TRUE(short_by_one["has_more"].as_bool());
  // Starting after a tie continues with the charge created next at that time.
  json::object after_tie = List(window + "&limit=1&starting_after=" + expected[1]);
  EXPECT_EQ(Ids(after_tie), std::vector<std::string>{expected[2]});
  // Starting after the last charge: an empty page.
  json::object empty = List(window + "&starting_after=" + expected.back());
  EXPECT_TRUE(empty["data"].as_array().empty());
  EXPECT_FALSE(empty["has_more"].as_bool());

  // Each edge open: everything before the end, everything from the start.
  json::object upto = List("created_lt=" + At(kT0) + "&limit=100");
  EXPECT_EQ(Ids(upto), std::vector<std::string>{before_window});
  json::object from = List("created_gte=" + At(kT0 + 60'000) + "&limit=100");
  EXPECT_EQ(Ids(from), std::vector<std::string>{on_end});
  json::object everything = List("limit=100");
  EXPECT_EQ(everything["data"].as_array().size(), 27u);
  EXPECT_FALSE(everything["has_more"].as_bool());
  EXPECT_EQ(Ids(everything).front(), before_window);
  EXPECT_EQ(Ids(everything).back(), on_end);
}

TEST_F(ProviderSimTest, ListingDefaultsToTenAndReadsOffsetsAndFractions) {
  for (int i = 0; i < 11; ++i) Inject("R-" + std::to_string(i), kT0 + i);
  json::object page = List("");
  EXPECT_EQ(page["data"].as_array().size(), 10u);
  EXPECT_TRUE(page["has_more"].as_bool());

  // kT0 is 08:00:00Z, so 16:00:00+08:00 and 03:00:00-05:00 are the same instant; "+" may arrive
  // raw or percent-encoded, ":" too.
  for (const std::string& start :
       {std::string("2027-01-15T16:00:00.003+08:00"),
        std::string("2027-01-15T16:00:00.003%2B08:00"),
        std::string("2027-01-15T03%3A00%3A00.003-05:00"), std::string("2027-01-15T08:00:00.0025Z"),
        std::string("2027-01-15t08:00:00.003z")}) {
    json::object p = List("created_gte=" + start + "&limit=100");
    EXPECT_EQ(p["data"].as_array().size(), 8u) << start;  // kT0+3 .. kT0+10
  }
  json::object no_fraction = List("created_lt=2027-01-15T08:00:00Z&limit=100");
  EXPECT_TRUE(no_fraction["data"].as_array().empty());
  json::object to_a_second = List("created_lt=2027-01-15T08:00:01Z&limit=100");
  EXPECT_EQ(to_a_second["data"].as_array().size(), 11u);
  // A bound finer than a millisecond: created < .0025 means created <= .002.
  json::object fine = List("created_lt=2027-01-15T08:00:00.0025Z&limit=100");
  EXPECT_EQ(fine["data"].as_array().size(), 3u);
}

TEST_F(ProviderSimTest, BadListingParametersAre400) {
  CreateCharge("REF-1");
  for (const std::string& query : std::vector<std::string>{
           "created_gte=yesterday",
           "created_gte=",
           "created_gte=2027-01-15T08:00:00",      // no offset
           "created_gte=2027-01-15%2008:00:00Z",   // no T
           "created_lt=2027-13-01T00:00:00Z",      // month 13
           "created_lt=2027-02-29T00:00:00Z",      // not a leap year
           "created_lt=2027-01-15T24:00:00Z",      // hour 24
           "created_lt=2027-01-15T08:00:00.Z",     // empty fraction
           "created_lt=2027-01-15T08:00:00+0800",  // offset without colon
           "created_lt=2027-01-15T08:00:00Zjunk",  // trailing text
           "limit=0",
           "limit=101",
           "limit=-1",
           "limit=abc",
           "limit=1.5",
           "limit=",
           "limit=99999999999999999999",
           "reference=REF-1&created_gte=2027-01-15T08:00:00Z",
           "created_lt=2027-01-15T08:00:00Z&reference=REF-1",
           "starting_after=ch_0000000000000000",
       }) {
    const http::Response r = Call("GET", "/v1/charges?" + query);
    EXPECT_EQ(r.status, 400) << query << " → " << r.body;
    json::object o = Object(r);
    EXPECT_TRUE(o.contains("error") && o["error"].is_string()) << query << " → " << r.body;
  }
  // A broken escape makes no valid request target (RFC 3986): the HTTP layer refuses it, 400
  // malformed-request, before provider-sim reads the parameters.
  const http::Response broken = Call("GET", "/v1/charges?created_lt=2027-01-15T08:00:00Z%");
  EXPECT_EQ(broken.status, 400) << broken.body;
  EXPECT_NE(broken.body.find("urn:idem:problem:malformed-request"), std::string::npos)
      << broken.body;
  // The same parameters, well formed, are fine: the 400s above are about their values.
  json::object ok = List(
      "created_gte=2000-02-29T00:00:00Z&created_lt=2100-01-01T00:00:00.5+01:00"
      "&limit=100");
  EXPECT_EQ(ok["data"].as_array().size(), 1u);
  EXPECT_EQ(List("limit=1")["data"].as_array().size(), 1u);
  EXPECT_EQ(List("limit=100")["data"].as_array().size(), 1u);
}

TEST_F(ProviderSimTest, LateChargeIsListedOnlyOnceItLands) {
  ASSERT_EQ(Call("POST", "/admin/faults", R"({"fault":"late","delay_ms":1500,"times":1})").status,
            200);
  http::Request req{"POST",
                    "/v1/charges",
                    {},
                    R"({"amount":"5.00","currency":"CNY",)"
                    R"("reference":"LATE-1"})"};
  req.headers.Set("Idempotency-Key", "LATE-1");
  http::CallOptions options;
  options.timeout = Millis(200);
  auto gave_up = http::Call(url_, std::move(req), options);
  ASSERT_FALSE(gave_up.has_value());
  EXPECT_TRUE(List("limit=100")["data"].as_array().empty());
  EXPECT_EQ(Call("GET", "/v1/charges?reference=LATE-1").status, 404);

  json::array landed;
  for (int i = 0; i < 50 && landed.empty(); ++i) {
    std::this_thread::sleep_for(Millis(100));
    landed = List("limit=100")["data"].as_array();
  }
  ASSERT_EQ(landed.size(), 1u);
  json::object charge = landed[0].as_object();
  EXPECT_EQ(Str(charge, "reference"), "LATE-1");
  EXPECT_EQ(Str(charge, "amount_refunded"), "0.00");
  EXPECT_TRUE(IsRfc3339Millis(Str(charge, "created_at")));
}

TEST_F(ProviderSimTest, RefundSucceedsAndCountsAgainstTheCharge) {
  json::object charge = CreateCharge("REF-1", "100.00");
  const std::string id = Str(charge, "id");

  http::Response first = Refund("rf-1", id, "30.00");
  ASSERT_EQ(first.status, 201) << first.body;
  EXPECT_EQ(first.headers.Get("content-type").value_or(""), "application/json");
  json::object refund = Object(first);
  EXPECT_EQ(Str(refund, "id").rfind("re_", 0), 0u);
  EXPECT_EQ(Str(refund, "charge"), id);
  EXPECT_EQ(Str(refund, "amount"), "30.00");
  EXPECT_EQ(Str(refund, "status"), "succeeded");
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "30.00");

  // Fewer fractional digits than the charge is the same money; the rest can be refunded.
  http::Response rest = Refund("rf-2", id, "70");
  ASSERT_EQ(rest.status, 201) << rest.body;
  json::object second = Object(rest);
  EXPECT_EQ(Str(second, "amount"), "70.00");
  EXPECT_NE(Str(second, "id"), Str(refund, "id"));
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "100.00");

  // Nothing is left: even a cent is too much.
  http::Response over = Refund("rf-3", id, "0.01");
  EXPECT_EQ(over.status, 400) << over.body;
  EXPECT_TRUE(Object(over)["error"].is_string());
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "100.00");

  json::object stats = Stats();
  EXPECT_EQ(stats["refunded_total"].to_number<int64_t>(), 2);
  EXPECT_EQ(stats["refunds_by_charge"].as_object().at(id).to_number<int64_t>(), 2);
}

TEST_F(ProviderSimTest, OverRefundIs400AndRefundsNothing) {
  const std::string id = Str(CreateCharge("REF-1", "10.50"), "id");
  ASSERT_EQ(Refund("rf-1", id, "10.00").status, 201);
  http::Response over = Refund("rf-2", id, "0.51");
  EXPECT_EQ(over.status, 400) << over.body;
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "10.00");
  // Exactly what is left is fine.
  EXPECT_EQ(Refund("rf-3", id, "0.50").status, 201);
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "10.50");
  EXPECT_EQ(Stats()["refunded_total"].to_number<int64_t>(), 2);
}

TEST_F(ProviderSimTest, HonouredKeyRepeatReturnsTheSameRefundAndRefundsNothingMore) {
  const std::string id = Str(CreateCharge("REF-1"), "id");
  http::Response first = Refund("rf-key", id, "60.00");
  ASSERT_EQ(first.status, 201) << first.body;
  http::Response repeat = Refund("rf-key", id, "60.00");
  EXPECT_EQ(repeat.status, 201);
  EXPECT_EQ(repeat.body, first.body);
  // 40.00 is left, yet the repeat is answered with the refund made, not refused.
  http::Response third = Refund("rf-key", id, "60.00");
  EXPECT_EQ(third.status, 201);
  EXPECT_EQ(third.body, first.body);
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "60.00");
  json::object stats = Stats();
  EXPECT_EQ(stats["refunded_total"].to_number<int64_t>(), 1);
  EXPECT_EQ(stats["refunds_by_charge"].as_object().at(id).to_number<int64_t>(), 1);
  // Another key is another refund.
  http::Response other = Refund("rf-other", id, "40.00");
  ASSERT_EQ(other.status, 201);
  EXPECT_NE(other.body, first.body);
}

TEST_F(ProviderSimTest, IgnoringKeysMakesARepeatANewRefund) {
  const std::string id = Str(CreateCharge("REF-1"), "id");
  ASSERT_EQ(Call("POST", "/admin/mode", R"({"ignore_idempotency_keys":true})").status, 200);
  http::Response first = Refund("rf-key", id, "50.00");
  ASSERT_EQ(first.status, 201) << first.body;
  http::Response repeat = Refund("rf-key", id, "50.00");
  ASSERT_EQ(repeat.status, 201) << repeat.body;
  EXPECT_NE(Str(Object(repeat), "id"), Str(Object(first), "id"));
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "100.00");
  http::Response nothing_left = Refund("rf-key", id, "50.00");
  EXPECT_EQ(nothing_left.status, 400) << nothing_left.body;
  json::object stats = Stats();
  EXPECT_EQ(stats["refunded_total"].to_number<int64_t>(), 2);
  EXPECT_EQ(stats["refunds_by_charge"].as_object().at(id).to_number<int64_t>(), 2);
}

TEST_F(ProviderSimTest, RefundOfAnUnknownChargeIs404) {
  CreateCharge("REF-1");
  http::Response r = Refund("rf-1", "ch_0000000000000000", "1.00");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_TRUE(Object(r)["error"].is_string());
  EXPECT_EQ(Stats()["refunded_total"].to_number<int64_t>(), 0);
}

TEST_F(ProviderSimTest, InvalidRefundRequestsAre400AndRefundNothing) {
  const std::string id = Str(CreateCharge("REF-1", "100.00"), "id");
  const std::string charge = "\"charge\":\"" + id + "\"";
  for (const std::string& body : std::vector<std::string>{
           "not json",
           "[]",
           R"({"amount":"1.00","reason":"duplicate"})",              // no charge
           "{" + charge + R"(,"reason":"duplicate"})",               // no amount
           "{" + charge + R"(,"amount":1,"reason":"duplicate"})",    // amount not a string
           "{" + charge + R"(,"amount":"0","reason":"duplicate"})",  // not positive
           "{" + charge + R"(,"amount":"0.00","reason":"duplicate"})",
           "{" + charge + R"(,"amount":"-1.00","reason":"duplicate"})",
           "{" + charge + R"(,"amount":"+1.00","reason":"duplicate"})",
           "{" + charge + R"(,"amount":"1.001","reason":"duplicate"})",  // finer than the charge
           "{" + charge + R"(,"amount":"1e2","reason":"duplicate"})",
           "{" + charge + R"(,"amount":"1.","reason":"duplicate"})",
           "{" + charge + R"(,"amount":".5","reason":"duplicate"})",
           "{" + charge + R"(,"amount":"","reason":"duplicate"})",
           "{" + charge + R"(,"amount":"99999999999999999999999","reason":"duplicate"})",
           "{" + charge + R"(,"amount":"1.00"})",                     // no reason
           "{" + charge + R"(,"amount":"1.00","reason":"because"})",  // unknown reason
           R"({"charge":7,"amount":"1.00","reason":"duplicate"})",
       }) {
    http::Response r = Call("POST", "/v1/refunds", body, "rf-" + std::to_string(body.size()));
    EXPECT_EQ(r.status, 400) << body << " → " << r.body;
    EXPECT_TRUE(Object(r)["error"].is_string()) << body;
  }
  EXPECT_EQ(Stats()["refunded_total"].to_number<int64_t>(), 0);
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "0.00");
  // The well-formed request these were spoiled from is fine.
  EXPECT_EQ(Call("POST", "/v1/refunds", "{" + charge + R"(,"amount":"1.00","reason":"duplicate"})",
                 "rf-good")
                .status,
            201);
}

TEST_F(ProviderSimTest, InjectedChargeWithAChosenCreatedAtIsListedInItsWindow) {
  CreateCharge("REF-now");
  // An offset is accepted and the charge answers in UTC.
  http::Response r = InjectRaw("REF-old", "2020-01-01T08:00:00.250+08:00", "12.30");
  ASSERT_EQ(r.status, 201) << r.body;
  json::object injected = Object(r);
  EXPECT_EQ(Str(injected, "created_at"), "2020-01-01T00:00:00.250Z");
  EXPECT_EQ(Str(injected, "reference"), "REF-old");
  EXPECT_EQ(Str(injected, "amount"), "12.30");

  json::object inside =
      List("created_gte=2020-01-01T00:00:00.250Z&created_lt=2020-01-01T00:00:01Z");
  ASSERT_EQ(inside["data"].as_array().size(), 1u);
  EXPECT_EQ(inside["data"].as_array()[0].as_object(), injected);
  EXPECT_TRUE(List("created_lt=2020-01-01T00:00:00.250Z")["data"].as_array().empty());
  EXPECT_TRUE(List("created_gte=2020-01-01T00:00:00.251Z&created_lt=2021-01-01T00:00:00Z")["data"]
                  .as_array()
                  .empty());
  // Oldest first, though it was made last.
  json::object all = List("");
  ASSERT_EQ(all["data"].as_array().size(), 2u);
  EXPECT_EQ(all["data"].as_array()[0].as_object(), injected);

  // Without created_at it is made now; it can be refunded like any other charge.
  const std::string before = At(ToUnixMillis(SystemClock().Now()));
  http::Response now = InjectRaw("REF-dup", "");
  ASSERT_EQ(now.status, 201) << now.body;
  json::object dup = Object(now);
  EXPECT_LE(before, Str(dup, "created_at"));
  EXPECT_EQ(Refund("rf-dup", Str(dup, "id"), "100.00").status, 201);

  for (const std::string& body : {
           std::string(R"({"amount":"1.00","currency":"CNY"})"),
           std::string(R"({"reference":"X","currency":"CNY"})"),
           std::string(R"({"reference":"X","amount":"1.00"})"),
           std::string(R"({"reference":"X","amount":"lots","currency":"CNY"})"),
           std::string(R"({"reference":"X","amount":"1.00","currency":"CNY","created_at":"soon"})"),
           std::string(R"({"reference":"X","amount":"1.00","currency":"CNY","created_at":5})"),
           std::string("nope"),
       }) {
    http::Response bad = Call("POST", "/admin/charges", body);
    EXPECT_EQ(bad.status, 400) << body << " → " << bad.body;
  }
  json::object stats = Stats();
  EXPECT_EQ(stats["total"].to_number<int64_t>(), 3);
  EXPECT_FALSE(stats["charges_by_reference"].as_object().contains("X"));
}

TEST_F(ProviderSimTest, StatsCountChargesAndRefunds) {
  const std::string a = Str(CreateCharge("REF-A"), "id");
  const std::string b = Inject("REF-A", kT0);  // a duplicate made outside idemd
  const std::string c = Str(CreateCharge("REF-C"), "id");
  ASSERT_EQ(Refund("rf-1", a, "10.00").status, 201);
  ASSERT_EQ(Refund("rf-2", a, "10.00").status, 201);
  ASSERT_EQ(Refund("rf-3", b, "100.00").status, 201);
  ASSERT_EQ(Refund("rf-1", a, "10.00").status, 201);  // a repeat: not counted

  json::object stats = Stats();
  EXPECT_EQ(stats["total"].to_number<int64_t>(), 3);
  json::object by_reference = stats["charges_by_reference"].as_object();
  EXPECT_EQ(by_reference["REF-A"].to_number<int64_t>(), 2);
  EXPECT_EQ(by_reference["REF-C"].to_number<int64_t>(), 1);
  EXPECT_EQ(stats["refunded_total"].to_number<int64_t>(), 3);
  json::object by_charge = stats["refunds_by_charge"].as_object();
  EXPECT_EQ(by_charge.size(), 2u);
  EXPECT_EQ(by_charge[a].to_number<int64_t>(), 2);
  EXPECT_EQ(by_charge[b].to_number<int64_t>(), 1);
  EXPECT_FALSE(by_charge.contains(c));
}

TEST_F(ProviderSimTest, ChargesAndRefundsAreCappedWith503) {
  Start({"--max-records", "3"});
  const std::string a = Str(CreateCharge("REF-1"), "id");
  CreateCharge("REF-2");
  Inject("REF-3", kT0);  // the third, at the limit
  http::Response fourth = Call("POST", "/v1/charges",
                               R"({"amount":"1.00","currency":"CNY","reference":"REF-4"})", "k4");
  EXPECT_EQ(fourth.status, 503) << fourth.body;
  EXPECT_EQ(InjectRaw("REF-5", "").status, 503);
  // A repeat makes nothing, so it is still answered.
  EXPECT_EQ(Str(CreateCharge("REF-1", "100.00", "REF-1"), "id"), a);
  EXPECT_EQ(Stats()["total"].to_number<int64_t>(), 3);

  for (int i = 0; i < 3; ++i) ASSERT_EQ(Refund("rf-" + std::to_string(i), a, "1.00").status, 201);
  EXPECT_EQ(Refund("rf-3", a, "1.00").status, 503);
  EXPECT_EQ(Refund("rf-0", a, "1.00").status, 201);  // a repeat
  EXPECT_EQ(Stats()["refunded_total"].to_number<int64_t>(), 3);
  EXPECT_EQ(Str(ChargeByReference("REF-1"), "amount_refunded"), "3.00");
}

// A TCP connection held open to the simulator until destroyed (idle but for Served's requests).
class HeldConnection {
 public:
  explicit HeldConnection(const http::Url& url) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(url.port);
    inet_pton(AF_INET, url.host.c_str(), &addr.sin_addr);
    connected_ = fd_ >= 0 && connect(fd_, reinterpret_cast<const sockaddr*>(&addr),  // NOLINT
                                     sizeof addr) == 0;
  }
  ~HeldConnection() {
    if (fd_ >= 0) close(fd_);
  }
  HeldConnection(const HeldConnection&) = delete;
  HeldConnection& operator=(const HeldConnection&) = delete;
  // Whether the simulator serves this connection: a request on it is answered (and the
  // connection kept open), so the simulator has taken it, not closed it as one too many.
  bool Served() {
    if (!connected_) return false;
    const timeval wait{.tv_sec = 2, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    const std::string request = "GET /admin/stats HTTP/1.1\r\nHost: sim\r\n\r\n";
    if (send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      return false;
    }
    char answer[4096];
    return recv(fd_, answer, sizeof answer, 0) > 0;
  }

 private:
  int fd_;
  bool connected_ = false;
};

TEST_F(ProviderSimTest, ServesAtMostMaxConnectionsAtOnceAndClosesTheRest) {
  Start({"--max-connections", "2"});
  auto stats = [&] { return http::Call(url_, http::Request{"GET", "/admin/stats", {}, {}}); };
  ASSERT_TRUE(stats().has_value());
  {
    // Each held connection is one the simulator serves: one made while the connection of the
    // call above was still counted may have been closed as a third; then it is made again.
    const auto hold = [&] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      auto held = std::make_unique<HeldConnection>(url_);
      while (!held->Served() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        held = std::make_unique<HeldConnection>(url_);
      }
      return held;
    };
    const auto first = hold();
    const auto second = hold();
    ASSERT_TRUE(first->Served() && second->Served()) << "two connections are served";
    // Once the simulator has taken both, a third connection is closed as it arrives.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    Result<http::Response> third = stats();
    while (third && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      third = stats();
    }
    EXPECT_FALSE(third.has_value()) << "a third connection was served";
  }
  // The two closed, a new one is served again.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  Result<http::Response> again = stats();
  while (!again && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    again = stats();
  }
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(again->status, 200);
}

TEST_F(ProviderSimTest, RefusesAMaxConnectionsThatIsNotAPositiveNumber) {
  for (const char* bad : {"0", "-3", "many", "12x"}) {
    auto sim = testing::ChildProcess::Spawn({PROVIDER_SIM_PATH, "--max-connections", bad}, {},
                                            dir_.path().string(), dir_.File("bad.log"));
    ASSERT_TRUE(sim.has_value()) << sim.error().message;
    const std::optional<int> status = sim->Wait(std::chrono::seconds(10));
    ASSERT_TRUE(status.has_value()) << bad << ": still running";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << bad << ": " << *status;
  }
}

}  // namespace
}  // namespace idem::itest
