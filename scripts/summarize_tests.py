"""Adds up JUnit XML reports into one line: `tests: N passed, N failed, N skipped`.

Exits 1 when anything failed, or when a report is missing (a runner that
crashed before writing one must not read as green)."""
import sys
import xml.etree.ElementTree as ET


def count(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
    passed = failed = skipped = 0
    for suite in suites:
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped


def main(paths):
    totals = [0, 0, 0]
    missing = []
    for p in paths:
        try:
            for i, n in enumerate(count(p)):
                totals[i] += n
        except (OSError, ET.ParseError):
            missing.append(p)
    for p in missing:
        print(f"summary: no readable report at {p}", file=sys.stderr)
    passed, failed, skipped = totals
    print(f"tests: {passed} passed, {failed + len(missing)} failed, {skipped} skipped")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
