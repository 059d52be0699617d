// testing/round_trips.cc — see round_trips.h.
#include "testing/round_trips.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

namespace idem::testing {
namespace {

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// Writes all of `data`; false once the peer is gone.
bool SendAll(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

struct Relayed {
  int client;
  int server;
  bool answered = true;  // the server spoke since the client last did
};

}  // namespace

RoundTripCounter::RoundTripCounter(uint16_t target_port) : target_port_(target_port) {
  listener_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof addr;
  if (listener_ >= 0 && bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      listen(listener_, 16) == 0 &&
      getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port_ = ntohs(addr.sin_port);
  }
  thread_ = std::thread([this] { Run(); });
}

RoundTripCounter::~RoundTripCounter() {
  stop_ = true;
  thread_.join();
  if (listener_ >= 0) close(listener_);
}

void RoundTripCounter::Run() {
  std::vector<Relayed> relayed;
  char buf[65536];
  while (!stop_) {
    std::vector<pollfd> fds{{listener_, POLLIN, 0}};
    for (const Relayed& r : relayed) {
      fds.push_back({r.client, POLLIN, 0});
      fds.push_back({r.server, POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), 20) <= 0) continue;
    std::vector<Relayed> kept;
    for (std::size_t i = 0; i < relayed.size(); ++i) {
      Relayed& r = relayed[i];
      bool open = true;
      for (const bool from_client : {true, false}) {
        if (!open || (fds[1 + 2 * i + (from_client ? 0 : 1)].revents & (POLLIN | POLLHUP)) == 0) {
          continue;
        }
        const int from = from_client ? r.client : r.server;
        const ssize_t n = ::recv(from, buf, sizeof buf, 0);
        if (n <= 0) {
          open = false;
          continue;
        }
        if (from_client && r.answered) ++round_trips_;
        r.answered = !from_client;
        open = SendAll(from_client ? r.server : r.client, buf, static_cast<std::size_t>(n));
      }
      if (open) {
        kept.push_back(r);
      } else {
        close(r.client);
        close(r.server);
      }
    }
    relayed = std::move(kept);
    if ((fds[0].revents & POLLIN) != 0) {
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      const sockaddr_in target = Loopback(target_port_);
      if (server < 0 ||
          connect(server, reinterpret_cast<const sockaddr*>(&target), sizeof target) != 0) {
        close(client);
        if (server >= 0) close(server);
        continue;
      }
      relayed.push_back({client, server});
    }
  }
  for (const Relayed& r : relayed) {
    close(r.client);
    close(r.server);
  }
}

}  // namespace idem::testing
