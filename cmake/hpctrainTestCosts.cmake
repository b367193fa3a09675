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

# Two lanes (scripts/test runs ctest -j <2 x cores + 1>): a test that computes takes two of ctest's slots
# (PROCESSORS 2), so as many of them run at once as there are cores; a test holding the Slurm lock takes one, so one
# of them runs beside those. The Slurm tests spend most of their time waiting on the scheduler (requeues, grace
# periods, node timeouts) and used to hold one of two slots while they waited: the CPU was idle a third of the
# time. Measured on the 2-core EPYC: on a built tree ctest 1,098 s at -j2, 937 s with the lanes; fresh clones the
# same day 1,422 s at -j2, 1,333 s with the lanes (that day's machine was slower than the 1,098 s one).
foreach(_test IN LISTS _hpctrain_directory_tests)
  if(NOT TEST "${_test}")  # the list is split at ';': a name holding one leaves fragments that are no test
    message(FATAL_ERROR "a test of ${CMAKE_CURRENT_SOURCE_DIR} has ';' in its name (near \"${_test}\"): rename it")
  endif()
  get_test_property("${_test}" RESOURCE_LOCK _locks)
  if(NOT "slurm" IN_LIST _locks)
    set_tests_properties("${_test}" PROPERTIES PROCESSORS 2)
  endif()
endforeach()
