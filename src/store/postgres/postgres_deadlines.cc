// src/store/postgres/postgres_deadlines.cc — the PostgreSQL store's deadlines: every wait on a
// socket is a poll() bounded by one.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <string>

#include "src/store/postgres/postgres_internal.h"

namespace idem::postgres_internal {

SteadyTime Now() { return SystemMonotonicClock().Now(); }

// Waits until `fd` is ready for `events`, or has an error for libpq to report; false once
// `deadline` has passed.
bool WaitFor(int fd, short events, SteadyTime deadline) {
  if (fd < 0) return true;  // no socket: libpq reports why
  for (;;) {
    int timeout_ms = -1;
    if (deadline != kNoDeadline) {
      const Millis left = std::chrono::ceil<Millis>(deadline - Now());
      if (left.count() <= 0) return false;
      timeout_ms = static_cast<int>(std::min<int64_t>(left.count(), INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n > 0 || (n < 0 && errno != EINTR)) return true;
  }
}

std::string MillisText(Millis ms) { return std::to_string(ms.count()) + " ms"; }

// The pool's connections and the listener's.
Bounds Bounded(const PostgresTimeouts& t) {
  return Bounds{t.statement, t.lock, t.idle_in_transaction, t.statement + kAnswerGrace};
}

}  // namespace idem::postgres_internal
