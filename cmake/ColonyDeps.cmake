# Third-party dependencies, all from Debian's archive (scripts/setup installs them).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(OpenSSL 3 REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Protobuf REQUIRED)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
# OpenMP for the compression kernels (optional: the loops are correct without it).
find_package(OpenMP)

# asio (standalone, header-only) with C++20 coroutines.
find_path(ASIO_INCLUDE_DIR asio.hpp REQUIRED)
add_library(colony_asio INTERFACE)
target_include_directories(colony_asio SYSTEM INTERFACE ${ASIO_INCLUDE_DIR})
# ASIO_DISABLE_STD_ALIGNED_ALLOC: asio 1.22 picks aligned_alloc()/free() or operator new/delete
# depending on whether a libstdc++ header was included before its config, so translation units
# disagreed on how recycled memory is freed (an ODR violation; ASan: alloc-dealloc-mismatch).
target_compile_definitions(colony_asio INTERFACE ASIO_STANDALONE ASIO_NO_DEPRECATED
  ASIO_DISABLE_STD_ALIGNED_ALLOC)
target_link_libraries(colony_asio INTERFACE Threads::Threads)

# Boost.Beast (header-only, with Boost.Asio) for the HTTP server of colony api and colony monitor.
find_package(Boost 1.74 REQUIRED)
add_library(colony_boost INTERFACE)
target_link_libraries(colony_boost INTERFACE Boost::headers Threads::Threads)
target_compile_definitions(colony_boost INTERFACE BOOST_ASIO_NO_DEPRECATED BOOST_BEAST_USE_STD_STRING_VIEW)

find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)

if(COLONY_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# LibTorch for the model, train and serve layers: Debian's libtorch-dev 1.13 (CPU) by default, or
# LibTorch 2.x with CUDA found through Torch_DIR or CMAKE_PREFIX_PATH (e.g. a PyTorch wheel's
# `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'`). An interface target with
# SYSTEM includes so that our warning flags do not apply to its headers.
find_package(Torch REQUIRED)
include(cmake/TorchIncludes.cmake)
colony_torch_include_dirs(COLONY_TORCH_INCLUDE_DIRS)
add_library(colony_torch INTERFACE)
target_include_directories(colony_torch SYSTEM INTERFACE ${COLONY_TORCH_INCLUDE_DIRS})
target_link_libraries(colony_torch INTERFACE ${TORCH_LIBRARIES})
message(STATUS "LibTorch ${Torch_VERSION}: ${TORCH_INSTALL_PREFIX}"
  " (CUDA: ${CUDA_FOUND}${CUDAToolkit_FOUND})")
# Gzip'd datasets (zlib). Tokenizers are native (sentencepiece-compatible; spm_train trains them);
# tokenizer.json's regexes run on Oniguruma (the engine Hugging Face tokenizers uses) and its
# Unicode normalizers on ICU.
find_package(ZLIB REQUIRED)
pkg_check_modules(ONIG REQUIRED IMPORTED_TARGET oniguruma)
pkg_check_modules(ICU_UC REQUIRED IMPORTED_TARGET icu-uc)
