#!/bin/bash
# The C++ sources are formatted: clang-format 14 (the version scripts/pins.sh installs; another version formats
# differently) with the repository's .clang-format changes no file tracked by git. examples/ is laid out by hand
# (examples/.clang-format says why) and is checked for what the formatter would guarantee there: every line at most
# 120 columns, and every program under 50 lines. Before all that, a misformatted sample must be reported, so that a
# formatter that checks nothing cannot pass.
# Usage: format_check.sh SOURCE_DIR
set -u
source_dir=$1
format=clang-format-14
command -v "$format" >/dev/null || { echo "FAIL: $format not found (scripts/setup installs it)"; exit 1; }
cd "$source_dir" || exit 1

if printf 'int  main( ) {return 0;}\n' | "$format" --style=file --assume-filename=probe.cpp --dry-run --Werror \
     2>/dev/null; then
  echo "FAIL: $format reports nothing for a misformatted sample"
  exit 1
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h')
else  # a source tree without git: every C++ file but the build's
  mapfile -t files < <(find . -path ./build -prune -o -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) \
                         -print | sed 's|^\./||' | sort)
fi
echo "$format on ${#files[@]} files"
status=0
if ! "$format" --style=file --dry-run --Werror "${files[@]}"; then
  echo "FAIL: the files above are not formatted: run $format -i on them"
  status=1
fi

for example in examples/*.cpp; do
  lines=$(wc -l < "$example")
  widest=$(LC_ALL=C.UTF-8 wc -L < "$example")  # display columns, as clang-format counts them
  echo "$example: $lines lines, widest $widest columns"
  if [ "$lines" -ge 50 ]; then echo "FAIL: $example has $lines lines (under 50)"; status=1; fi
  if [ "$widest" -gt 120 ]; then echo "FAIL: $example has a line of $widest columns (at most 120)"; status=1; fi
done
[ $status -eq 0 ] && echo "OK: every C++ file formatted; every example under 50 lines of at most 120 columns"
exit $status
