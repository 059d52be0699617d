// testing/raw_connection.h — a raw TCP connection to a loopback port, for HTTP input a client
// library cannot produce (malformed requests, slow senders, oversized headers).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace idem::testing {

// Closed on destruction. One thread sends while another may read; Closed() is safe from both.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool Connected() const { return connected_; }
  // Whether the server closed the connection (seen by a read).
  bool Closed() const { return closed_; }

  // Sends all of `data`; false if the connection failed.
  bool Send(std::string_view data);
  // Everything the server sends until it closes the connection or `timeout` passes.
  std::string ReadAll(std::chrono::milliseconds timeout);
  // One response with a Content-Length (a keep-alive answer), or what arrived before the server
  // closed or `timeout` passed.
  std::string ReadResponse(std::chrono::milliseconds timeout);

 private:
  // Appends what arrives before `deadline`; false once the connection closed or time is up.
  bool ReadSome(std::string& out, std::chrono::steady_clock::time_point deadline);

  int fd_;
  bool connected_ = false;
  std::atomic<bool> closed_{false};
  std::string pending_;
};

}  // namespace idem::testing
