# Run by CPack (CPACK_PRE_BUILD_SCRIPTS) on the staged files, as dh_strip would: programs lose
# their symbols and the .comment and .note sections, static libraries their debug information
# (the build is RelWithDebInfo, so that the same objects serve CI's build through the compiler
# cache).
file(GLOB_RECURSE programs LIST_DIRECTORIES false "${CPACK_TEMPORARY_DIRECTORY}/*/usr/bin/*")
file(GLOB_RECURSE archives LIST_DIRECTORIES false "${CPACK_TEMPORARY_DIRECTORY}/*.a")
foreach(program IN LISTS programs)
  execute_process(COMMAND strip --remove-section=.comment --remove-section=.note ${program}
                  COMMAND_ERROR_IS_FATAL ANY)
endforeach()
foreach(archive IN LISTS archives)
  execute_process(COMMAND strip --strip-debug --remove-section=.comment --remove-section=.note
                          --enable-deterministic-archives ${archive}
                  COMMAND_ERROR_IS_FATAL ANY)
endforeach()
