// testing/http_answers.h — reading parts of an http::Response in assertions. Header-only: only
// tests that link the HTTP layer include it.
#pragma once

#include <boost/json.hpp>
#include <string>
#include <string_view>

#include "http/message.h"

namespace idem::testing {

// The `type` of a problem+json body, or "<no problem type>".
inline std::string TypeOf(const http::Response& r) {
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(r.body, ec);
  if (ec || !v.is_object() || !v.as_object().contains("type")) return "<no problem type>";
  return std::string(v.at("type").as_string());
}

// The value of header `name`, or "<absent>".
inline std::string HeaderOf(const http::Response& r, std::string_view name) {
  return std::string(r.headers.Get(name).value_or("<absent>"));
}

}  // namespace idem::testing
