# shardadam_warnings: an interface target carrying the project's warning flags
# (-Wall -Wextra -Wpedantic, and -Werror when SHARDADAM_WERROR is on) for C and C++. The
# top-level CMakeLists.txt includes it, and so does bindings/python/CMakeLists.txt when it
# packages a prebuilt library (SHARDADAM_PREBUILT) without the top level.
if(NOT TARGET shardadam_warnings)
  add_library(shardadam_warnings INTERFACE)
  target_compile_options(shardadam_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wpedantic $<$<BOOL:${SHARDADAM_WERROR}>:-Werror>>)
endif()
