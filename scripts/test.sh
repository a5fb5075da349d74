#!/usr/bin/env bash
# Runs laya's test suite: prepares what the tests need (scripts/setup.sh --no-run, which is
# quick once done), then `cargo test --release`. Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-run --models qwen2.5-coder-0.5b
exec cargo test --release --locked "$@"
