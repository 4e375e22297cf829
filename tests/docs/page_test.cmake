# page_test.cmake — what the tests of the documentation pages share (included by
# run_c_page_test.cmake and run_rust_page_test.cmake): install the build tree into a
# scratch prefix, take a page's marked blocks out (doc_blocks), run one of its scripts as
# a reader's shell would, and judge a first-step program's output (first_step_check).
#
# The including script defines SHARDADAM_BINARY_DIR, PAGE, DOC_BLOCKS, CHECK and WORK_DIR.
# Every failure stops the test with what ran and its output.

# page_test_install(<prefix>): `cmake --install` of the build tree into <prefix>.
function(page_test_install prefix)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" --install "${SHARDADAM_BINARY_DIR}" --prefix "${prefix}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "page test: installing ${SHARDADAM_BINARY_DIR} failed:\n${out}")
  endif()
endfunction()

# page_test_extract(<dir> <file>...): the page's blocks into <dir>; each <file> must be
# among them.
function(page_test_extract dir)
  file(MAKE_DIRECTORY "${dir}")
  execute_process(
    COMMAND "${DOC_BLOCKS}" "${PAGE}" "${dir}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "page test: taking the blocks out of ${PAGE} failed:\n${out}")
  endif()
  foreach(file IN LISTS ARGN)
    if(NOT EXISTS "${dir}/${file}")
      message(FATAL_ERROR "page test: ${PAGE} has no block marked for ${file}")
    endif()
  endforeach()
endfunction()

# page_test_run(<name> <script> <working dir> [<VAR=value>...]): runs the page's script
# with `sh -ex` in <working dir>, the environment given; its output goes to
# WORK_DIR/<name>.log and `script_output`.
function(page_test_run name script dir)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E env ${ARGN} sh -ex "${script}"
    WORKING_DIRECTORY "${dir}"
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  file(WRITE "${WORK_DIR}/${name}.log" "${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "page test: ${PAGE}'s script '${name}' failed (${rc}):\n${out}")
  endif()
  message(STATUS "page test: script '${name}': ok")
  set(script_output "${out}" PARENT_SCOPE)
endfunction()

# page_test_check(<name> <expected output>): the output of script <name> against the
# float64 first step and the page's expected lines.
function(page_test_check name expected)
  execute_process(
    COMMAND "${CHECK}" "${WORK_DIR}/${name}.log" "${expected}"
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    file(READ "${WORK_DIR}/${name}.log" log)
    message(FATAL_ERROR "page test: what ${PAGE}'s script '${name}' printed is wrong:\n"
      "${out}--- its output ---\n${log}")
  endif()
  message(STATUS "page test: ${name}: ${out}")
endfunction()
