# colony_torch_include_dirs(OUT): LibTorch's include folders, safe to put before the system's.
#
# A PyTorch wheel's include folder (site-packages/torch/include) also carries the protobuf and fmt
# headers PyTorch was built with, which differ from the system's: put first on the include path,
# they shadow the headers that protoc's generated files and spdlog were built against, and those
# break. For such a folder this makes a mirror in the build tree that links to every entry but
# those, and points LibTorch's imported targets at the mirror instead. System folders (Debian's
# /usr/include, whose protobuf and fmt are the system's own) are left as they are.
set(COLONY_TORCH_SHADOWING_HEADERS fmt google spdlog)

function(colony_torch_mirror dir out)
  string(SHA1 hash "${dir}")
  string(SUBSTRING "${hash}" 0 12 hash)
  set(mirror "${CMAKE_BINARY_DIR}/torch-include/${hash}")
  file(MAKE_DIRECTORY "${mirror}")
  file(GLOB entries RELATIVE "${dir}" "${dir}/*")
  foreach(entry IN LISTS entries)
    if(NOT entry IN_LIST COLONY_TORCH_SHADOWING_HEADERS AND NOT EXISTS "${mirror}/${entry}")
      file(CREATE_LINK "${dir}/${entry}" "${mirror}/${entry}" SYMBOLIC)
    endif()
  endforeach()
  set(${out} "${mirror}" PARENT_SCOPE)
endfunction()

function(colony_torch_include_dirs out)
  set(result)
  set(replaced)
  set(replacements)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    # TorchConfig.cmake's paths hold ".." steps; its targets' do not: compare real paths.
    get_filename_component(dir "${dir}" REALPATH)
    set(shadows FALSE)
    foreach(name IN LISTS COLONY_TORCH_SHADOWING_HEADERS)
      if(EXISTS "${dir}/${name}")
        set(shadows TRUE)
      endif()
    endforeach()
    if(shadows AND NOT dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES
       AND NOT dir STREQUAL "/usr/include" AND NOT dir STREQUAL "/usr/local/include")
      colony_torch_mirror("${dir}" mirror)
      message(STATUS "LibTorch: ${dir} also holds ${COLONY_TORCH_SHADOWING_HEADERS} headers; "
        "including it through ${mirror}, without them")
      list(APPEND result "${mirror}")
      list(APPEND replaced "${dir}")
      list(APPEND replacements "${mirror}")
    else()
      list(APPEND result "${dir}")
    endif()
  endforeach()
  # LibTorch's imported targets carry the same folders to whatever links them.
  if(replaced)
    foreach(target torch torch_library torch_cpu torch_cpu_library torch_cuda torch_cuda_library
                   c10 c10_cuda caffe2::cudart caffe2::nvrtc)
      if(NOT TARGET ${target})
        continue()
      endif()
      get_target_property(aliased ${target} ALIASED_TARGET)
      if(aliased)
        continue()
      endif()
      get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
      if(NOT dirs)
        continue()
      endif()
      set(fixed)
      foreach(d IN LISTS dirs)
        get_filename_component(real "${d}" REALPATH)
        list(FIND replaced "${real}" i)
        if(i GREATER -1)
          list(GET replacements ${i} d)
        endif()
        list(APPEND fixed "${d}")
      endforeach()
      set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${fixed}")
    endforeach()
  endif()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()
