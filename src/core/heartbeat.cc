// src/core/heartbeat.cc — a thread that renews one ticket's lease until it is stopped or fails.
#include "idem/heartbeat.h"

#include <algorithm>
#include <utility>

#include "idem/failpoint.h"
#include "idem/thread_name.h"

namespace idem {
namespace {

// A third of the lease unless asked for less, so a lease survives two lost beats.
Millis IntervalFor(Millis lease_ttl, Millis requested) {
  const Millis third = std::max(lease_ttl / 3, Millis(1));
  return requested > Millis(0) && requested < third ? requested : third;
}

}  // namespace

Heartbeat::Heartbeat(Engine& engine, const Ticket& ticket, MonotonicClock& clock,
                     HeartbeatOptions options)
    : engine_(engine),
      clock_(clock),
      interval_(IntervalFor(ticket.lease_ttl, options.interval)),
      poll_(std::max(options.poll, Millis(1))),
      ticket_(ticket),
      due_(clock.Now() + interval_) {
  if (options.own_thread) {
    thread_ = std::thread([this] {
      NameThisThread("idem-heartbeat");
      Run();
    });
  }
}

Heartbeat::~Heartbeat() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

Status Heartbeat::Check() {
  RenewIfDue();
  MutexLock lock(mu_);
  return status_;
}

std::optional<Status> Heartbeat::CheckIfNothingDue() const {
  const SteadyTime now = clock_.Now();
  MutexLock lock(mu_);
  // A failed renewal is never made again (RenewIfDue), so its error is Check's answer at once.
  if (status_.has_value() && !stop_ && now >= due_) return std::nullopt;
  return status_;
}

int64_t Heartbeat::Renewals() const {
  MutexLock lock(mu_);
  return renewals_;
}

void Heartbeat::RenewIfDue() {
  MutexLock renewing(renew_mu_);
  const SteadyTime started = clock_.Now();
  {
    MutexLock lock(mu_);
    if (stop_ || !status_.has_value() || started < due_) return;
  }
  Status renewed = IDEM_FAILPOINT("heartbeat");
  if (renewed) renewed = engine_.Renew(ticket_);
  MutexLock lock(mu_);
  if (!renewed) {
    status_ = std::move(renewed);  // for good: the lease may have run out unseen
    return;
  }
  ++renewals_;
  due_ = started + interval_;
}

void Heartbeat::Run() {
  MutexLock lock(mu_);
  while (!stop_ && status_.has_value()) {
    const SteadyTime now = clock_.Now();
    if (now < due_) {
      const Millis until_due = std::chrono::ceil<Millis>(due_ - now);
      wake_.WaitFor(mu_, std::min(until_due, poll_), [this]() IDEM_REQUIRES(mu_) { return stop_; });
      continue;
    }
    lock.Unlock();
    RenewIfDue();
    lock.Lock();
  }
}

}  // namespace idem
