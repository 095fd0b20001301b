# What `cmake --install` puts under the prefix for C++ users: the public headers, the static
# library and the CMake package, so an engine's CMakeLists can say
#   find_package(latentkv 0.1 REQUIRED)
#   target_link_libraries(engine PRIVATE latentkv::latentkv)
# Everything here is install component "devel": the Python wheel installs only component "python"
# (pyproject.toml install.components), so none of this ends up in it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LATENTKV_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/latentkv")

# The library keeps its link interface (CUDA::cudart, CUDA::cublas, CUDA::cublasLt,
# Threads::Threads); latentkvConfig.cmake finds those packages again on the consumer's side.
install(TARGETS latentkv EXPORT latentkvTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT devel
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT devel
  INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/latentkv"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
  FILES_MATCHING PATTERN "*.h")
install(EXPORT latentkvTargets
  NAMESPACE latentkv::
  FILE latentkvTargets.cmake
  DESTINATION "${LATENTKV_INSTALL_CMAKEDIR}" COMPONENT devel)

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/latentkvConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/latentkvConfig.cmake"
  INSTALL_DESTINATION "${LATENTKV_INSTALL_CMAKEDIR}")
# 0.x: a minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/latentkvConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/latentkvConfig.cmake"
  "${PROJECT_BINARY_DIR}/latentkvConfigVersion.cmake"
  DESTINATION "${LATENTKV_INSTALL_CMAKEDIR}" COMPONENT devel)
