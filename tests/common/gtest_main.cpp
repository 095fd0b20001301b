// main() of the test binaries: GoogleTest's, except that a run in which every selected test was
// skipped exits with kSkipExitCode, which CTest (SKIP_RETURN_CODE) reports as skipped rather than
// passed. Each CTest entry runs one test, so a GPU test on a machine without a GPU shows as
// skipped, and a passing or failing test is reported as such.
#include <gtest/gtest.h>

namespace {
constexpr int kSkipExitCode = 77;
}

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  if (rc == 0 && unit.test_to_run_count() > 0 &&
      unit.skipped_test_count() == unit.test_to_run_count()) {
    return kSkipExitCode;
  }
  return rc;
}
