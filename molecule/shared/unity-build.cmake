# The suite's llama.cpp builds are CMake unity builds (-DCMAKE_UNITY_BUILD=ON in the scenarios'
# llamacpp_cmake_extra_args, with -DCMAKE_PROJECT_INCLUDE naming this file, mounted read-only into every test
# container by molecule/shared/create.yml): each target's sources are compiled a few at a time as one translation
# unit, so that the headers that dominate this tree's compile time (the STL, nlohmann/json, httplib) are parsed
# once per batch instead of once per file. Measured on 0c1e570 at -O1, the suite's targets: ~28 % less compile
# CPU, e3a74b2 ~47 % (CHANGELOG.md). The sources are the pinned ones, unchanged; only how they are grouped
# into compiler runs differs. Operators' builds and `make demo` do not use it.
#
# Sources that cannot share a translation unit with their neighbours (file-static names defined twice, template
# specialisations after use, headers that refuse to be included together) are compiled on their own. The list
# covers the suite's trees (e3a74b2 and 0c1e570); a name missing from a tree is ignored.
include_guard(GLOBAL)

function(llama_test_unity_exclusions)
  # ggml-rpc: RPC_DEBUG is a file-static in ggml-rpc.cpp and transport.cpp. ggml-vulkan: one large source and the
  # generated shaders, which gain little from it.
  foreach(target ggml-rpc ggml-vulkan)
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES UNITY_BUILD OFF)
    endif()
  endforeach()
  set(dir ${CMAKE_SOURCE_DIR})
  # common_json::get<T> specialised after use (0c1e570); foreach_function defined twice (e3a74b2).
  set_source_files_properties(${dir}/common/json.cpp ${dir}/common/chat.cpp
    DIRECTORY ${dir}/common PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  # mtmd-helper refuses mtmd's internal headers, which its unity neighbours include.
  set_source_files_properties(${dir}/tools/mtmd/mtmd-helper.cpp ${dir}/tools/mtmd/mtmd-helper-gen.cpp
    DIRECTORY ${dir}/tools/mtmd PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  # ggml_mul_mat_aux and ggml_view_2d_slice defined twice (e3a74b2).
  set_source_files_properties(${dir}/src/llama-kv-cache.cpp ${dir}/src/models/gemma4.cpp
    DIRECTORY ${dir}/src PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endfunction()

# At the end of the top directory's configuration, once every target exists.
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL llama_test_unity_exclusions)
