#!/usr/bin/env bash
# Runs laya's test suite: prepares what the tests need (scripts/setup.sh --no-run, which is
# quick once done), then `cargo test --release`, then the editor integrations in real clients
# (scripts/test-editors.sh; each editor skips with its reason where its client cannot be
# installed). Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-run --models qwen2.5-coder-0.5b
cargo test --release --locked "$@"
LAYA_BIN=target/release/laya scripts/test-editors.sh
