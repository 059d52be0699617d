// http/asio_impl.cc — the one translation unit that compiles Boost.Asio (with its SSL
// support, for the client's https) and Boost.Beast (separate compilation keeps every other file
// free of their implementation).
//
// Boost's sources are compiled without their assertions in every build type, as in release builds:
// Beast 1.81 asserts wrongly when a valid chunked body's last chunk ("0\r\n", then the final CRLF)
// arrives in pieces (boostorg/beast#2861, found by fuzz/http_fuzz.cc), which aborted debug and
// sanitizer builds of the server. Beast's parser is instantiated here and nowhere else.
#define BOOST_DISABLE_ASSERTS
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
