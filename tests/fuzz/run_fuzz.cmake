# run_fuzz.cmake — runs the libFuzzer target for a bounded time, seeded with real shard
# files (written by the Python tests' helper) and a few hand-made headers.
#
#   cmake -DFUZZER=<fuzz_header> -DSEED_WRITER=<shardadam_write_shards> -DDICT=<header.dict>
#         -DWORK_DIR=<scratch> -DSECONDS=<n> -P run_fuzz.cmake
cmake_minimum_required(VERSION 3.24)
foreach(var IN ITEMS FUZZER SEED_WRITER DICT WORK_DIR SECONDS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzz: pass -D${var}=...")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/seeds/fsdp" "${WORK_DIR}/seeds/hsdp" "${WORK_DIR}/corpus" "${WORK_DIR}/artifacts")
execute_process(COMMAND "${SEED_WRITER}" "${WORK_DIR}/seeds" RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "run_fuzz: the seed writer failed (${rc})")
endif()
file(GLOB seeds "${WORK_DIR}/seeds/*/*.safetensors")
file(COPY ${seeds} DESTINATION "${WORK_DIR}/corpus")

execute_process(
  COMMAND "${FUZZER}" "-max_total_time=${SECONDS}" -max_len=16384 -timeout=20 -rss_limit_mb=2048
          "-dict=${DICT}" "-artifact_prefix=${WORK_DIR}/artifacts/" -print_final_stats=1
          "${WORK_DIR}/corpus"
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${err}")
if(NOT rc EQUAL 0)
  file(GLOB artifacts "${WORK_DIR}/artifacts/*")
  message(FATAL_ERROR "run_fuzz: the fuzzer found a problem (exit ${rc}); inputs: ${artifacts}\n${err}")
endif()
message(STATUS "run_fuzz: ${SECONDS} s without a finding (${runs})")
