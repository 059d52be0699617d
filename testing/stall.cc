// testing/stall.cc — see stall.h.
#include "testing/stall.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

namespace idem::testing {
namespace {

// The state letter of /proc/<pid>/stat ('T': stopped), or 0.
char ProcessState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t close = stat.rfind(')');  // the command name may hold spaces
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : 0;
}

}  // namespace

StoppedProcesses::StoppedProcesses(std::vector<pid_t> pids) : pids_(std::move(pids)) {
  int fds[2];
  // Close-on-exec: a process the test spawns later must not keep the watchdog waiting.
  if (pipe2(fds, O_CLOEXEC) != 0) return;
  const pid_t pid = fork();
  if (pid == 0) {
    // The watchdog: async-signal-safe calls only (the parent has threads). A session of its own
    // survives signals sent to the test's process group; every other inherited descriptor is
    // closed, so that only the parent's end keeps the pipe open.
    setsid();
    for (int fd = 3; fd < 4096; ++fd) {
      if (fd != fds[0]) close(fd);
    }
    char c;
    ssize_t n;
    do {
      n = read(fds[0], &c, 1);
    } while (n > 0 || (n < 0 && errno == EINTR));
    for (pid_t p : pids_) kill(p, SIGCONT);
    _exit(0);
  }
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    return;  // no watchdog, so nothing is stopped
  }
  watchdog_ = pid;
  pipe_ = fds[1];
  for (pid_t p : pids_) kill(p, SIGSTOP);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (pid_t p : pids_) {
    while (ProcessState(p) != 'T' && ProcessState(p) != 't' &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

StoppedProcesses::~StoppedProcesses() { Continue(); }

void StoppedProcesses::Continue() {
  if (watchdog_ < 0) return;
  for (pid_t p : pids_) kill(p, SIGCONT);
  close(pipe_);
  waitpid(watchdog_, nullptr, 0);
  watchdog_ = -1;
  pipe_ = -1;
}

bool IsLocalProcess(pid_t pid, std::string_view name) {
  if (pid <= 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return cmdline.rfind(name, 0) == 0;
}

}  // namespace idem::testing
