// server/http/message_test.cc — header lists, RFC 3339 and HTTP dates both ways.
#include "server/http/message.h"

#include <gtest/gtest.h>

namespace idem::http {
namespace {

// RFC 9110 §5.6.1: a list may span several fields, with whitespace around and empty elements
// between its commas; names match whatever their case.
TEST(Headers, ListJoinsTheElementsOfEveryFieldOfTheName) {
  Headers h;
  h.Add("Prefer", " wait=5 ,, respond-async");
  h.Add("Other", "x, y");
  h.Add("PREFER", "\thandling=lenient\t");
  EXPECT_EQ(h.List("prefer"),
            (std::vector<std::string_view>{"wait=5", "respond-async", "handling=lenient"}));
  EXPECT_TRUE(h.List("absent").empty());
  h.Add("Empty", " , ");
  EXPECT_TRUE(h.List("empty").empty());
}

TEST(ListenAddress, TakesIpv4AndBracketedIpv6AddressesWithAPort) {
  auto v4 = ParseListenAddress("0.0.0.0:8080");
  ASSERT_TRUE(v4.has_value());
  EXPECT_EQ(v4->host, "0.0.0.0");
  EXPECT_EQ(v4->port, 8080);
  auto v6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(v6.has_value()) << v6.error().message;
  EXPECT_EQ(v6->host, "::1") << "without brackets, as binding takes it";
  EXPECT_EQ(v6->port, 0);
  for (const char* bad : {"nohostport", "[::1]", "::1:8080", "localhost:8080", "1.2.3.4:65536",
                          "1.2.3.4:", "1.2.3.4:80x", "u@1.2.3.4:80", ""}) {
    auto parsed = ParseListenAddress(bad);
    EXPECT_FALSE(parsed.has_value()) << bad;
    if (!parsed) {
      EXPECT_NE(parsed.error().message.find("listen"), std::string::npos);
    }
  }
  EXPECT_EQ(Authority("::1", 8080), "[::1]:8080");
  EXPECT_EQ(Authority("127.0.0.1", 80), "127.0.0.1:80");
}

TEST(Rfc3339, ReadsWhatItWritesAndOffsets) {
  const int64_t ms = 1'796'000'000'123;
  EXPECT_EQ(ParseRfc3339(Rfc3339(ms)), ms);
  EXPECT_EQ(ParseRfc3339("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(ParseRfc3339("1970-01-01T08:00:00+08:00"), 0);
  EXPECT_EQ(ParseRfc3339("1969-12-31T23:30:00.5-00:30"), 500);
  EXPECT_EQ(ParseRfc3339("2026-11-30T13:37:25.0320001Z"), ParseRfc3339("2026-11-30T13:37:25.033Z"))
      << "fractions beyond milliseconds round up";
  EXPECT_EQ(ParseRfc3339("2026-11-30T13:37:25.0320000Z"), ParseRfc3339("2026-11-30T13:37:25.032Z"));
  EXPECT_EQ(ParseRfc3339("2024-02-29t00:00:00z"), ParseRfc3339("2024-02-29T00:00:00Z"));
}

// Found by fuzz/message_fuzz.cc: before 1970 the milliseconds were written negative
// ("1969-12-31T23:59:59.999Z" came out as "1970-01-01T00:00:00.-01Z"), and years before 1000
// with fewer than four digits; neither read back.
TEST(Rfc3339, WritesTimesBefore1970AndEarlyYearsReadably) {
  EXPECT_EQ(Rfc3339(-1), "1969-12-31T23:59:59.999Z");
  EXPECT_EQ(Rfc3339(-1000), "1969-12-31T23:59:59.000Z");
  EXPECT_EQ(Rfc3339(-1001), "1969-12-31T23:59:58.999Z");
  for (const char* text : {"1969-12-31T23:59:59.999Z", "0999-01-02T03:04:05.006Z",
                           "0000-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z"}) {
    const auto ms = ParseRfc3339(text);
    ASSERT_TRUE(ms.has_value()) << text;
    EXPECT_EQ(Rfc3339(*ms), text);
  }
  EXPECT_EQ(HttpDate(-1), "Wed, 31 Dec 1969 23:59:59 GMT") << "rounded down, as documented";
}

TEST(Rfc3339, RefusesWhatIsNotOne) {
  for (const char* bad :
       {"", "2026-11-30", "2026-11-30T13:37:25", "2026-11-30 13:37:25Z", "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z", "2026-11-30T24:00:00Z", "2026-11-30T13:37:25.Z",
        "2026-11-30T13:37:25+0800", "2026-11-30T13:37:25Zjunk", "２026-11-30T13:37:25Z"}) {
    EXPECT_FALSE(ParseRfc3339(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace idem::http
