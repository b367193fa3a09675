#!/usr/bin/env python3
"""A document's code is compiled code: every region `// [snippet NAME]` ... `// [end snippet]` of each SOURCE stands
verbatim as a ```cpp block of DOC (so editing either side alone fails here).

  doc_snippets_test.py DOC SOURCE...      exit 0 when every region is in DOC, 1 naming those that are not."""
import re
import sys


def main(doc, sources):
    blocks = re.findall(r"```cpp\n(.*?)```", open(doc).read(), re.S)
    found, missing = 0, []
    for source in sources:
        for name, region in re.findall(r"^[ \t]*// \[snippet (\w+)\]\n(.*?)^[ \t]*// \[end snippet\]\n", open(source).read(), re.S | re.M):
            if region in blocks:
                found += 1
            else:
                missing.append(f"{source}: snippet {name}")
    if found + len(missing) == 0:
        print(f"FAIL: no snippet region in {', '.join(sources)}")
        return 1
    for m in missing:
        print(f"FAIL: {m} does not stand verbatim as a cpp block of {doc}")
    print(f"{found} of {found + len(missing)} snippet regions stand in {doc}")
    return 1 if missing else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
