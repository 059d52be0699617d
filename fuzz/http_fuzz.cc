// fuzz/http_fuzz.cc — the HTTP request path from bytes to what a handler reads.
//
// idemd's server (http/server.cc) reads requests only from a socket, so this target runs
// the same steps without one: Beast's request_parser with the server's limits (ServerOptions
// defaults), pipelined requests while the connection stays alive, the server's own conversion
// (FromBeast) and request id (RequestId), then what idemd's routes take from a request — path and
// query parameters, headers, the Idempotency-Key (ParseIdempotencyKey), the media type and the
// canonical JSON body (the payments rules), RFC 3339 query times. Routing itself (Service) needs
// a store and is not reached.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <string>
#include <vector>

#include "fuzz/fuzz.h"
#include "http/beast_request.h"
#include "http/message.h"
#include "http/server.h"
#include "idem/canonical.h"
#include "idem/fingerprint.h"
#include "idem/key.h"

namespace {

namespace bhttp = boost::beast::http;
using idem::http::Request;

bool SaneId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
          c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

void Handle(Request& request) {
  // The target splits into path and query at the first '?'.
  const std::string_view path = request.Path();
  const std::string_view query = request.Query();
  IDEM_FUZZ_CHECK(request.target.starts_with(path));
  if (path.size() < request.target.size()) {
    IDEM_FUZZ_CHECK(request.target[path.size()] == '?' &&
                    query.size() == request.target.size() - path.size() - 1);
  } else {
    IDEM_FUZZ_CHECK(query.empty());
  }
  for (const char* name : {"reference", "created_gte", "created_lt", "limit", "starting_after"}) {
    if (auto value = request.QueryParam(name)) {
      IDEM_FUZZ_CHECK(value->find('&') == std::string_view::npos);
      (void)idem::http::ParseRfc3339(*value);
    }
  }

  // Header names are stored lower-cased; every one is found by its name.
  for (const auto& [name, value] : request.headers.fields) {
    IDEM_FUZZ_CHECK(idem::http::ToLower(name) == name);
    IDEM_FUZZ_CHECK(request.headers.Get(name).has_value() && request.headers.Count(name) >= 1);
  }
  const std::string id = idem::http::RequestId(request, idem::SystemClock(), idem::SystemRandom());
  IDEM_FUZZ_CHECK(SaneId(id));
  request.headers.Set("X-Request-Id", id);
  IDEM_FUZZ_CHECK(request.headers.Count("x-request-id") == 1 &&
                  request.headers.Get("X-REQUEST-ID") == id);

  // What the payments filter reads before the engine.
  static const idem::KeyPolicy kKeys;
  if (auto key = request.headers.Get("idempotency-key")) {
    (void)idem::ParseIdempotencyKey(*key, kKeys);
  }
  const std::string media =
      idem::MediaTypeOf(request.headers.Get("content-type").value_or(std::string_view()));
  if (media == "application/json") {
    static const idem::CanonicalRules kRules = [] {
      idem::CanonicalRules r;
      r.money_fields = {"amount"};
      r.removed_fields = {"trace_id"};
      r.defaults = {{"description", "\"\""}, {"metadata", "{}"}};
      return r;
    }();
    (void)idem::Canonicalize(request.body, kRules);
  }
}

// What one connection carried: the requests read, and the error that ended it (none when the
// input ran out: the server would wait for more, then time out).
struct Connection {
  std::vector<Request> requests;
  boost::beast::error_code ended;
};

// Reads requests from `input` as the server's session does (bhttp::async_read into one buffer):
// the bytes arrive `segment` at a time (0: all at once), the parser sees the buffer's unconsumed
// bytes, and after need_more it is called again only once more have arrived. Requests follow one
// another while each asks to keep the connection alive.
Connection Read(std::string_view input, std::size_t segment) {
  static const idem::http::ServerOptions kOptions;
  Connection connection;
  std::string buffer;
  std::size_t arrived = 0;
  auto arrive = [&] {
    if (arrived == input.size()) return false;
    const std::size_t n =
        segment == 0 ? input.size() - arrived : std::min(segment, input.size() - arrived);
    buffer.append(input.substr(arrived, n));
    arrived += n;
    return true;
  };
  for (int i = 0; i < 16; ++i) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(kOptions.max_header_bytes));
    parser.body_limit(kOptions.max_body_bytes);
    parser.eager(true);
    bool starved = buffer.empty();
    while (!parser.is_done()) {
      if (starved && !arrive()) return connection;
      boost::beast::error_code ec;
      const std::size_t used = parser.put(boost::asio::buffer(buffer.data(), buffer.size()), ec);
      IDEM_FUZZ_CHECK(used <= buffer.size());
      buffer.erase(0, used);
      if (ec && ec != bhttp::error::need_more) {
        connection.ended = ec;  // the server answers 400, 413 or 431 and closes
        return connection;
      }
      starved = ec == bhttp::error::need_more || !parser.is_done();
    }
    const bool keep_alive = parser.keep_alive();
    connection.requests.push_back(idem::http::FromBeast(parser.release()));
    if (!keep_alive) break;
  }
  return connection;
}

bool Same(const Request& a, const Request& b) {
  return a.method == b.method && a.target == b.target && a.headers.fields == b.headers.fields &&
         a.body == b.body;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view input = idem::fuzz::AsText(data, size);
  Connection whole = Read(input, 0);
  // However the bytes are cut into reads, no other request comes out, and none that one read
  // refuses. Not the same outcome in every case, by Beast's design: once a header was incomplete,
  // the parser waits for its blank line before parsing it again, so a malformed header that
  // arrives in pieces is not refused at once (400) but waits for the read timeout or the header
  // limit (431).
  for (std::size_t segment : {std::size_t{1}, std::size_t{7}}) {
    const Connection cut = Read(input, segment);
    IDEM_FUZZ_CHECK(cut.requests.size() <= whole.requests.size());
    for (std::size_t i = 0; i < cut.requests.size(); ++i) {
      IDEM_FUZZ_CHECK(Same(cut.requests[i], whole.requests[i]));
    }
    if (cut.ended) {
      IDEM_FUZZ_CHECK(whole.ended && cut.requests.size() == whole.requests.size());
      IDEM_FUZZ_CHECK(cut.ended == whole.ended || cut.ended == bhttp::error::header_limit);
    }
  }
  for (Request& request : whole.requests) Handle(request);
  return 0;
}
