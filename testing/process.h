// testing/process.h — real binaries in tests: spawn, read the "listening on" line, signal, reap.
// A ChildProcess that goes out of scope is killed (SIGKILL) and reaped, also when a test fails.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "idem/result.h"

namespace idem::testing {

class ChildProcess {
 public:
  // Starts `argv[0]` with `argv`, extra environment variables and working directory `cwd`; its
  // stdout is captured, its stderr goes to `stderr_file` (appended).
  static Result<ChildProcess> Spawn(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& env,
                                    const std::string& cwd, const std::string& stderr_file);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  // Reads stdout until a line starting with `prefix` arrives; returns the rest of that line.
  // Errors: kDeadlineExceeded on timeout, kUnavailable if the process closed stdout first.
  Result<std::string> WaitForLine(const std::string& prefix, std::chrono::milliseconds timeout);
  void Signal(int sig);
  // Waits for exit; returns the exit status (as waitpid), or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);

 private:
  ChildProcess(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
};

// "http://127.0.0.1:PORT" from "... listening on http://127.0.0.1:PORT".
uint16_t PortOf(const std::string& url);

// A loopback port that was free a moment ago (for servers that cannot bind port 0 themselves).
uint16_t FreeLoopbackPort();

// Waits until something accepts TCP connections on 127.0.0.1:port; false on timeout.
bool WaitForPort(uint16_t port, std::chrono::milliseconds timeout);

}  // namespace idem::testing
