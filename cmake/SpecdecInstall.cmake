# Installs the headers and exports specdec::specdec for find_package(specdec).
include(CMakePackageConfigHelpers)
install(TARGETS specdec EXPORT specdecTargets)
install(DIRECTORY include/specdec DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT specdecTargets NAMESPACE specdec:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/specdec)
configure_package_config_file(cmake/specdecConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/specdecConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/specdec)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/specdecConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/specdecConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/specdecConfigVersion.cmake
              cmake/FindNCCL.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/specdec)
