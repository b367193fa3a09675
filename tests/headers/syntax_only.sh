#!/bin/sh
# Compiler launcher for the self-contained header checks: a header compiles on its own when the compiler
# parses and type-checks it, so skip code generation and debug info (-fsyntax-only: ~40% of the time of a
# full compile for our torch headers) and leave an empty object file where the build expects one.
# The precompiled header itself (-x c++-header) is built as usual.
#   syntax_only.sh <compiler> <arguments...>
case " $* " in
  *" -x c++-header "*) exec "$@" ;;
esac
output=
previous=
for argument in "$@"; do
  [ "$previous" = "-o" ] && output=$argument
  previous=$argument
done
"$@" -fsyntax-only || exit
[ -z "$output" ] || : > "$output"
