#!/usr/bin/env bash
# examples/hello_job, the torch-free example the README starts from, without a cluster: --local 2 starts both
# ranks with the job's environment (Job::env GREETING=hello, as the sbatch script exports it; --env overrides
# it) and the forwarded arguments; --dry-run's script exports the same value, shell-quoted.
# Usage: hello_job_test.sh <hello_job binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
hello="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/hello-job-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
unset HPCTRAIN_RUN_DIR GREETING

"$hello" --local 2 one two >local.log 2>&1 || fail "--local 2 exited $?"
for rank in 0 1; do
  grep -q "^hello from rank $rank of 2 (local rank $rank, node 0) on local, job local, master 127.0.0.1:[0-9]*, args: one two\$" local.log ||
    log=local.log fail "rank $rank did not greet with the job's GREETING and the forwarded arguments"
done

GREETING=ignored "$hello" --local 1 --env GREETING="hi there" >override.log 2>&1 || fail "--local 1 --env exited $?"
grep -q "^hi there from rank 0 of 1 " override.log || log=override.log fail "--env GREETING did not reach the rank"

"$hello" --dry-run >script.sh 2>dry-run.log || fail "--dry-run exited $?"
grep -qx "export GREETING=hello" script.sh || log=script.sh fail "the script does not export the job's GREETING"
echo "PASS: hello_job greets from every --local rank with the job's environment, and its script exports it"
