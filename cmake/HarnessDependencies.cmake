# Every dependency comes from a Debian 12 package (scripts/install-deps.sh installs them).
# Nothing is downloaded at build time.
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(TBB REQUIRED)
find_package(cereal REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(pugixml REQUIRED)
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
# Debian's libxxhash-dev ships a pkg-config file but no CMake package.
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
if(NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash ALIAS PkgConfig::XXHASH)
endif()
# Debian's x86-64 library also exports XXH3's run-time dispatch (AVX2 / AVX-512 loops);
# harness/receipt/xxh3_dispatch.h uses it where the library has it.
include(CheckSymbolExists)
include(CMakePushCheckState)
cmake_push_check_state(RESET)
set(CMAKE_REQUIRED_INCLUDES ${XXHASH_INCLUDE_DIRS})
set(CMAKE_REQUIRED_LIBRARIES PkgConfig::XXHASH)
check_symbol_exists(XXH3_64bits_dispatch "xxh_x86dispatch.h" HARNESS_HAVE_XXH3_DISPATCH)
cmake_pop_check_state()

# HDF5's FindHDF5 gives variables; wrap them in one imported target.
if(NOT TARGET harness_hdf5)
  add_library(harness_hdf5 INTERFACE)
  target_include_directories(harness_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
  target_link_libraries(harness_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
  target_compile_definitions(harness_hdf5 INTERFACE ${HDF5_C_DEFINITIONS} ${HDF5_DEFINITIONS})
  add_library(harness::hdf5 ALIAS harness_hdf5)
endif()
