// include/idem/heartbeat.h — keeps an executing ticket's lease alive while its executor works.
#pragma once

#include <cstdint>
#include <optional>
#include <thread>

#include "idem/clock.h"
#include "idem/engine.h"
#include "idem/mutex.h"
#include "idem/result.h"

namespace idem {

struct HeartbeatOptions {
  // Time between renewals by the heartbeat's clock. Zero, or anything longer, means
  // ticket.lease_ttl / 3, so a lease survives two lost beats.
  Millis interval{0};
  // The longest the heartbeat's thread sleeps (in real time) before it looks at its clock
  // again. With the real monotonic clock the thread wakes when a renewal is due anyway; this
  // bounds how late it notices a test's fake clock moving.
  Millis poll{1000};
  // Whether the heartbeat renews on a thread of its own. Without one, renewals are made only by
  // Check and Beat, on their callers' threads: for callers that schedule Beat themselves (idemd's
  // coroutines, on a timer), so that a waiting execution holds no thread.
  bool own_thread = true;
};

// Renews one ticket's lease every interval, on a thread of its own, from construction until
// destruction, so an execution whose external calls take long keeps its lease and no other
// executor takes it over. The first failed renewal — kFenced (another executor took over) or any
// store error (the lease may run out unseen) — stops it for good: Check() reports that error from
// then on, and the executor must stop before its next external step.
//
// It renews its own copy of the ticket, so the executor keeps using its ticket meanwhile (the
// store fences on owner token and fence, which a renewal does not change). Destroy it before
// Engine::Finish or Engine::Release: a renewal after a Release would extend a lease given up.
//
// Thread-safe. Borrows `engine` and `clock`, which must outlive it.
class Heartbeat {
 public:
  Heartbeat(Engine& engine, const Ticket& ticket, MonotonicClock& clock,
            HeartbeatOptions options = {});
  // Stops the thread; returns after a renewal in progress has ended.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Call before each external step. Makes a renewal that is due by the clock but not yet made
  // (on the caller's thread), then returns Ok while every renewal has succeeded, or the error of
  // the first that failed: kFenced (the lease belongs to another executor), kUnavailable or
  // another store error (the lease may have run out), or a failpoint's error ("heartbeat").
  Status Check();

  // Check for a caller that must not block (a coroutine on an I/O thread): what Check would
  // return when no renewal is due, or nothing when one is, which only Check or Beat makes.
  std::optional<Status> CheckIfNothingDue() const IDEM_EXCLUDES(mu_);

  // Makes a renewal that is due, as Check does, on the caller's thread (it blocks on the store).
  void Beat() { RenewIfDue(); }

  // The time between renewals.
  Millis Interval() const { return interval_; }

  // Renewals that succeeded so far.
  int64_t Renewals() const;

 private:
  // Renews if a renewal is due and none has failed; serialised between the thread and Check.
  void RenewIfDue() IDEM_EXCLUDES(renew_mu_, mu_);
  void Run() IDEM_EXCLUDES(mu_);

  Engine& engine_;
  MonotonicClock& clock_;
  const Millis interval_;
  const Millis poll_;

  Mutex renew_mu_;                            // held across one renewal; taken before mu_
  Ticket ticket_ IDEM_GUARDED_BY(renew_mu_);  // the heartbeat's copy

  mutable Mutex mu_;
  CondVar wake_;
  SteadyTime due_ IDEM_GUARDED_BY(mu_);
  Status status_ IDEM_GUARDED_BY(mu_);
  int64_t renewals_ IDEM_GUARDED_BY(mu_) = 0;
  bool stop_ IDEM_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once everything above is set; none without own_thread
};

}  // namespace idem
