// server/http/client.cc — blocking calls built from Beast's async operations on a private
// io_context, so every step has a deadline.
#include "server/http/client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/url/parse.hpp>

namespace idem::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

Result<Url> ParseHttpUrl(std::string_view text) {
  auto parsed = boost::urls::parse_absolute_uri(text);
  if (!parsed || parsed->scheme() != "http" || parsed->host().empty()) {
    return MakeError(Errc::kInvalidArgument,
                     "'" + std::string(text) + "' is not an absolute http:// URL with a host");
  }
  Url url;
  url.host = std::string(parsed->host());
  if (parsed->has_port()) {
    const auto port = parsed->port_number();
    if (port == 0)
      return MakeError(Errc::kInvalidArgument, "bad port in '" + std::string(text) + "'");
    url.port = port;
  }
  url.base_path = std::string(parsed->encoded_path());
  while (!url.base_path.empty() && url.base_path.back() == '/') url.base_path.pop_back();
  return url;
}

Result<Response> Call(const Url& url, Request request, const CallOptions& options) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  boost::system::error_code failure;
  bool sent = false;
  Response out;

  bhttp::request<bhttp::string_body> req;
  req.method_string(request.method);
  req.target(request.target);
  req.version(11);
  for (auto& [name, value] : request.headers.fields) req.insert(name, value);
  req.set(bhttp::field::host, url.host + ":" + std::to_string(url.port));
  req.body() = std::move(request.body);
  req.keep_alive(false);
  req.prepare_payload();

  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(options.max_response_bytes);

  tcp::resolver resolver(ioc);
  resolver.async_resolve(
      url.host, std::to_string(url.port),
      [&](boost::system::error_code ec, tcp::resolver::results_type endpoints) {
        if (ec) {
          failure = ec;
          return;
        }
        stream.expires_after(options.connect_timeout);
        stream.async_connect(endpoints, [&](boost::system::error_code ec2, const tcp::endpoint&) {
          if (ec2) {
            failure = ec2;
            return;
          }
          stream.expires_after(options.timeout);
          bhttp::async_write(stream, req, [&](boost::system::error_code ec3, std::size_t) {
            if (ec3) {
              failure = ec3;
              return;
            }
            sent = true;
            bhttp::async_read(stream, buffer, parser,
                              [&](boost::system::error_code ec4, std::size_t) { failure = ec4; });
          });
        });
      });
  ioc.run();

  if (failure) {
    const std::string what = "http " + request.method + " " + url.host + ":" +
                             std::to_string(url.port) + request.target + ": " + failure.message();
    return MakeError(sent ? Errc::kDeadlineExceeded : Errc::kUnavailable, what);
  }
  auto& res = parser.get();
  out.status = static_cast<int>(res.result_int());
  for (const auto& field : res) out.headers.Add(field.name_string(), field.value());
  out.body = std::move(res.body());
  return out;
}

}  // namespace idem::http
