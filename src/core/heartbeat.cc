// src/core/heartbeat.cc — a thread that renews one ticket's lease until it is stopped or fails.
#include "idem/heartbeat.h"

#include <algorithm>
#include <utility>

#include "idem/failpoint.h"

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
  if (options.own_thread) thread_ = std::thread([this] { Run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Heartbeat::Check() {
  RenewIfDue();
  std::lock_guard lock(mu_);
  return status_;
}

int64_t Heartbeat::Renewals() const {
  std::lock_guard lock(mu_);
  return renewals_;
}

void Heartbeat::RenewIfDue() {
  std::lock_guard renewing(renew_mu_);
  const SteadyTime started = clock_.Now();
  {
    std::lock_guard lock(mu_);
    if (stop_ || !status_.has_value() || started < due_) return;
  }
  Status renewed = IDEM_FAILPOINT("heartbeat");
  if (renewed) renewed = engine_.Renew(ticket_);
  std::lock_guard lock(mu_);
  if (!renewed) {
    status_ = std::move(renewed);  // for good: the lease may have run out unseen
    return;
  }
  ++renewals_;
  due_ = started + interval_;
}

void Heartbeat::Run() {
  std::unique_lock lock(mu_);
  while (!stop_ && status_.has_value()) {
    const SteadyTime now = clock_.Now();
    if (now < due_) {
      const Millis until_due = std::chrono::ceil<Millis>(due_ - now);
      wake_.wait_for(lock, std::min(until_due, poll_), [this] { return stop_; });
      continue;
    }
    lock.unlock();
    RenewIfDue();
    lock.lock();
  }
}

}  // namespace idem
