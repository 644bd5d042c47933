"""Prints the N slowest tests of pytest JUnit XML reports, and each report's
test count and summed test time: what the suite costs, in every CI log.

  python3 .ci/slowest.py N REPORT.xml [REPORT.xml ...]
"""

import sys
import xml.etree.ElementTree as ET


def test_times(path):
  """(seconds, "file::test") of every test case in one JUnit XML report."""
  cases = ET.parse(path).getroot().iter("testcase")
  return [(float(case.get("time", 0.0)),
           f"{case.get('classname')}::{case.get('name')}") for case in cases]


def main(argv):
  count, paths = int(argv[1]), argv[2:]
  for path in paths:
    times = sorted(test_times(path), reverse=True)
    print(f"== {len(times)} tests, {sum(t for t, _ in times):.0f} s summed "
          f"over both workers, in {path}; the {count} slowest:")
    for seconds, name in times[:count]:
      print(f"{seconds:8.1f} s  {name}")


if __name__ == "__main__":
  main(sys.argv)
