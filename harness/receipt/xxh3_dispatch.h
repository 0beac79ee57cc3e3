// XXH3 through Debian's libxxhash, at the widest vector loop this CPU has.
#pragma once

#if defined(HARNESS_HAVE_XXH3_DISPATCH)  // CMake found the symbols (cmake/HarnessDependencies.cmake)
// The library's *_dispatch entry points pick the SSE2, AVX2 or AVX-512 loop at run time;
// this header maps XXH3_64bits, XXH3_128bits_update, ... to them (2.5x the baseline
// SSE2 loop on a tensor in cache). Every loop computes the same XXH3 value.
#include <xxh_x86dispatch.h>
#else
#include <xxhash.h>
#endif
