# The compiled kernel variants have one source: the tables FA_FUSED_CONFIGS and FA_SM90_CONFIGS in
# kernels/fa_kernel_params.h, which the planner expands too. This reads them and writes one small
# translation unit per variant (dtype x head dim, and x key tile x consumer warpgroups for FUSED_SM90) into
# the build tree, so a build compiles them in parallel and FLASHATTN_HEAD_DIMS can leave some out.

# The rows "X(a, b, ...)" of the X-macro table `name` in the header's text, as "a;b;..." strings
# joined by "|".
function(flashattn_table_rows text name out)
  string(FIND "${text}" "#define ${name}(X)" start)
  if(start EQUAL -1)
    message(FATAL_ERROR "kernels/fa_kernel_params.h has no ${name}")
  endif()
  string(SUBSTRING "${text}" ${start} -1 rest)
  string(FIND "${rest}" "\n\n" stop)
  string(SUBSTRING "${rest}" 0 ${stop} block)
  string(REGEX MATCHALL "X\\(([0-9, ]+)\\)" rows "${block}")
  set(result "")
  foreach(row IN LISTS rows)
    string(REGEX REPLACE "X\\(([0-9, ]+)\\)" "\\1" row "${row}")
    string(REPLACE " " "" row "${row}")
    string(REPLACE "," ";" row "${row}")
    list(JOIN row ":" row)
    list(APPEND result "${row}")
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

file(READ ${CMAKE_CURRENT_SOURCE_DIR}/kernels/fa_kernel_params.h _fa_params_text)
flashattn_table_rows("${_fa_params_text}" FA_FUSED_CONFIGS _fa_fused_rows)
flashattn_table_rows("${_fa_params_text}" FA_SM90_CONFIGS _fa_sm90_rows)
# FUSED: head dims (the first column); FUSED_SM90: head dim:block_n:consumers (columns 1 to 3).
set(FLASHATTN_ALL_HEAD_DIMS "")
foreach(row IN LISTS _fa_fused_rows)
  string(REPLACE ":" ";" row "${row}")
  list(GET row 0 hd)
  list(APPEND FLASHATTN_ALL_HEAD_DIMS ${hd})
endforeach()
set(FLASHATTN_SM90_VARIANTS "")
foreach(row IN LISTS _fa_sm90_rows)
  string(REPLACE ":" ";" row "${row}")
  list(GET row 0 hd)
  list(GET row 1 bn)
  list(GET row 2 nc)
  list(APPEND FLASHATTN_SM90_VARIANTS "${hd}:${bn}:${nc}")
endforeach()

# One instance file (rewritten only when its text changes, so nothing recompiles needlessly).
function(flashattn_instance out_var path text)
  file(CONFIGURE OUTPUT ${path} CONTENT "${text}")
  set(${out_var} ${${out_var}} ${path} PARENT_SCOPE)
endfunction()
