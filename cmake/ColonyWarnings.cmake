# Project-wide compile flags: warnings (errors in CI), sanitizers. Applied through an interface
# target so that third-party and generated code keep their own flags.
add_library(colony_flags INTERFACE)
target_compile_options(colony_flags INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wcast-align -Wunused -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough)

# GCC 12's middle-end warnings report false positives in code it inlines from asio, libstdc++
# and c10 (coroutine frames, streambuf, intrusive_ptr) — not in Colony's own code. They are
# switched off only for the targets where a full build showed them, named by warning:
#   colony_gcc_false_positives(TARGET WARNING...)
# e.g. colony_gcc_false_positives(colony_averaging mismatched-new-delete). The -Wno- flags
# come from colony_flags itself, after its own -W list, so the order of a target's link
# libraries does not matter. Clang and the other warnings keep their full strength.
set(COLONY_GCC_FALSE_POSITIVE_WARNINGS maybe-uninitialized dangling-pointer array-bounds
  stringop-overflow null-dereference mismatched-new-delete)
# Under the sanitizers' instrumentation GCC reports these everywhere (and they find nothing the
# sanitizers themselves would not), so sanitizer builds switch them off for every target.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  foreach(warning IN LISTS COLONY_GCC_FALSE_POSITIVE_WARNINGS)
    if(COLONY_SANITIZE OR COLONY_TSAN)
      target_compile_options(colony_flags INTERFACE -Wno-${warning})
    else()
      target_compile_options(colony_flags INTERFACE
        "$<$<IN_LIST:${warning},$<TARGET_PROPERTY:COLONY_GCC_FALSE_POSITIVES>>:-Wno-${warning}>")
    endif()
  endforeach()
endif()
function(colony_gcc_false_positives target)
  foreach(warning IN LISTS ARGN)
    if(NOT warning IN_LIST COLONY_GCC_FALSE_POSITIVE_WARNINGS)
      message(FATAL_ERROR "colony_gcc_false_positives(${target}): '${warning}' is not one of "
        "${COLONY_GCC_FALSE_POSITIVE_WARNINGS}")
    endif()
  endforeach()
  set_property(TARGET ${target} APPEND PROPERTY COLONY_GCC_FALSE_POSITIVES ${ARGN})
endfunction()

if(COLONY_WERROR)
  target_compile_options(colony_flags INTERFACE -Werror)
endif()
# The fuzz build instruments every library a fuzzer links for coverage (and ASan/UBSan), so that
# libFuzzer is guided by the branches an input reaches in the decoders, not only in the harness.
# The instrumentation keeps `#pragma omp simd` loops from vectorizing, which clang reports.
if(COLONY_FUZZ)
  target_compile_options(colony_flags INTERFACE -fsanitize=fuzzer-no-link,address,undefined
    -fno-omit-frame-pointer -Wno-pass-failed)
endif()
if(COLONY_SANITIZE)
  target_compile_options(colony_flags INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer
    -fno-sanitize-recover=undefined)
  target_link_options(colony_flags INTERFACE -fsanitize=address,undefined)
endif()
# ThreadSanitizer (scripts/tsan). GCC says at every asio fence that TSan does not model
# atomic_thread_fence (-Wtsan); asio's fences pair with atomics TSan does see.
if(COLONY_TSAN)
  if(COLONY_SANITIZE OR COLONY_FUZZ)
    message(FATAL_ERROR "COLONY_TSAN cannot be combined with COLONY_SANITIZE or COLONY_FUZZ "
      "(ThreadSanitizer and AddressSanitizer exclude each other)")
  endif()
  target_compile_options(colony_flags INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(colony_flags INTERFACE -Wno-tsan)
  endif()
  target_link_options(colony_flags INTERFACE -fsanitize=thread)
endif()
