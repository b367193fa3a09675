#!/bin/sh
# The link tests' one-definition check: the object of a TU that includes every header may define no strong
# external symbol but its own. A function or variable defined in a header without `inline` is emitted strong
# in every TU that includes it, so two such TUs fail to link (duplicate symbol); nm finds it in one TU, for
# half the compile time of a second. Inline functions, templates, vtables and inline variables are weak (W, V)
# or unique (u); static ones are local (lower case).
#   Usage: no_strong_symbols.sh <object> <the TU's own symbol, as nm -C prints it>
set -eu
strong=$(nm --defined-only -C "$1" | awk -v own="$2" '$2 ~ /^[TDBRGSC]$/ {
  name = $3; for (i = 4; i <= NF; ++i) name = name " " $i
  if (name != own) print $2 " " name }')
if [ -n "$strong" ]; then
  echo "FAIL: defined strong (not inline) by the headers $1 includes; a second TU including them would not link:"
  echo "$strong"
  exit 1
fi
echo "PASS: $(nm --defined-only "$1" | wc -l) symbols defined, none strong but $2"
