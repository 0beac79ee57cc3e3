# Writes build/generated/harness_build_info.h on every build, touching it only when the
# commit (or dirty state) changed, so receipts name the commit that produced them.
set(HARNESS_GENERATED_DIR ${CMAKE_BINARY_DIR}/generated)
file(MAKE_DIRECTORY ${HARNESS_GENERATED_DIR})
add_custom_target(harness_build_info ALL
  COMMAND ${CMAKE_COMMAND}
    -DSOURCE_DIR=${CMAKE_SOURCE_DIR}
    -DOUTPUT=${HARNESS_GENERATED_DIR}/harness_build_info.h
    -DCOMPILER_ID=${CMAKE_CXX_COMPILER_ID}
    -DCOMPILER_VERSION=${CMAKE_CXX_COMPILER_VERSION}
    -DBUILD_TYPE=${CMAKE_BUILD_TYPE}
    -DNATIVE_ISA=${HARNESS_NATIVE_ISA}
    -DSANITIZE=${HARNESS_SANITIZE}
    -P ${CMAKE_SOURCE_DIR}/cmake/WriteBuildInfo.cmake
  BYPRODUCTS ${HARNESS_GENERATED_DIR}/harness_build_info.h
  COMMENT "Recording git commit and toolchain for receipts")
