# Project-wide compile flags: warnings (errors in CI), sanitizers. Applied through an interface
# target so that third-party and generated code keep their own flags.
add_library(colony_flags INTERFACE)
target_compile_options(colony_flags INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wcast-align -Wunused -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # g++ 12 reports false positives inside asio/libstdc++ coroutine frames at -O2.
  target_compile_options(colony_flags INTERFACE -Wno-maybe-uninitialized -Wno-dangling-pointer
    -Wno-array-bounds -Wno-stringop-overflow -Wno-null-dereference -Wno-mismatched-new-delete)
endif()
if(COLONY_WERROR)
  target_compile_options(colony_flags INTERFACE -Werror)
endif()
if(COLONY_SANITIZE)
  target_compile_options(colony_flags INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer
    -fno-sanitize-recover=undefined)
  target_link_options(colony_flags INTERFACE -fsanitize=address,undefined)
endif()
