// testing/stall.h — tests of what happens when something stops answering: processes stopped with
// SIGSTOP (a stalled database server) that are always resumed, and calls timed against a bound
// that are unblocked when they overrun it, so a failing test reports how long it blocked instead
// of hanging.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace idem::testing {

// SIGSTOPs `pids` on construction and SIGCONTs them on destruction or Continue(). Should this
// test process die first (a crash, a kill by the test runner), a watchdog child resumes them: it
// waits for the end of a pipe that only this object writes to, so no test leaves a process
// stopped. Not thread-safe.
class StoppedProcesses {
 public:
  // Returns once every process is seen stopped (or after a second).
  explicit StoppedProcesses(std::vector<pid_t> pids);
  ~StoppedProcesses();
  StoppedProcesses(const StoppedProcesses&) = delete;
  StoppedProcesses& operator=(const StoppedProcesses&) = delete;

  // Resumes the processes; idempotent.
  void Continue();

 private:
  std::vector<pid_t> pids_;
  pid_t watchdog_ = -1;
  int pipe_ = -1;  // the write end; closing it wakes the watchdog
};

// Whether `pid` is a process of this machine whose command line starts with `name` (a
// PostgreSQL backend's reads "postgres: user db host(port) idle"). A remote server's PIDs are
// not ours to stop.
bool IsLocalProcess(pid_t pid, std::string_view name);

// What CallWithin saw.
template <typename T>
struct TimedCall {
  T value;
  std::chrono::milliseconds elapsed;  // from the call until it returned
  bool overran = false;               // still blocked at the bound: `unblock` ran
};

// Runs `call` on a thread of its own. If it has not returned after `give_up_after`, runs
// `unblock` (release the lock, resume the process) so that it can, and waits for it.
template <typename F>
auto CallWithin(std::chrono::milliseconds give_up_after, F call,
                const std::function<void()>& unblock) -> TimedCall<std::invoke_result_t<F&>> {
  using T = std::invoke_result_t<F&>;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  auto done = std::async(std::launch::async, [&call] {
    T value = call();
    return std::make_pair(std::move(value), Clock::now());
  });
  bool overran = false;
  if (done.wait_for(give_up_after) != std::future_status::ready) {
    overran = true;
    unblock();
  }
  auto [value, end] = done.get();
  return TimedCall<T>{std::move(value),
                      std::chrono::duration_cast<std::chrono::milliseconds>(end - start), overran};
}

}  // namespace idem::testing
