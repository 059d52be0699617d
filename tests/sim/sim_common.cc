// tests/sim/sim_common.cc — what the simulator's parts share.
#include "tests/sim/sim_common.h"

#include <boost/json.hpp>

namespace idem::sim {

std::string StringMember(std::string_view json, std::string_view name) {
  boost::system::error_code ec;
  const boost::json::value doc = boost::json::parse(json, ec);
  if (ec || !doc.is_object()) return "";
  const boost::json::value* member = doc.as_object().if_contains(name);
  return member != nullptr && member->is_string() ? std::string(member->as_string())
                                                  : std::string();
}

http::Async<void> SimDelays::Wait(Millis d) {
  if (!at_once_ && d > Millis(0)) co_await http::SleepFor(d);
}

}  // namespace idem::sim
