// src/core/failpoint.cc — the failpoint registry. Unarmed points cost one relaxed atomic load.
#include "idem/failpoint.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "idem/mutex.h"

namespace idem {
namespace {

struct Action {
  enum class Kind { kCrash, kStall, kError } kind;
  std::chrono::milliseconds stall{0};
};

std::atomic<bool> g_any_armed{false};
// Bit i: kRevertibleFixes[i] is taken back.
std::atomic<uint32_t> g_reverted{0};
static_assert(kRevertibleFixes.size() <= 32);

std::optional<std::size_t> RevertibleIndex(std::string_view name) {
  for (std::size_t i = 0; i < kRevertibleFixes.size(); ++i) {
    if (kRevertibleFixes[i] == name) return i;
  }
  return std::nullopt;
}
Mutex g_mu;
std::map<std::string, Action, std::less<>>& Points() IDEM_REQUIRES(g_mu) {
  static std::map<std::string, Action, std::less<>> points;
  return points;
}

}  // namespace

Status ArmFailpoints(std::string_view spec) {
  std::map<std::string, std::optional<Action>> parsed;
  while (!spec.empty()) {
    const std::size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return MakeError(Errc::kInvalidArgument, "failpoint spec: expected name=action");
    }
    const std::string name(item.substr(0, eq));
    const std::string_view action = item.substr(eq + 1);
    bool listed = false;
    for (std::string_view known : kFailpoints) listed = listed || known == name;
    if (!listed) {
      std::string known_names;
      for (std::string_view known : kFailpoints) {
        known_names += (known_names.empty() ? "" : ", ") + std::string(known);
      }
      return MakeError(Errc::kInvalidArgument,
                       "failpoint spec: no failpoint '" + name + "' (known: " + known_names + ")");
    }
    if (action == "crash") {
      parsed[name] = Action{Action::Kind::kCrash};
    } else if (action == "error") {
      parsed[name] = Action{Action::Kind::kError};
    } else if (action == "off") {
      parsed[name] = std::nullopt;
    } else if (action.rfind("stall:", 0) == 0 && action.size() > 6 && action.size() < 14) {
      const std::string ms(action.substr(6));
      if (ms.find_first_not_of("0123456789") != std::string::npos) {
        return MakeError(Errc::kInvalidArgument, "failpoint spec: stall:MS needs a number");
      }
      parsed[name] = Action{Action::Kind::kStall, std::chrono::milliseconds(std::stoll(ms))};
    } else {
      return MakeError(Errc::kInvalidArgument,
                       "failpoint spec: action must be crash, stall:MS, error or off");
    }
  }
  MutexLock lock(g_mu);
  for (auto& [name, action] : parsed) {
    if (action) {
      Points()[name] = *action;
    } else {
      Points().erase(name);
    }
  }
  g_any_armed = !Points().empty();
  return Ok();
}

void ClearFailpoints() {
  MutexLock lock(g_mu);
  Points().clear();
  g_any_armed = false;
}

bool FailpointsArmed() { return g_any_armed.load(std::memory_order_relaxed); }

Status RevertFixes(std::string_view names) {
#if defined(IDEM_NO_FAILPOINTS)
  if (!names.empty()) {
    return MakeError(Errc::kInvalidArgument,
                     "fixes cannot be taken back: built without failpoints");
  }
#endif
  uint32_t bits = 0;
  while (!names.empty()) {
    const std::size_t comma = names.find(',');
    const std::string_view name = names.substr(0, comma);
    names = comma == std::string_view::npos ? std::string_view() : names.substr(comma + 1);
    const std::optional<std::size_t> i = RevertibleIndex(name);
    if (!i) {
      std::string known;
      for (std::string_view k : kRevertibleFixes)
        known += (known.empty() ? "" : ", ") + std::string(k);
      return MakeError(Errc::kInvalidArgument,
                       "no revertible fix '" + std::string(name) + "' (known: " + known + ")");
    }
    bits |= uint32_t{1} << *i;
  }
  g_reverted = bits;
  return Ok();
}

namespace internal {

Status HitFailpoint(std::string_view name) {
  if (!g_any_armed.load(std::memory_order_relaxed)) return Ok();
  Action action;
  {
    MutexLock lock(g_mu);
    auto it = Points().find(name);
    if (it == Points().end()) return Ok();
    action = it->second;
  }
  switch (action.kind) {
    case Action::Kind::kCrash:
      _exit(86);
    case Action::Kind::kStall:
      std::this_thread::sleep_for(action.stall);
      return Ok();
    case Action::Kind::kError:
      return MakeError(Errc::kUnavailable, "failpoint " + std::string(name));
  }
  return Ok();
}

bool Reverted(std::string_view name) {
  const uint32_t bits = g_reverted.load(std::memory_order_relaxed);
  if (bits == 0) return false;
  const std::optional<std::size_t> i = RevertibleIndex(name);
  return i && (bits & (uint32_t{1} << *i)) != 0;
}

}  // namespace internal
}  // namespace idem
