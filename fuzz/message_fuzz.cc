// fuzz/message_fuzz.cc — the plain HTTP values of http/message.h on arbitrary text: RFC
// 3339 times, header lookups, request targets and query parameters, request ids.
//
// Properties: a time ParseRfc3339 accepts (within years 0000..9999) is written by Rfc3339 as a
// time it parses back to the same millisecond; a header added under any name is found by it, and
// Set leaves exactly one; Path and Query split the target at its first '?'; a query parameter's
// value holds no '&'; a request id is the client's only when sane.
#include <string>

#include "fuzz/fuzz.h"
#include "http/message.h"

namespace {

using idem::http::Headers;
using idem::http::Request;

// 0000-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z: the times RFC 3339 can write.
constexpr int64_t kFirstMs = -62167219200000;
constexpr int64_t kLastMs = 253402300799999;

void CheckTime(std::string_view text) {
  const auto ms = idem::http::ParseRfc3339(text);
  if (!ms || *ms < kFirstMs || *ms > kLastMs) return;
  const std::string written = idem::http::Rfc3339(*ms);
  IDEM_FUZZ_CHECK(idem::http::ParseRfc3339(written) == ms);
  (void)idem::http::HttpDate(*ms);
}

void CheckHeaders(std::string_view name) {
  Headers headers;
  headers.Add("Content-Type", "application/json");
  headers.Add(name, "first");
  headers.Add(name, "second");
  IDEM_FUZZ_CHECK(headers.Get(name).has_value());
  IDEM_FUZZ_CHECK(headers.Count(name) >= 2);
  IDEM_FUZZ_CHECK(headers.Get(idem::http::ToLower(name)) == headers.Get(name));
  headers.Set(name, "only");
  IDEM_FUZZ_CHECK(headers.Count(name) == 1 && headers.Get(name) == "only");
}

void CheckTarget(std::string_view text) {
  Request request;
  request.target = std::string(text);
  const std::string_view path = request.Path();
  const std::string_view query = request.Query();
  const std::size_t question = text.find('?');
  IDEM_FUZZ_CHECK(path == text.substr(0, question));
  IDEM_FUZZ_CHECK(question == std::string_view::npos ? query.empty()
                                                     : query == text.substr(question + 1));
  const std::string_view first_name = query.substr(0, query.find_first_of("=&"));
  for (std::string_view name : {first_name, std::string_view("reference"), std::string_view("")}) {
    if (auto value = request.QueryParam(name)) {
      IDEM_FUZZ_CHECK(value->find('&') == std::string_view::npos);
      IDEM_FUZZ_CHECK(value->empty() ||
                      (value->data() >= query.data() &&
                       value->data() + value->size() <= query.data() + query.size()));
    }
  }
  if (!query.empty() && !first_name.empty()) IDEM_FUZZ_CHECK(request.QueryParam(first_name));
}

void CheckRequestId(std::string_view text) {
  Request request;
  request.headers.Add("X-Request-Id", text);
  const std::string id = idem::http::RequestId(request, idem::SystemClock(), idem::SystemRandom());
  // The client's id as it came, or a fresh UUIDv7.
  IDEM_FUZZ_CHECK(id == text || (id.size() == 36 && id[8] == '-' && id[14] == '7'));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text = idem::fuzz::AsText(data, size);
  CheckTime(text);
  CheckHeaders(text);
  CheckTarget(text);
  CheckRequestId(text);
  return 0;
}
