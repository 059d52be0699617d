# cmake -DDOC=docs/inbox.md -DEXAMPLE=examples/inbox/main.cc -P doc_shows_example.cmake
# Fails unless the C++ block that follows "<!-- example: examples/inbox/main.cc -->" in DOC is
# EXAMPLE byte for byte, so the program the documentation shows is the one that is built and run.
file(READ "${DOC}" doc)
file(READ "${EXAMPLE}" example)
set(marker "<!-- example: examples/inbox/main.cc -->\n```cpp\n")
string(FIND "${doc}" "${marker}" start)
if(start EQUAL -1)
  message(FATAL_ERROR "${DOC} has no block marked as ${EXAMPLE}")
endif()
string(LENGTH "${marker}" marker_length)
math(EXPR start "${start} + ${marker_length}")
string(SUBSTRING "${doc}" ${start} -1 rest)
string(FIND "${rest}" "```\n" end)
string(SUBSTRING "${rest}" 0 ${end} shown)
if(NOT shown STREQUAL example)
  message(FATAL_ERROR "the example in ${DOC} differs from ${EXAMPLE}: copy the file into the doc")
endif()
