// tests/integration/bad_input_itest.cc — one table of bad input, sent as raw bytes to one real
// idemd: the request line, header fields and message framing, the Idempotency-Key, Authorization,
// Content-Type and Content-Encoding, and the body of POST /v1/payments. Each case is answered
// with the status and problem type that docs/openapi.yaml and docs/idemd.md give it (RFC 9110 /
// 9112 where they are silent, said at the case), and the connection is closed where framing can no
// longer be trusted and kept where it can. After every case idemd still serves; at the end no
// record, payment or charge exists for any rejected request, while the well-formed controls in
// the same table have all three.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "idem/key.h"
#include "server/idemd/routes.h"
#include "testing/raw_connection.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;
using namespace std::string_literals;
using testing::RawConnection;

// The problem types of docs/idemd.md ("Problem types").
constexpr std::string_view kMalformedRequest = "urn:idem:problem:malformed-request";
constexpr std::string_view kUriTooLong = "urn:idem:problem:uri-too-long";
constexpr std::string_view kHeadersTooLarge = "urn:idem:problem:headers-too-large";
constexpr std::string_view kPayloadTooLarge = "urn:idem:problem:payload-too-large";
constexpr std::string_view kInvalidRequest = "urn:idem:problem:invalid-request";
constexpr std::string_view kMalformedJson = "urn:idem:problem:malformed-json";
constexpr std::string_view kValidationFailed = "urn:idem:problem:validation-failed";
constexpr std::string_view kUnsupportedMediaType = "urn:idem:problem:unsupported-media-type";
constexpr std::string_view kUnauthorized = "urn:idem:problem:unauthorized";
constexpr std::string_view kMethodNotAllowed = "urn:idem:problem:method-not-allowed";
constexpr std::string_view kNoProblem = "";

constexpr bool kCloses = true;
constexpr bool kStaysOpen = false;

// Longer than the test config's read_timeout_ms (2000): a request still incomplete by then is cut
// off, and an answer that does not come by then does not come.
constexpr std::chrono::milliseconds kAnswerWait{4000};

// The server's limits (docs/config.md, http/server.h).
constexpr std::size_t kMaxBody = 64 * 1024;
constexpr std::size_t kMaxHeader = 16 * 1024;

struct Case {
  std::string name;
  std::string raw;           // sent on a fresh connection
  int status = 0;            // 0: no answer before idemd closes the connection
  std::string_view problem;  // the answer's problem type, or kNoProblem
  bool closes = false;       // idemd must close the connection after answering
  std::string key;           // the well-formed Idempotency-Key the request carries, or ""
  std::string order;         // the merchant order it was built for
};

// A payment body; `amount` and `currency` are JSON texts.
std::string PaymentBody(const std::string& order, const std::string& amount = R"("100.00")",
                        const std::string& currency = R"("CNY")") {
  return R"({"merchant_order_no":")" + order + R"(","amount":)" + amount + R"(,"currency":)" +
         currency + "}";
}

// `body` (an object) with one more member, `member` being its JSON text.
std::string WithMember(const std::string& body, const std::string& member) {
  return body.substr(0, body.size() - 1) + "," + member + "}";
}

std::string Hex(std::size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%zx", n);
  return buf;
}

// `data` as one chunk and the last chunk (RFC 9112 §7.1).
std::string Chunked(const std::string& data) {
  return Hex(data.size()) + "\r\n" + data + "\r\n0\r\n\r\n";
}

// A POST /v1/payments that is well-formed, with a key and a merchant order of its own, until a
// case changes one part of it.
struct Payment {
  std::string key;
  std::string order;
  std::string request_line = "POST /v1/payments HTTP/1.1";
  std::string host = "Host: idemd.test\r\n";
  std::string authorization = "Authorization: Bearer "s + kAlice + "\r\n";
  std::string content_type = "Content-Type: application/json\r\n";
  std::string idempotency_key;  // the whole line
  std::string extra;            // more header lines
  std::string body;
  std::optional<std::string> framing;  // header lines that frame `body`; else its Content-Length

  std::string Bytes() const {
    return request_line + "\r\n" + host + authorization + content_type + idempotency_key + extra +
           framing.value_or("Content-Length: " + std::to_string(body.size()) + "\r\n") + "\r\n" +
           body;
  }
  // A malformed key line replaces the good one: there is no key left to look a record up by.
  void KeyLine(const std::string& line) {
    idempotency_key = line;
    key.clear();
  }
};

class Table {
 public:
  // A well-formed payment whose key and merchant order no other case uses.
  Payment Fresh() {
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%03d", ++count_);
    Payment p;
    p.key = "bad-input-"s + suffix;
    p.order = "ORD-BI-"s + suffix;
    p.idempotency_key = "Idempotency-Key: " + p.key + "\r\n";
    p.body = PaymentBody(p.order);
    return p;
  }
  // A number no other case gets, for values a case makes up itself.
  std::string Unique() { return std::to_string(++count_); }

  void Add(std::string name, const Payment& p, int status, std::string_view problem, bool closes) {
    cases.push_back({std::move(name), p.Bytes(), status, problem, closes, p.key, p.order});
  }
  void AddRaw(std::string name, std::string raw, int status, std::string_view problem,
              bool closes) {
    cases.push_back({std::move(name), std::move(raw), status, problem, closes, "", ""});
  }

  std::vector<Case> cases;

 private:
  int count_ = 0;
};

