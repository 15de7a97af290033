# The Python package's tests (tests/python, pytest; docs/python.md), included by
# tests/CMakeLists.txt. Each runs pytest under Debian's python3 against this build's
# libmoec (MOEC_LIBRARY) and moec command (MOEC_CLI, for the byte-for-byte checks).
execute_process(COMMAND ${MOEC_TEST_PYTHON} -c "import pytest, numpy"
  RESULT_VARIABLE _moec_pytest_missing OUTPUT_QUIET ERROR_QUIET)
set(_moec_py_dir ${CMAKE_CURRENT_SOURCE_DIR}/python)
set(_moec_pytest ${MOEC_TEST_PYTHON} -m pytest -q -p no:cacheprovider)
set(_moec_py_env "MOEC_LIBRARY=$<TARGET_FILE:moec_shared>" "MOEC_CLI=$<TARGET_FILE:moec>"
  "PYTHONDONTWRITEBYTECODE=1" "XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/test-cache")
if(_moec_pytest_missing)
  message(WARNING "pytest or numpy missing for ${MOEC_TEST_PYTHON} (apt-get install python3-pytest): "
    "the python.* tests are not registered")
elseif(MOEC_SANITIZE)
  # The sanitizer build's library needs the ASan runtime first in the process: the
  # package's error and leak tests run under LD_PRELOAD, LeakSanitizer on
  # (tests/python/asan.sh; Python's own allocations are suppressed there).
  add_test(NAME python.asan
    COMMAND sh ${_moec_py_dir}/asan.sh ${MOEC_TEST_PYTHON} ${CMAKE_C_COMPILER} $<TARGET_FILE:moec_shared>)
  set_tests_properties(python.asan PROPERTIES LABELS "python" TIMEOUT 900
    ENVIRONMENT "MOEC_CLI=$<TARGET_FILE:moec>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/test-cache")
else()
  add_test(NAME python.api
    COMMAND ${_moec_pytest} ${_moec_py_dir}/test_errors.py ${_moec_py_dir}/test_leak.py
            ${_moec_py_dir}/test_notebook.py ${_moec_py_dir}/test_torch.py ${_moec_py_dir}/test_zero_copy.py)
  add_test(NAME python.hf_fixtures COMMAND ${_moec_pytest} ${_moec_py_dir}/test_hf_fixtures.py)
  add_test(NAME python.rss COMMAND ${_moec_pytest} -s ${_moec_py_dir}/test_rss.py)
  add_test(NAME python.install
    COMMAND sh ${_moec_py_dir}/install.sh ${MOEC_TEST_PYTHON} ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(python.api python.hf_fixtures python.rss python.install PROPERTIES
    ENVIRONMENT "${_moec_py_env}")
  set_tests_properties(python.api python.install PROPERTIES LABELS "python" TIMEOUT 900)
  set_tests_properties(python.hf_fixtures PROPERTIES LABELS "python;e2e" TIMEOUT 1800)
  set_tests_properties(python.rss PROPERTIES LABELS "python;slow" TIMEOUT 1800)
endif()
