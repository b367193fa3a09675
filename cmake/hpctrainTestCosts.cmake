# Each test's COST from tests/test_costs.txt ("<seconds> <name>": the long tests of a full run on the 2-core
# machine), for the tests of the including directory. ctest starts the costliest tests first when it knows their
# cost; it learns costs from its Testing/Temporary/CTestCostData.txt only for names without spaces (it splits
# that file's lines on spaces), and ours are sentences. Without them a fresh build runs the tests in the order
# they were declared, which leaves the long Slurm tests, which take turns, for the end.
# Included at the end of each CMakeLists.txt that adds tests: set_tests_properties reaches only its own
# directory's tests (before CMake 3.28). A name holding ';' cannot be listed (a CMake list separator).
file(READ ${PROJECT_SOURCE_DIR}/tests/test_costs.txt _hpctrain_costs)
if(_hpctrain_costs MATCHES ";")  # its cost would be silently dropped, and the test started last
  message(FATAL_ERROR "tests/test_costs.txt: a test named with ';' cannot be given a cost: rename it")
endif()
file(STRINGS ${PROJECT_SOURCE_DIR}/tests/test_costs.txt _hpctrain_cost_lines)
get_property(_hpctrain_directory_tests DIRECTORY PROPERTY TESTS)
foreach(_line IN LISTS _hpctrain_cost_lines)
  if(_line MATCHES "^([0-9.]+) (.+)$")  # (CMAKE_MATCH_n is read after the match, not in the same if)
    set(_cost ${CMAKE_MATCH_1})
    set(_test "${CMAKE_MATCH_2}")
    if(_test IN_LIST _hpctrain_directory_tests)
      set_tests_properties("${_test}" PROPERTIES COST ${_cost})
    endif()
  endif()
endforeach()

# Every directory test by name: a name holding ';' is split by the list into fragments that are no test, and would
# silently miss every property set by name (its cost above among them).
foreach(_test IN LISTS _hpctrain_directory_tests)
  if(NOT TEST "${_test}")
    message(FATAL_ERROR "a test of ${CMAKE_CURRENT_SOURCE_DIR} has ';' in its name (near \"${_test}\"): rename it")
  endif()
endforeach()
