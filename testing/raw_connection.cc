// testing/raw_connection.cc — see raw_connection.h.
#include "testing/raw_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

namespace idem::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string Lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

}  // namespace

RawConnection::RawConnection(uint16_t port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

RawConnection::~RawConnection() { close(fd_); }

bool RawConnection::Send(std::string_view data) {
  return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
}

std::string RawConnection::ReadAll(milliseconds timeout) {
  std::string out;
  const auto deadline = Clock::now() + timeout;
  while (ReadSome(out, deadline)) {
  }
  return out;
}

std::string RawConnection::ReadResponse(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const std::size_t end = pending_.find("\r\n\r\n");
    if (end != std::string::npos) {
      const std::size_t at = Lower(pending_.substr(0, end)).find("content-length: ");
      const std::size_t length = at == std::string::npos ? 0 : std::stoul(pending_.substr(at + 16));
      if (pending_.size() >= end + 4 + length) {
        std::string response = pending_.substr(0, end + 4 + length);
        pending_.erase(0, end + 4 + length);
        return response;
      }
    }
    if (!ReadSome(pending_, deadline)) return std::exchange(pending_, {});
  }
}

bool RawConnection::ReadSome(std::string& out, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return true;  // the loop re-checks
  char buf[4096];
  const ssize_t n = recv(fd_, buf, sizeof buf, 0);
  if (n <= 0) {
    closed_ = true;
    return false;
  }
  out.append(buf, static_cast<std::size_t>(n));
  return true;
}

}  // namespace idem::testing
