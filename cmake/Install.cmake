# install(): the library, its public headers, the CLI, and an exported CMake package so
# downstream C++ projects (and the Python package) use
#   find_package(mlakv CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE mlakv::mlakv)          # CPU
#   target_link_libraries(app PRIVATE mlakv::mlakv_cuda)     # + CUDA backend, when built
# The static libraries carry their private dependencies as link-only entries, so the
# package config finds them again (fmt, nlohmann_json, Highway, Threads; CUDAToolkit).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MLAKV_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/mlakv")

target_include_directories(mlakv PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set(_mlakv_export_targets mlakv mlakv_warnings)
if(MLAKV_CUDA_ENABLED)
  list(APPEND _mlakv_export_targets mlakv_cuda)
endif()
foreach(_extra IN ITEMS ${MLAKV_EXTRA_EXPORT_TARGETS})
  list(APPEND _mlakv_export_targets ${_extra})
endforeach()

install(TARGETS ${_mlakv_export_targets} EXPORT mlakvTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS mlakv_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mlakv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT mlakvTargets NAMESPACE mlakv:: DESTINATION ${MLAKV_INSTALL_CMAKEDIR})

set(MLAKV_PACKAGE_CUDA ${MLAKV_CUDA_ENABLED})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mlakvConfig.cmake.in
  ${PROJECT_BINARY_DIR}/mlakvConfig.cmake INSTALL_DESTINATION ${MLAKV_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mlakvConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mlakvConfig.cmake ${PROJECT_BINARY_DIR}/mlakvConfigVersion.cmake
  DESTINATION ${MLAKV_INSTALL_CMAKEDIR})
