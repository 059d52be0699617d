// server/http/asio_impl.cc — the one translation unit that compiles Boost.Asio and Boost.Beast
// (separate compilation keeps every other file free of their implementation).
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
