// http/beast_request.h — a request as Beast parsed it, into the plain Request of
// message.h. Inside the HTTP layer only: server.cc, and the HTTP fuzz target (fuzz/http_fuzz.cc),
// which runs Beast's parser header-only and so reaches this without the server.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <iterator>
#include <string>
#include <utility>

#include "http/message.h"

namespace idem::http {

inline Request FromBeast(boost::beast::http::request<boost::beast::http::string_body>&& in) {
  Request out;
  out.method = std::string(in.method_string());
  out.target = std::string(in.target());
  // Room for the fields the server sets after (traceparent, Host from an absolute target).
  out.headers.fields.reserve(static_cast<std::size_t>(std::distance(in.begin(), in.end())) + 2);
  for (const auto& field : in) out.headers.Add(field.name_string(), field.value());
  out.body = std::move(in.body());
  return out;
}

}  // namespace idem::http
