# Warning flags for every deltaserve target: call deltaserve_warnings(target).
function(deltaserve_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
    # GCC 12 at -O3 reports false -Wrestrict / -Wstringop-overflow inside libstdc++'s std::string.
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-restrict -Wno-stringop-overflow -Wno-array-bounds>)
  if(DELTASERVE_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()
