# Small helpers shared by every directory's CMakeLists.txt.

# Warnings for a target of ours; -Werror when IDEM_WERROR is on (CI turns it on).
function(idem_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                           -Wold-style-cast -Wimplicit-fallthrough)
  # GCC 12 at -O2 takes the frame of an Asio coroutine (awaitable_frame_base's own operator new and
  # delete) for a mismatched allocation (GCC PR 109224, a false positive); nothing else is lost.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-mismatched-new-delete)
  endif()
  if(IDEM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# idem_test(NAME SOURCES... [LIBS libs...] [LABELS labels...])
# A GoogleTest executable registered with CTest, one CTest entry per test case.
function(idem_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  idem_warnings(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}")
endfunction()
