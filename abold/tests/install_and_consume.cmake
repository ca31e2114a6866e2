# Installs the build into WORK_DIR/prefix, then builds the README's quick start (QUICKSTART) against
# the installed tree twice, with no extra flags: through find_package(flashattn) and through
# pkg-config. Both programs call the CUDA runtime and flashattn_fwd. Each must run and print success
# (exit 0); on a machine without a GPU (no working nvidia-smi) exit 2 with FLASHATTN_STATUS_NO_DEVICE
# is what a correct build prints, and is accepted there only.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                OUTPUT_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed")
endif()
execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE smi_rc OUTPUT_QUIET ERROR_QUIET)
if(smi_rc EQUAL 0)
  set(have_gpu 1)
else()
  set(have_gpu 0)
endif()

function(run_quickstart exe how)
  execute_process(COMMAND ${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${how}: exit ${rc}\n${out}${err}")
  if(rc EQUAL 0 AND out MATCHES "success")
    return()
  endif()
  if(NOT have_gpu AND rc EQUAL 2 AND err MATCHES "FLASHATTN_STATUS_NO_DEVICE")
    message(STATUS "${how}: built, linked and loaded; no GPU here, so it stopped at handle_create")
    return()
  endif()
  message(FATAL_ERROR "quick start built with ${how} failed (exit ${rc})")
endfunction()

# find_package
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
                -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DQUICKSTART=${QUICKSTART} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer configure (find_package) failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer build (find_package) failed")
endif()
run_quickstart(${WORK_DIR}/build/quickstart "find_package")

# pkg-config
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${WORK_DIR}/prefix/lib/pkgconfig:${WORK_DIR}/prefix/lib64/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs flashattn OUTPUT_VARIABLE flags
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not know flashattn")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
execute_process(COMMAND cc -std=c99 -Wall -Wextra -Werror ${QUICKSTART} ${flags} -o ${WORK_DIR}/quickstart_pc
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "quick start build with pkg-config flags (${flags}) failed")
endif()
run_quickstart(${WORK_DIR}/quickstart_pc "pkg-config")

# The installed benchmark starts from the installed tree (--help needs no GPU).
if(NOT HAVE_BENCH)
  return()
endif()
execute_process(COMMAND ${WORK_DIR}/prefix/bin/flashattn_bench --help RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "installed flashattn_bench --help exited ${rc}")
endif()
