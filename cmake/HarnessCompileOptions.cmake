# Compile options shared by every target of the project, as an INTERFACE target.
#
# Numerics discipline (docs/determinism.md explains each):
#  - -ffp-contract=off: GCC contracts a*b+c into an FMA by default in C++; whether it
#    does depends on -march, so contraction would make bits depend on the ISA.
#    Fused multiply-adds are written explicitly (std::fma / _mm256_fmadd_ps) where wanted.
#  - none of the value-unsafe optimisation flags, nor any of their parts: they reorder sums
#    and set FTZ/DAZ process-wide. (errno-free math was one such part; sqrt is exactly
#    rounded with or without it, so leaving it out changes no bit.)
#
# harness::unsanitized_options holds those flags (numerics, warnings, ISA);
# harness::compile_options adds the sanitizers a build asks for. Only a library loaded into
# processes that carry no sanitizer runtime (the digest library python3 loads) links the
# first alone.
add_library(harness_unsanitized_options INTERFACE)
add_library(harness::unsanitized_options ALIAS harness_unsanitized_options)
add_library(harness_compile_options INTERFACE)
add_library(harness::compile_options ALIAS harness_compile_options)
target_link_libraries(harness_compile_options INTERFACE harness_unsanitized_options)

target_compile_options(harness_unsanitized_options INTERFACE
  -ffp-contract=off
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
  -Wno-psabi)  # internal helpers pass GCC vectors by value; no ABI crosses a library boundary
if(HARNESS_WERROR)
  target_compile_options(harness_unsanitized_options INTERFACE -Werror)
endif()
if(HARNESS_NATIVE_ISA)
  target_compile_options(harness_unsanitized_options INTERFACE -march=native)
else()
  target_compile_options(harness_unsanitized_options INTERFACE -march=x86-64)
endif()
if(HARNESS_SANITIZE)
  target_compile_options(harness_compile_options INTERFACE
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(harness_compile_options INTERFACE -fsanitize=address,undefined)
endif()
if(HARNESS_TSAN)
  # ThreadSanitizer (scripts/tsan.sh, docs/testing.md): it cannot share a process with ASan.
  if(HARNESS_SANITIZE)
    message(FATAL_ERROR "HARNESS_TSAN and HARNESS_SANITIZE cannot be combined: ThreadSanitizer and "
                        "AddressSanitizer exclude each other; use separate build directories")
  endif()
  target_compile_options(harness_compile_options INTERFACE -fsanitize=thread -fno-omit-frame-pointer -g)
  target_link_options(harness_compile_options INTERFACE -fsanitize=thread)
endif()
