# cmake/IdemInstall.cmake — libidem as an installed package: the static libraries, the public
# headers as <idem/...>, the CMake package (find_package(idem CONFIG), targets idem::<name>) and
# pkg-config modules (idem, idem-postgres, idem-redis). Everything here is the `dev` component,
# which is what the libidem-dev Debian package holds (packaging/).

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(IDEM_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/idem)

# The libraries, exported as idem::core, idem::store_sqlite, ... idem_store_sql (the SQL the two
# SQL stores share) is exported too: a static library's private dependencies are still needed at
# the final link.
set(idem_libraries idem_core idem_store_sql idem_store_sqlite idem_store_cache)
if(IDEM_WITH_POSTGRES)
  list(APPEND idem_libraries idem_store_postgres)
endif()
if(IDEM_WITH_REDIS)
  list(APPEND idem_libraries idem_store_redis)
endif()
set(idem_components "")
foreach(library IN LISTS idem_libraries)
  string(REGEX REPLACE "^idem_" "" export_name ${library})
  set_target_properties(${library} PROPERTIES EXPORT_NAME ${export_name})
  list(APPEND idem_components ${export_name})
endforeach()
install(TARGETS ${idem_libraries} EXPORT idemTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# Public headers; a backend's header only with its library.
set(idem_header_excludes "")
if(NOT IDEM_WITH_POSTGRES)
  list(APPEND idem_header_excludes PATTERN postgres.h EXCLUDE)
endif()
if(NOT IDEM_WITH_REDIS)
  list(APPEND idem_header_excludes PATTERN redis.h EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/idem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev FILES_MATCHING PATTERN "*.h" ${idem_header_excludes})
install(FILES ${PROJECT_BINARY_DIR}/include/idem/build_config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/idem COMPONENT dev)

# The CMake package.
install(EXPORT idemTargets NAMESPACE idem:: DESTINATION ${IDEM_CMAKE_INSTALL_DIR} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/idemConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/idemConfig.cmake
                              INSTALL_DESTINATION ${IDEM_CMAKE_INSTALL_DIR})
# 0.x: every 0.y promises the API of the 0.y it was built against at least.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/idemConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/idemConfig.cmake ${PROJECT_BINARY_DIR}/idemConfigVersion.cmake
        DESTINATION ${IDEM_CMAKE_INSTALL_DIR} COMPONENT dev)

# pkg-config: relocatable (the prefix is found from the .pc file's own place), so a staging
# install works as well as /usr. The libraries are static: link with `pkg-config --static`.
file(RELATIVE_PATH IDEM_PC_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" IDEM_PC_PREFIX "${IDEM_PC_PREFIX}")
set(idem_pc_modules idem)
if(IDEM_WITH_POSTGRES)
  list(APPEND idem_pc_modules idem-postgres)
endif()
if(IDEM_WITH_REDIS)
  list(APPEND idem_pc_modules idem-redis)
endif()
foreach(module IN LISTS idem_pc_modules)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${module}.pc.in ${PROJECT_BINARY_DIR}/${module}.pc
                 @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${module}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endforeach()

# The licence, for a plain install (share/doc/idem/LICENSE). The Debian packages carry it in
# their copyright files instead, so it is a component of its own that they leave out.
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT license)
