# Run at every build (cmake -P): writes OUT from the source tree's current git commit and the values
# passed in, touching the file only when its content changes (so nothing recompiles needlessly).
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC_DIR}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  set(commit "unknown")
endif()
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC_DIR}
                OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(dirty)
  string(APPEND commit "+dirty")
endif()
file(CONFIGURE OUTPUT ${OUT} CONTENT
"#define FA_BUILD_GIT_COMMIT \"${commit}\"
#define FA_BUILD_TYPE \"${BUILD_TYPE}\"
#define FA_BUILD_CUDA_ARCHS \"${ARCHS}\"
#define FA_BUILD_VARIANTS \"${VARIANTS}\"
")