std::vector<Case> BadInputCases() {
  Table t;

  // A control first: the table can see a record, a payment and a charge when they exist.
  t.Add("control: a well-formed payment", t.Fresh(), 201, kNoProblem, kStaysOpen);

  // --- the request line ----------------------------------------------------------------------

  // RFC 9110 §9.1: a method is a case-sensitive token. One the path does not list is 405 with
  // Allow (docs/openapi.yaml, MethodNotAllowed).
  for (const std::string method :
       {"post", "Post", "PUT", "PATCH", "DELETE", "GET", "PAY", "P0ST"}) {
    Payment p = t.Fresh();
    p.request_line = method + " /v1/payments HTTP/1.1";
    t.Add("method " + method, p, 405, kMethodNotAllowed, kStaysOpen);
  }
  // A method with a character no token has: not HTTP/1.1, 400 malformed-request (docs/openapi.yaml,
  // info).
  for (const std::string method : {"PO(ST", "PO/ST", "PO\"ST", "PO;ST", "PO,ST", "PO{ST", "PO@ST",
                                   "P\xc3\x96ST", "[POST]", "POST:"}) {
    Payment p = t.Fresh();
    p.request_line = method + " /v1/payments HTTP/1.1";
    t.Add("method token " + method, p, 400, kMalformedRequest, kCloses);
  }
  // HTTP-version = "HTTP/" DIGIT "." DIGIT, and idemd speaks 1.0 and 1.1: anything else is not
  // HTTP/1.1, 400. (RFC 9110 §15.6.6 would allow 505 for another major version; the documents
  // choose 400.)
  for (const std::string version : {"HTTP/2.0", "HTTP/3.0", "HTTP/0.9", "http/1.1", "HTTP/1",
                                    "HTTP/1.10", "HTTP/11", "HTTPS/1.1", "HTTP/1.x", "HTTP/"}) {
    Payment p = t.Fresh();
    p.request_line = "POST /v1/payments " + version;
    t.Add("version " + version, p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.request_line = "POST /v1/payments";
    t.Add("no version", p, 400, kMalformedRequest, kCloses);
  }
  t.AddRaw("an HTTP/0.9 simple request", "GET /healthz\r\n\r\n", 400, kMalformedRequest, kCloses);
  t.AddRaw("HTTP/2 prior-knowledge preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400,
           kMalformedRequest, kCloses);
  t.AddRaw("garbage", "THIS IS NOT HTTP\r\n\r\n", 400, kMalformedRequest, kCloses);
  t.AddRaw("a TLS ClientHello on the plain port",
           "\x16\x03\x01\x00\x2a\x01\x00\x00\x26\x03\x03\x00\x00\x00\x00\x00"s, 400,
           kMalformedRequest, kCloses);
  t.AddRaw("NUL bytes", "\0\0\0\0\r\n\r\n"s, 400, kMalformedRequest, kCloses);
  t.AddRaw("a JSON body without a request line",
           R"({"merchant_order_no":"ORD-BI-NOLINE","amount":"1.00"})"
           "\r\n\r\n",
           400, kMalformedRequest, kCloses);
  t.AddRaw("a method alone", "GET\r\n\r\n", 400, kMalformedRequest, kCloses);

  // RFC 9112 §3: a request-target longer than the server parses MUST be answered 414
  // (docs/idemd.md, "Requests"). The request line alone is over the header limit, so the rest is
  // never read and the connection closes.
  {
    Payment p = t.Fresh();
    p.request_line = "POST /v1/payments?pad=" + std::string(kMaxHeader + 4096, 'a') + " HTTP/1.1";
    t.Add("a 20 KiB query", p, 414, kUriTooLong, kCloses);
  }
  t.AddRaw("a 20 KiB path",
           "GET /healthz/" + std::string(kMaxHeader + 4096, 'a') +
               " HTTP/1.1\r\nHost: idemd.test\r\n\r\n",
           414, kUriTooLong, kCloses);

  // Raw control characters, spaces and non-ASCII bytes are outside the target's grammar (RFC
  // 3986; RFC 9112 §3.2): the target is not a path, 400.
  for (const auto& [what, bytes] :
       std::vector<std::pair<std::string, std::string>>{{"NUL", "\0"s},
                                                        {"SOH", "\x01"},
                                                        {"US", "\x1f"},
                                                        {"DEL", "\x7f"},
                                                        {"HTAB", "\t"},
                                                        {"SP", " "},
                                                        {"UTF-8", "\xc3\xa9"},
                                                        {"0xFF", "\xff"}}) {
    Payment p = t.Fresh();
    p.request_line = "POST /v1/pay" + bytes + "ments HTTP/1.1";
    t.Add("target with " + what, p, 400, kMalformedRequest, kCloses);
  }
  // Percent-encoding is "%" HEXDIG HEXDIG (RFC 3986 §2.1), in the path and in the query.
  for (const std::string target :
       {"/v1/payments%", "/v1/payments%2", "/v1/payments%zz", "/v1/payments%g0", "/v1/pay%%6dents",
        "/v1/payments?q=%", "/v1/payments?q=%zz", "/v1/operations/%zz-key-0001"}) {
    Payment p = t.Fresh();
    p.request_line = "POST " + target + " HTTP/1.1";
    t.Add("percent-encoding " + target, p, 400, kMalformedRequest, kCloses);
  }
  // Characters the URI grammar does not allow raw, and a fragment, which a target never has.
  for (const std::string c : {"{", "}", "|", "\\", "^", "`", "<", ">", "\"", "#frag"}) {
    Payment p = t.Fresh();
    p.request_line = "POST /v1/payments" + c + " HTTP/1.1";
    t.Add("target with " + c, p, 400, kMalformedRequest, kCloses);
  }
  // Absolute-form of another scheme, or no absolute http(s) URI with a host: 400 (docs/idemd.md,
  // "Requests").
  for (const std::string target :
       {"ftp://idemd.test/v1/payments", "file:///v1/payments", "ws://idemd.test/v1/payments",
        "mailto:payments@idemd.test", "urn:idem:v1:payments", "data:,payments", "idemd.test:80",
        "*", "http://", "http:/v1/payments", "http://user@idemd.test/v1/payments",
        "http://idemd.test/v1/payments#frag", "v1/payments"}) {
    Payment p = t.Fresh();
    p.request_line = "POST " + target + " HTTP/1.1";
    t.Add("target " + target, p, 400, kMalformedRequest, kCloses);
  }

  // --- header fields ---------------------------------------------------------------------------

  // RFC 9112 §3.2, quoted by docs/idemd.md: no Host in HTTP/1.1, or two Host lines, is 400 and
  // the connection closes.
  {
    Payment p = t.Fresh();
    p.host = "";
    t.Add("no Host", p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.host = "Host: idemd.test\r\nHost: idemd.test\r\n";
    t.Add("two equal Hosts", p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.host = "Host: idemd.test\r\nHost: other.test\r\n";
    t.Add("two different Hosts", p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.request_line = "POST /v1/payments HTTP/1.0";
    p.host = "Host: a.test\r\nHost: b.test\r\n";
    t.Add("two Hosts in HTTP/1.0", p, 400, kMalformedRequest, kCloses);
  }
  // §3.2 also: a Host field with an invalid value MUST be answered 400 (Host = uri-host [":"
  // port]).
  for (const std::string host : {"idemd test", "user@idemd.test", "idemd.test/v1", "[::1"}) {
    Payment p = t.Fresh();
    p.host = "Host: " + host + "\r\n";
    t.Add("Host " + host, p, 400, kMalformedRequest, kCloses);
  }
  // A field line is field-name ":" OWS field-value OWS (RFC 9112 §5); RFC 9112 §5.1: whitespace
  // between the name and the colon MUST be answered 400.
  for (const auto& [what, line] : std::vector<std::pair<std::string, std::string>>{
           {"a field without a colon", "X-Note\r\n"},
           {"a field with an empty name", ": note\r\n"},
           {"a space in a field name", "X Note: 1\r\n"},
           {"a parenthesis in a field name", "X(Note): 1\r\n"},
           {"a control character in a field name", "X-No\x01te: 1\r\n"},
           {"a space before the colon", "X-Note : 1\r\n"},
           {"a tab before the colon", "X-Note\t: 1\r\n"},
           {"a space before the colon of Idempotency-Key", "Idempotency-Key : k-0001-0001\r\n"}}) {
    Payment p = t.Fresh();
    p.extra = line;
    t.Add(what, p, 400, kMalformedRequest, kCloses);
  }
  // RFC 9112 §2.2: a whitespace-preceded line after the request line is rejected or ignored;
  // either way this request then has no Host: 400.
  {
    Payment p = t.Fresh();
    p.host = " Host: idemd.test\r\n";
    t.Add("whitespace before the first field", p, 400, kMalformedRequest, kCloses);
  }
  // Obsolete line folding. RFC 9112 §5.2 lets a server reject it (400) or replace each fold by
  // SP, and docs/idemd.md says idemd replaces. A harmless folded field is served; a folded key
  // becomes one with a space, which is no key: 400 invalid-request.
  t.AddRaw("obs-fold in a harmless field",
           "GET /healthz HTTP/1.1\r\nHost: idemd.test\r\nX-Note: a\r\n b\r\n\r\n", 200, kNoProblem,
           kStaysOpen);
  {
    Payment p = t.Fresh();
    p.KeyLine("Idempotency-Key: fold-" + t.Unique() + "\r\n -continued\r\n");
    t.Add("obs-fold in Idempotency-Key", p, 400, kInvalidRequest, kStaysOpen);
  }
  // Field values are VCHAR, obs-text, SP and HTAB (RFC 9110 §5.5): a request with any other
  // control character in one is not valid HTTP/1.1, 400 (docs/openapi.yaml, info).
  for (const auto& [what, c] :
       std::vector<std::pair<std::string, std::string>>{{"NUL", "\0"s},
                                                        {"SOH", "\x01"},
                                                        {"BS", "\x08"},
                                                        {"VT", "\x0b"},
                                                        {"FF", "\x0c"},
                                                        {"ESC", "\x1b"},
                                                        {"DEL", "\x7f"},
                                                        {"bare CR", "\r"},
                                                        {"bare LF", "\n"}}) {
    Payment p = t.Fresh();
    p.extra = "X-Note: a" + c + "b\r\n";
    t.Add(what + " in a field value", p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.KeyLine("Idempotency-Key: bad-input-ctl\x01" + t.Unique() + "\r\n");
    t.Add("SOH in Idempotency-Key", p, 400, kMalformedRequest, kCloses);
  }
  // The header section is over the limit: 431 (docs/openapi.yaml, HeadersTooLarge). Nothing past
  // it is read, so the connection closes.
  {
    Payment p = t.Fresh();
    p.extra = "X-Big: " + std::string(kMaxHeader + 1024, 'b') + "\r\n";
    t.Add("one 17 KiB field", p, 431, kHeadersTooLarge, kCloses);
  }
  {
    Payment p = t.Fresh();
    for (int i = 0; i < 1500; ++i) p.extra += "X-Pad-" + std::to_string(i) + ": v\r\n";
    t.Add("1500 fields", p, 431, kHeadersTooLarge, kCloses);
  }

  // Framing. RFC 9112 §6.3: an invalid Content-Length, or several that differ, MUST be 400 and
  // the connection closed.
  for (const std::string length :
       {"abc", "-1", "+10", "0x10", "1 0", "", "100000000000000000000", "10, 11"}) {
    Payment p = t.Fresh();
    p.framing = "Content-Length: " + length + "\r\n";
    t.Add("Content-Length '" + length + "'", p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.framing = "Content-Length: " + std::to_string(p.body.size()) +
                "\r\nContent-Length: " + std::to_string(p.body.size() - 1) + "\r\n";
    t.Add("two different Content-Lengths", p, 400, kMalformedRequest, kCloses);
  }
  // Content-Length with Transfer-Encoding: RFC 9112 §6.3 lets a server reject it and requires it
  // to close the connection; a sender MUST NOT send both (§6.2), so it is not HTTP/1.1: 400.
  {
    Payment p = t.Fresh();
    p.framing =
        "Content-Length: " + std::to_string(p.body.size()) + "\r\nTransfer-Encoding: chunked\r\n";
    p.body = Chunked(p.body);
    t.Add("Content-Length, then Transfer-Encoding", p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.body = Chunked(p.body);
    p.framing =
        "Transfer-Encoding: chunked\r\nContent-Length: " + std::to_string(p.body.size()) + "\r\n";
    t.Add("Transfer-Encoding, then Content-Length", p, 400, kMalformedRequest, kCloses);
  }
  // Chunk sizes are 1*HEXDIG, optionally followed by ";" extensions, then CRLF (RFC 9112 §7.1);
  // chunk data is exactly that long and ends with CRLF. Bad chunked framing leaves the message's
  // end unknown: 400, closed.
  const std::size_t fresh_size = PaymentBody("ORD-BI-000").size();  // every fresh body's
  const std::string size = Hex(fresh_size);
  for (const auto& [what, size_line, after_data] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"chunk size zz", "zz", ""},
           {"chunk size -1", "-1", ""},
           {"chunk size 0x..", "0x" + size, ""},
           {"chunk size after a space", " " + size, ""},
           {"chunk size before a space", size + " ", ""},
           {"chunk size over 64 bits", "1" + std::string(16, 'F'), ""},
           {"chunk extension without a name", size + ";", ""},
           {"chunk shorter than its data", Hex(fresh_size - 2), ""},
           {"chunk data without its CRLF", size, "X"}}) {
    Payment p = t.Fresh();
    p.framing = "Transfer-Encoding: chunked\r\n";
    p.body = size_line + "\r\n" + p.body + after_data + "\r\n0\r\n\r\n";
    t.Add(what, p, 400, kMalformedRequest, kCloses);
  }
  // RFC 9112 §6.3: a request whose Transfer-Encoding does not end in chunked MUST be answered 400
  // and closed (its body length cannot be known, whatever Content-Length says); §6.1: chunked is
  // applied once, and an HTTP/1.0 message with Transfer-Encoding has faulty framing.
  for (const std::string coding :
       {"gzip", "foo", "identity", "chunked, gzip", "chunked, chunked"}) {
    Payment p = t.Fresh();
    p.framing = "Transfer-Encoding: " + coding + "\r\n";
    p.body = Chunked(p.body);
    t.Add("Transfer-Encoding " + coding, p, 400, kMalformedRequest, kCloses);
  }
  {
    // The Content-Length frames a valid payment; a server that let it win would charge.
    Payment p = t.Fresh();
    p.framing =
        "Transfer-Encoding: gzip\r\nContent-Length: " + std::to_string(p.body.size()) + "\r\n";
    t.Add("Transfer-Encoding gzip with a Content-Length", p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.framing = "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n";
    p.body = Chunked(p.body);
    t.Add("two Transfer-Encoding chunked lines", p, 400, kMalformedRequest, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.request_line = "POST /v1/payments HTTP/1.0";
    p.framing = "Transfer-Encoding: chunked\r\n";
    p.body = Chunked(p.body);
    t.Add("Transfer-Encoding chunked in HTTP/1.0", p, 400, kMalformedRequest, kCloses);
  }

  // --- Idempotency-Key -------------------------------------------------------------------------

  // docs/idemd.md: a bare token or an RFC 8941 sf-string of 8..255 of A-Z a-z 0-9 - _ . :;
  // missing on POST /v1/payments: 400; malformed: 400 (invalid-request). Such a request is
  // answered on a connection that stays usable.
  {
    Payment p = t.Fresh();
    p.KeyLine("");
    t.Add("no Idempotency-Key", p, 400, kInvalidRequest, kStaysOpen);
  }
  for (const auto& [what, value] : std::vector<std::pair<std::string, std::string>>{
           {"an empty Idempotency-Key", ""},
           {"a blank Idempotency-Key", " \t "},
           {"a 7-character key", "k" + std::string(6, '7')},
           {"a 256-character key", "k256-" + std::string(251, 'k')},
           {"a 600-character key", "k600-" + std::string(595, 'k')},
           {"a 4000-character key", "k4000-" + std::string(3994, 'k')},
           {"an empty sf-string", "\"\""},
           {"an sf-string of 7 characters", "\"k777777\""},
           {"an unterminated sf-string", "\"bad-input-unterminated"},
           {"an sf-string with a bad escape", "\"bad-input\\n-escape\""},
           {"an sf-string with a space", "\"bad input sf space\""},
           {"an sf-string and more", "\"bad-input-sf-01\"x"},
           {"an sf byte sequence", ":YmFkLWlucHV0LWJ5dGVzLQ==:"},
           {"a key with a parameter", "bad-input-param;a=1"},
           {"a key list", "bad-input-list-1, bad-input-list-2"},
           {"an sf-string list", "\"bad-input-list-3\", \"bad-input-list-4\""},
           {"an sf-string with UTF-8", "\"bad-input-\xc3\xa9t\xc3\xa9\""}}) {
    Payment p = t.Fresh();
    p.KeyLine("Idempotency-Key: " + value + "\r\n");
    t.Add(what, p, 400, kInvalidRequest, kStaysOpen);
  }
  for (const std::string c :
       {" ",  "\t", "/", "@", "#", "!", "*", "+", "=", "~", ",", ";", "?", "%",        "(",   ")",
        "\\", "'",  "{", "}", "[", "]", "<", ">", "|", "$", "&", "^", "`", "\xc3\xa9", "\xff"}) {
    Payment p = t.Fresh();
    p.KeyLine("Idempotency-Key: bad" + c + "key-" + t.Unique() + "\r\n");
    t.Add("a key with " + c, p, 400, kInvalidRequest, kStaysOpen);
  }
  {
    Payment p = t.Fresh();
    p.extra = "Idempotency-Key: " + p.key + "-second\r\n";
    t.Add("two Idempotency-Keys", p, 400, kInvalidRequest, kStaysOpen);
  }
  {
    Payment p = t.Fresh();
    p.extra = p.idempotency_key;
    t.Add("the same Idempotency-Key twice", p, 400, kInvalidRequest, kStaysOpen);
  }
  {
    // docs/idemd.md: the body is validated first. A body the fingerprint cannot take (a duplicate
    // member) with no key is answered for its body.
    Payment p = t.Fresh();
    p.KeyLine("");
    p.body = WithMember(p.body, R"("amount":"2.00")");
    t.Add("no key and a duplicate member", p, 400, kMalformedJson, kStaysOpen);
  }

  // --- Authorization ---------------------------------------------------------------------------

  // docs/idemd.md: Authorization: Bearer <api key>; missing or unknown: 401, with
  // WWW-Authenticate: Bearer (docs/openapi.yaml, Unauthorized). Two Authorization lines carry no
  // one key, so no key is there: 401 as well.
  for (const auto& [what, line] : std::vector<std::pair<std::string, std::string>>{
           {"no Authorization", ""},
           {"an empty Authorization", "Authorization: \r\n"},
           {"Basic credentials", "Authorization: Basic YWxpY2U6c2VjcmV0\r\n"},
           {"the key without a scheme", "Authorization: "s + kAlice + "\r\n"},
           {"the key under another scheme", "Authorization: Token "s + kAlice + "\r\n"},
           {"Bearer without a key", "Authorization: Bearer\r\n"},
           {"Bearer and blanks", "Authorization: Bearer   \r\n"},
           {"Bearer and a tab", "Authorization: Bearer\t"s + kAlice + "\r\n"},
           {"an unknown key", "Authorization: Bearer dev-acme-mallory-00000000\r\n"},
           {"the key in upper case", "Authorization: Bearer DEV-ACME-ALICE-7F3C9A1E\r\n"},
           {"the key and more", "Authorization: Bearer "s + kAlice + "x\r\n"},
           {"the key quoted", "Authorization: Bearer \""s + kAlice + "\"\r\n"},
           {"the key and a second word", "Authorization: Bearer "s + kAlice + " extra\r\n"},
           {"a 600-character key", "Authorization: Bearer " + std::string(600, 'k') + "\r\n"},
           {"two Authorization lines",
            "Authorization: Bearer "s + kAlice + "\r\nAuthorization: Bearer " + kAlice + "\r\n"}}) {
    Payment p = t.Fresh();
    p.authorization = line;
    t.Add(what, p, 401, kUnauthorized, kStaysOpen);
  }

  // --- Content-Type ----------------------------------------------------------------------------

  // docs/idemd.md: judged by its media type only (application/json; parameters and case do not
  // matter); anything else, or none: 415.
  for (const std::string type :
       {"", "text/plain", "text/json", "application/xml", "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x", "application/jsonp", "application/json-patch+json",
        "application/problem+json", "application/*", "*/*", "application", "json",
        "application/json charset=utf-8", "application / json", "application/json/x"}) {
    Payment p = t.Fresh();
    p.content_type = "Content-Type: " + type + "\r\n";
    t.Add("Content-Type '" + type + "'", p, 415, kUnsupportedMediaType, kStaysOpen);
  }
  {
    Payment p = t.Fresh();
    p.content_type = "";
    t.Add("no Content-Type", p, 415, kUnsupportedMediaType, kStaysOpen);
  }
  // Controls: parameters and case do not change the media type.
  for (const std::string type : {"application/json; charset=utf-8", "APPLICATION/JSON",
                                 "application/json;charset=UTF-8", "Application/Json ; q=1"}) {
    Payment p = t.Fresh();
    p.content_type = "Content-Type: " + type + "\r\n";
    t.Add("control: Content-Type '" + type + "'", p, 201, kNoProblem, kStaysOpen);
  }

  // --- Content-Encoding ------------------------------------------------------------------------

  // RFC 9110 §8.4 gives 415 for a content coding the server does not accept, and idemd decodes
  // none (docs/idemd.md, step 1).
  {
    // {"merchant_order_no":"ORD-BI-GZIP","amount":"1.00","currency":"CNY"}, gzipped.
    Payment p = t.Fresh();
    p.order = "ORD-BI-GZIP";
    p.extra = "Content-Encoding: gzip\r\n";
    p.body =
        "\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xab\x56\xca\x4d\x2d\x4a\xce\x48\xcc\x2b\x89\xcf"
        "\x2f\x4a\x49\x2d\x8a\xcf\xcb\x57\xb2\x52\xf2\x0f\x72\xd1\x75\xf2\xd4\x75\x8f\xf2\x0c\x50"
        "\xd2\x51\x4a\xcc\xcd\x2f\xcd\x2b\x01\x0a\x1b\xea\x19\x18\x00\xf9\xc9\xa5\x45\x45\xa9\x79"
        "\xc9\x95\x40\x11\x67\xbf\x48\xa5\x5a\x00\xa6\x29\x6a\xd1\x44\x00\x00\x00"s;
    t.Add("a gzip body", p, 415, kUnsupportedMediaType, kStaysOpen);
  }
  // A plain body labelled with a coding is refused too: read as it is, it would be charged.
  for (const std::string coding :
       {"gzip", "GZIP", "x-gzip", "deflate", "br", "compress", "zstd", "identity, gzip"}) {
    Payment p = t.Fresh();
    p.extra = "Content-Encoding: " + coding + "\r\n";
    t.Add("Content-Encoding " + coding + " on a plain body", p, 415, kUnsupportedMediaType,
          kStaysOpen);
  }

  // --- the body --------------------------------------------------------------------------------

  // Not JSON: 400 malformed-json (docs/idemd.md, step 1).
  for (const auto& [what, text] : std::vector<std::pair<std::string, std::string>>{
           {"an empty body", ""},
           {"a word", "hello"},
           {"an open brace", "{"},
           {"a close brace", "}"},
           {"a cut-off member", R"({"merchant_order_no":)"},
           {"single quotes", "{'merchant_order_no':'ORD-BI-SQ','amount':'1.00','currency':'CNY'}"},
           {"XML", "<payment><amount>1.00</amount></payment>"},
           {"a form", "merchant_order_no=ORD-BI-FORM&amount=1.00&currency=CNY"},
           {"a trailing comma",
            R"({"merchant_order_no":"ORD-BI-TC","amount":"1.00","currency":"CNY",})"},
           {"a comment",
            R"({"merchant_order_no":"ORD-BI-CM",/* c */"amount":"1.00","currency":"CNY"})"},
           {"an unquoted name",
            R"({merchant_order_no:"ORD-BI-UQ","amount":"1.00","currency":"CNY"})"},
           {"a missing comma",
            R"({"merchant_order_no":"ORD-BI-MC" "amount":"1.00","currency":"CNY"})"},
           {"an unterminated string", R"({"merchant_order_no":"ORD-BI-US,"amount":"1.00"})"},
           {"a bad escape",
            R"({"merchant_order_no":"ORD-BI-\q","amount":"1.00","currency":"CNY"})"},
           {"a raw newline in a string",
            "{\"merchant_order_no\":\"ORD-BI-\nNL\",\"amount\":\"1.00\","
            "\"currency\":\"CNY\"}"}}) {
    Payment p = t.Fresh();
    p.body = text;
    t.Add(what, p, 400, kMalformedJson, kStaysOpen);
  }
  // Numbers that are not JSON numbers (RFC 8259 §6), as the amount.
  for (const std::string amount : {"NaN", "Infinity", "-Infinity", "0100", ".5", "+1", "1.", "0x10",
                                   "-", "1e", "1.0e+", "--1", "1_000"}) {
    Payment p = t.Fresh();
    p.body = PaymentBody(p.order, amount);
    t.Add("the amount " + amount, p, 400, kMalformedJson, kStaysOpen);
  }
  // JSON, but not an object: the body fails validation (docs/openapi.yaml: PaymentRequest is an
  // object), 400 validation-failed.
  for (const auto& [what, text] : std::vector<std::pair<std::string, std::string>>{
           {"an empty array", "[]"},
           {"the payment in an array", "[" + PaymentBody("ORD-BI-ARRAY") + "]"},
           {"a string", R"("ORD-BI-STRING")"},
           {"a number", "100"},
           {"null", "null"},
           {"true", "true"},
           {"false", "false"}}) {
    Payment p = t.Fresh();
    p.body = text;
    t.Add("a body of " + what, p, 400, kValidationFailed, kStaysOpen);
  }
  // Something after the JSON text (RFC 8259 §2: one value, then only white space).
  for (const auto& [what, after] : std::vector<std::pair<std::string, std::string>>{
           {"a word", " x"},
           {"a second object", "{}"},
           {"the body again", PaymentBody("ORD-BI-AGAIN")},
           {"a comma", ","},
           {"a bracket", "]"},
           {"a quote", "\""},
           {"a comment", " // c"},
           {"a NUL", "\0"s}}) {
    Payment p = t.Fresh();
    p.body += after;
    t.Add("trailing " + what, p, 400, kMalformedJson, kStaysOpen);
  }
  // Duplicate member names. RFC 8259 §4 leaves their meaning unpredictable; idemd cannot
  // fingerprint them, and docs/idemd.md (step 1) counts them as malformed JSON: 400, judged with
  // the body, before any record.
  for (const auto& [what, member] : std::vector<std::pair<std::string, std::string>>{
           {"amount twice, different", R"("amount":"2.00")"},
           {"amount twice, equal", R"("amount":"100.00")"},
           {"currency twice", R"("currency":"USD")"},
           {"merchant_order_no twice", R"("merchant_order_no":"ORD-BI-TWICE")"},
           {"a duplicate inside metadata", R"("metadata":{"k":"a","k":"b"})"}}) {
    Payment p = t.Fresh();
    p.body = WithMember(p.body, member);
    t.Add(what, p, 400, kMalformedJson, kStaysOpen);
  }
  // docs/openapi.yaml: additionalProperties: false.
  for (const std::string name : {"foo", "Amount", "merchant_order", "", "amount ", "__proto__",
                                 "id", "status", "a\\u0000b"}) {
    Payment p = t.Fresh();
    p.body = WithMember(p.body, "\"" + name + "\":1");
    t.Add("the unknown field '" + name + "'", p, 400, kValidationFailed, kStaysOpen);
  }
  // Required: merchant_order_no, amount, currency.
  for (const auto& [what, text] : std::vector<std::pair<std::string, std::string>>{
           {"no merchant_order_no", R"({"amount":"100.00","currency":"CNY"})"},
           {"no amount", R"({"merchant_order_no":"ORD-BI-NOAMT","currency":"CNY"})"},
           {"no currency", R"({"merchant_order_no":"ORD-BI-NOCUR","amount":"100.00"})"},
           {"an empty object", "{}"}}) {
    Payment p = t.Fresh();
    p.body = text;
    t.Add(what, p, 400, kValidationFailed, kStaysOpen);
  }
  // Wrong types and values of merchant_order_no: 1..64 of A-Z a-z 0-9 - _.
  for (const std::string& order : std::vector<std::string>{
           "1001", "null", "true", R"(["ORD-BI-A"])", R"({"no":"ORD-BI-O"})", R"("")",
           "\"" + std::string(65, 'O') + "\"", R"("ORD BI")", R"("ORD/BI")", R"("ORD.BI")",
           R"("ORD#BI")", "\"ORD-\xc3\xa9\"", R"("ORD\u0000BI")", R"("ORD\nBI")"}) {
    Payment p = t.Fresh();
    p.body = R"({"merchant_order_no":)" + order + R"(,"amount":"100.00","currency":"CNY"})";
    t.Add("merchant_order_no " + order.substr(0, 24), p, 400, kValidationFailed, kStaysOpen);
  }
  // The amount: a number, or a string holding a plain decimal (no sign, exponent, spaces or
  // leading zeros); > 0; at most the currency's minor digits (docs/idemd.md, docs/openapi.yaml).
  for (const std::string amount :
       {R"("1e2")", R"("1E2")", R"("1.5e1")", R"("-1")", R"("+1")", R"(" 1")", R"("1 ")", R"(".5")",
        R"("5.")", R"("0100")", R"("1,00")", R"("0x10")", R"("")", R"("abc")", R"("NaN")",
        R"("Infinity")", R"("1.2.3")", "\"\xd9\xa1\xd9\xa0\xd9\xa0\"", R"("100\u0000")"}) {
    Payment p = t.Fresh();
    p.body = PaymentBody(p.order, amount);
    t.Add("the string amount " + amount, p, 400, kValidationFailed, kStaysOpen);
  }
  for (const std::string amount :
       {"true", "false", "null", "[]", R"(["1.00"])", R"({"v":"1.00"})"}) {
    Payment p = t.Fresh();
    p.body = PaymentBody(p.order, amount);
    t.Add("the amount " + amount, p, 400, kValidationFailed, kStaysOpen);
  }
  for (const std::string amount : {R"("0")", R"("0.00")", "0", "0.0", "-0", "0e5",  // zero
                                   "-1", "-0.01", "-1e2", "-100.00",                // negative
                                   R"("0.001")", R"("100.001")", "100.001", "1e-3", "0.005"}) {
    Payment p = t.Fresh();
    p.body = PaymentBody(p.order, amount);
    t.Add("the amount " + amount, p, 400, kValidationFailed, kStaysOpen);
  }
  for (const std::string amount : {R"("100.5")", "100.5", R"("0.5")", "1e-1"}) {
    Payment p = t.Fresh();
    p.body = PaymentBody(p.order, amount, R"("JPY")");
    t.Add("the JPY amount " + amount, p, 400, kValidationFailed, kStaysOpen);
  }
  // Huge amounts. The documents give no upper bound; an amount of 10^18 minor units or more
  // cannot be held (or charged), so it is a field error on the amount like any invalid one: 400.
  for (const std::string amount : {"1e30", R"("1000000000000000000000")", "1e16",
                                   R"("10000000000000000.00")", "123456789012345678901234567890"}) {
    Payment p = t.Fresh();
    p.body = PaymentBody(p.order, amount);
    t.Add("the amount " + amount, p, 400, kValidationFailed, kStaysOpen);
  }
  // The currency: one of the configured ISO 4217 codes (CNY, USD, EUR, JPY).
  for (const std::string currency :
       {R"("cny")", R"("XXX")", R"("GBP")", R"("CN")", R"("CNYY")", R"("")", R"(" CNY")",
        R"("CNY ")", "\"\xe2\x82\xac\"", R"("CN\u0000")", "156", "null", "true", R"(["CNY"])",
        R"({"code":"CNY"})"}) {
    Payment p = t.Fresh();
    p.body = PaymentBody(p.order, R"("100.00")", currency);
    t.Add("the currency " + currency, p, 400, kValidationFailed, kStaysOpen);
  }
  // description: a string of at most 256; metadata: an object of at most 50 members.
  for (const std::string& member : std::vector<std::string>{
           R"("description":1)", R"("description":null)", R"("description":{})",
           R"("description":["a"])", "\"description\":\"" + std::string(257, 'd') + "\"",
           R"("metadata":"k=v")", R"("metadata":[])", R"("metadata":1)", R"("metadata":null)"}) {
    Payment p = t.Fresh();
    p.body = WithMember(p.body, member);
    t.Add("the member " + member.substr(0, 32), p, 400, kValidationFailed, kStaysOpen);
  }
  {
    Payment p = t.Fresh();
    std::string metadata;
    for (int i = 0; i < 51; ++i) metadata += (i ? "," : "") + ("\"k" + std::to_string(i) + "\":1");
    p.body = WithMember(p.body, R"("metadata":{)" + metadata + "}");
    t.Add("metadata of 51 members", p, 400, kValidationFailed, kStaysOpen);
  }
  // Deep nesting. RFC 8259 §9 lets a parser limit it; docs/idemd.md (step 1): deeper than 32 is
  // malformed JSON, 400.
  {
    Payment p = t.Fresh();
    std::string nested = "1";
    for (int i = 0; i < 40; ++i) nested = "{\"a\":" + nested + "}";
    p.body = WithMember(p.body, "\"metadata\":" + nested);
    t.Add("metadata 40 objects deep", p, 400, kMalformedJson, kStaysOpen);
  }
  {
    Payment p = t.Fresh();
    p.body = WithMember(p.body,
                        R"("metadata":{"a":)" + std::string(40, '[') + std::string(40, ']') + "}");
    t.Add("metadata 40 arrays deep", p, 400, kMalformedJson, kStaysOpen);
  }
  {
    Payment p = t.Fresh();
    p.body = std::string(10000, '[') + std::string(10000, ']');
    t.Add("a body 10000 arrays deep", p, 400, kMalformedJson, kStaysOpen);
  }
  {
    // The fingerprint's other limits (docs/idemd.md, step 1): a number's exponent, a container's
    // size.
    Payment p = t.Fresh();
    p.body = WithMember(p.body, R"("metadata":{"n":1e5000})");
    t.Add("a number past the exponent limit", p, 400, kMalformedJson, kStaysOpen);
  }
  {
    Payment p = t.Fresh();
    std::string items = "1";
    for (int i = 0; i < 5000; ++i) items += ",1";
    p.body = WithMember(p.body, R"("metadata":{"a":[)" + items + "]}");
    t.Add("an array of 5001 items", p, 400, kMalformedJson, kStaysOpen);
  }
  // Invalid UTF-8 (RFC 8259 §8.1: JSON text is UTF-8), and escaped surrogates that stand alone
  // (§8.2 leaves them unpredictable; they name no character, so idemd reads no JSON there).
  for (const auto& [what, text] : std::vector<std::pair<std::string, std::string>>{
           {"0xFF", "\xff"},
           {"an overlong '/'", "\xc0\xaf"},
           {"a cut-off sequence", "\xe2\x82"},
           {"a UTF-8 surrogate", "\xed\xa0\x80"},
           {"a code point past U+10FFFF", "\xf4\x90\x80\x80"},
           {"a lone continuation byte", "\x80"},
           {"an escaped lone high surrogate", "\\ud800"},
           {"an escaped lone low surrogate", "\\udc00"},
           {"escaped surrogates reversed", "\\udc00\\ud800"}}) {
    Payment p = t.Fresh();
    p.body = WithMember(p.body, "\"description\":\"" + text + "\"");
    t.Add(what + " in a string", p, 400, kMalformedJson, kStaysOpen);
  }
  {
    Payment p = t.Fresh();
    p.body = WithMember(p.body, "\"\xff\":1");
    t.Add("0xFF in a member name", p, 400, kMalformedJson, kStaysOpen);
  }
  // NUL bytes: raw ones are no JSON (RFC 8259 §7: control characters are escaped); escaped ones
  // make a value or a name no field allows.
  for (const auto& [what, text] : std::vector<std::pair<std::string, std::string>>{
           {"a NUL inside a string",
            "{\"merchant_order_no\":\"ORD-BI-\0NUL\",\"amount\":\"1.00\",\"currency\":\"CNY\"}"s},
           {"a NUL between members",
            "{\"merchant_order_no\":\"ORD-BI-NUL\",\0\"amount\":\"1.00\",\"currency\":\"CNY\"}"s},
           {"a NUL before the body",
            "\0{\"merchant_order_no\":\"ORD-BI-NUL\",\"amount\":\"1.00\",\"currency\":\"CNY\"}"s},
           {"only NULs", "\0\0\0\0"s}}) {
    Payment p = t.Fresh();
    p.body = text;
    t.Add(what, p, 400, kMalformedJson, kStaysOpen);
  }
  // The body stops short of its Content-Length, or of its last chunk: the request is incomplete,
  // and docs/config.md cuts off a client whose request has not arrived within read_timeout_ms.
  // No answer; the connection closes.
  {
    Payment p = t.Fresh();
    p.framing = "Content-Length: " + std::to_string(p.body.size() + 10) + "\r\n";
    t.Add("a body shorter than its Content-Length", p, 0, kNoProblem, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.framing = "Transfer-Encoding: chunked\r\n";
    p.body = Hex(p.body.size()) + "\r\n" + p.body + "\r\n";
    t.Add("a chunked body without its last chunk", p, 0, kNoProblem, kCloses);
  }
  // Over 64 KiB: 413 (docs/idemd.md), before the body is read (only the head is sent), so the
  // connection closes.
  for (const std::size_t length : {kMaxBody + 1, std::size_t{10'000'000}}) {
    Payment p = t.Fresh();
    p.framing = "Content-Length: " + std::to_string(length) + "\r\n";
    p.body.clear();
    t.Add("a declared body of " + std::to_string(length) + " bytes", p, 413, kPayloadTooLarge,
          kCloses);
  }
  {
    Payment p = t.Fresh();
    p.framing = "Transfer-Encoding: chunked\r\n";
    p.body = Hex(kMaxBody + 1) + "\r\n";
    t.Add("a chunk over 64 KiB", p, 413, kPayloadTooLarge, kCloses);
  }
  {
    Payment p = t.Fresh();
    p.framing = "Transfer-Encoding: chunked\r\n";
    p.body = Hex(kMaxBody / 2) + "\r\n" + std::string(kMaxBody / 2, ' ') + "\r\n" +
             Hex(kMaxBody / 2 + 1) + "\r\n";
    t.Add("chunks adding up to over 64 KiB", p, 413, kPayloadTooLarge, kCloses);
  }
  {
    // Exactly 64 KiB is not over the limit: it is read, and judged (an unknown member).
    Payment p = t.Fresh();
    const std::string prefix = WithMember(p.body, R"("padding":")");
    p.body = prefix.substr(0, prefix.size() - 1) + std::string(kMaxBody - prefix.size() - 1, 'p') +
             "\"}";
    t.Add("a body of exactly 64 KiB", p, 400, kValidationFailed, kStaysOpen);
  }

  // --- controls --------------------------------------------------------------------------------

  // docs/idemd.md: HTTP/1.0 without Host is served (and its connection then closes).
  {
    Payment p = t.Fresh();
    p.request_line = "POST /v1/payments HTTP/1.0";
    p.host = "";
    t.Add("control: HTTP/1.0 without Host", p, 201, kNoProblem, kCloses);
  }
  t.Add("control: a well-formed payment, last", t.Fresh(), 201, kNoProblem, kStaysOpen);
  return std::move(t.cases);
}

// One HTTP/1.1 answer as read off the wire.
struct Answer {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string rest;  // whatever followed the first answer

  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

Answer ParseAnswer(const std::string& raw) {
  Answer a;
  const std::size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) {
    a.rest = raw;
    return a;
  }
  a.status = std::atoi(raw.c_str() + 9);
  for (std::size_t at = raw.find("\r\n") + 2; at < head_end;) {
    const std::size_t eol = raw.find("\r\n", at);
    const std::string line = raw.substr(at, eol - at);
    const std::size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      a.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    }
    at = eol + 2;
  }
  const std::size_t length = a.headers.contains("content-length")
                                 ? std::stoul(a.headers["content-length"])
                                 : raw.size() - head_end - 4;
  a.body = raw.substr(head_end + 4, length);
  a.rest = raw.substr(std::min(raw.size(), head_end + 4 + length));
  return a;
}

class BadInputTest : public IdemdTest {
 public:
  // The reference of every charge provider-sim made, from its listing.
  std::set<std::string> ChargeReferences() {
    std::set<std::string> references;
    std::string after;
    while (true) {
      const std::string target =
          "/v1/charges?limit=100" + (after.empty() ? "" : "&starting_after=" + after);
      auto r = http::Call(provider_url_, http::Request{"GET", target, {}, {}});
      EXPECT_TRUE(r && r->status == 200) << (r ? r->body : r.error().message);
      if (!r || r->status != 200) return references;
      json::object page = ParseObject(r->body);
      for (const json::value& charge : page["data"].as_array()) {
        references.insert(std::string(charge.at("reference").as_string()));
        after = std::string(charge.at("id").as_string());
      }
      if (!page["has_more"].as_bool()) return references;
    }
  }
};

TEST_F(BadInputTest, EveryCaseIsAnsweredAsDocumentedAndNothingIsRecordedOrCharged) {
  const std::vector<Case> cases = BadInputCases();
  // Each request has its own key and merchant order, so every effect is attributable to a case.
  std::set<std::string> keys;
  std::set<std::string> orders;
  for (const Case& c : cases) {
    EXPECT_TRUE(c.key.empty() || keys.insert(c.key).second) << c.name;
    EXPECT_TRUE(c.order.empty() || orders.insert(c.order).second) << c.name;
  }
  EXPECT_GE(cases.size(), 150u);

  std::map<std::string, std::string> paid;  // merchant order → payment id, of the 201s
  int64_t charges = TotalCharges();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RawConnection connection(idemd_url_.port);
    ASSERT_TRUE(connection.Connected());
    // A refusal may come, and the connection close, before every byte is sent.
    (void)connection.Send(c.raw);
    const std::string raw =
        c.closes ? connection.ReadAll(kAnswerWait) : connection.ReadResponse(kAnswerWait);
    const Answer answer = ParseAnswer(raw);
    const std::string shown = raw.substr(0, 400);

    // 1. The status, and the problem type of a problem answer.
    EXPECT_EQ(answer.status, c.status) << shown;
    if (!c.problem.empty()) {
      EXPECT_EQ(answer.Header("content-type"), "application/problem+json") << shown;
      boost::system::error_code ec;
      const json::value problem = json::parse(answer.body, ec);
      ASSERT_FALSE(ec) << shown;
      ASSERT_TRUE(problem.is_object()) << shown;
      const json::value* type = problem.as_object().if_contains("type");
      EXPECT_EQ(type != nullptr && type->is_string() ? std::string(type->as_string()) : "",
                c.problem)
          << shown;
      const json::value* status = problem.as_object().if_contains("status");
      EXPECT_EQ(status != nullptr && status->is_int64() ? status->as_int64() : 0, c.status)
          << shown;
    }
    if (c.status == 401) {
      EXPECT_EQ(answer.Header("www-authenticate"), "Bearer") << shown;
    }
    if (c.status == 405) {
      EXPECT_EQ(answer.Header("allow"), "POST") << shown;
    }
    if (c.status == 201) {
      json::object payment = ParseObject(answer.body);
      ASSERT_TRUE(payment.contains("id") && payment.contains("merchant_order_no")) << shown;
      EXPECT_EQ(std::string(payment["merchant_order_no"].as_string()), c.order);
      paid[c.order] = std::string(payment["id"].as_string());
    }

    // The connection: closed with nothing after the one answer, or still in step, serving the
    // next request on it.
    if (c.closes) {
      EXPECT_TRUE(connection.Closed()) << shown;
      EXPECT_EQ(answer.rest, "") << "a second answer on a closed connection: " << shown;
    } else {
      const bool sent = connection.Send("GET /healthz HTTP/1.1\r\nHost: idemd.test\r\n\r\n");
      EXPECT_TRUE(sent) << "the connection was closed: " << shown;
      if (sent) {
        const Answer next = ParseAnswer(connection.ReadResponse(kAnswerWait));
        EXPECT_EQ(next.status, 200) << "the next request on the same connection";
        EXPECT_EQ(next.body, R"({"status":"ok"})");
      }
    }

    // 2. idemd is still up.
    ASSERT_EQ(Get("/healthz", "").status, 200) << "idemd stopped serving after this case";

    // 3. Its effect: a record for its key and one charge when it was paid, else neither.
    if (!c.key.empty()) {
      EXPECT_EQ(Get("/v1/operations/" + c.key).status, c.status == 201 ? 200 : 404);
    }
    const int64_t now = TotalCharges();
    EXPECT_EQ(now - charges, c.status == 201 ? 1 : 0) << "charges made by this case";
    charges = now;
  }

  // At the end, from the store itself: no record under the key of any rejected request, none but
  // the controls' at all, and a payment row for the controls' orders only.
  std::unique_ptr<Store> store = OpenExistingStore("sqlite://" + dir_.File("idem.db"));
  ASSERT_NE(store, nullptr);
  for (const Case& c : cases) {
    if (c.key.empty()) continue;
    auto scope = Scope{"acme", "alice", std::string(idemd::kPaymentsCreateRoute), c.key}.Hash();
    ASSERT_TRUE(scope.has_value()) << c.name;
    auto record = store->Read(*scope);
    ASSERT_TRUE(record.has_value()) << record.error().message;
    EXPECT_EQ(record->has_value(), c.status == 201) << c.name;
  }
  auto records = store->Query("SELECT count(*) FROM idem_records");
  ASSERT_TRUE(records.has_value()) << records.error().message;
  EXPECT_EQ(std::get<int64_t>((*records)[0][0]), static_cast<int64_t>(paid.size()));
  auto rows = store->Query("SELECT merchant_order_no, id FROM payments");
  ASSERT_TRUE(rows.has_value()) << rows.error().message;
  std::map<std::string, std::string> payments;
  for (const SqlRow& row : *rows) {
    payments[std::get<std::string>(row[0])] = std::get<std::string>(row[1]);
  }
  EXPECT_EQ(payments, paid);
  EXPECT_GE(paid.size(), 2u) << "the controls were paid";

  // And from provider-sim: a charge for each control's payment, and none for anything else.
  std::set<std::string> paid_ids;
  for (const auto& [order, id] : paid) paid_ids.insert(id);
  EXPECT_EQ(ChargeReferences(), paid_ids);
  EXPECT_EQ(TotalCharges(), static_cast<int64_t>(paid.size()));
}

}  // namespace
}  // namespace idem::itest
