// testing/round_trips.h — a loopback TCP relay that counts a client's round trips to a server,
// so a test can hold a protocol to how many times it waits for the network (PostgreSQL's
// pipelines), which no timing could show reliably.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace idem::testing {

// Listens on a free loopback port and relays each connection made to it to `target_port` on
// loopback. A round trip is counted each time a client sends after its server has answered
// (and for a connection's first send): a client that waits for each answer before it sends
// again pays one per call, one that sends several calls before it waits pays one for them all.
// Stopped, and every socket closed, on destruction.
class RoundTripCounter {
 public:
  explicit RoundTripCounter(uint16_t target_port);
  ~RoundTripCounter();
  RoundTripCounter(const RoundTripCounter&) = delete;
  RoundTripCounter& operator=(const RoundTripCounter&) = delete;

  uint16_t port() const { return port_; }
  // Over every connection since construction. A client's call has been counted by the time its
  // answer reaches it.
  int64_t RoundTrips() const { return round_trips_.load(); }

 private:
  void Run();

  uint16_t target_port_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<int64_t> round_trips_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace idem::testing
