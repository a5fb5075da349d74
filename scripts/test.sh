#!/usr/bin/env bash
# Runs laya's test suite: prepares what the tests need (scripts/setup.sh --no-run with the
# 0.5B and 1.5B models, and scripts/peer-setup.sh's llama-cpp-python venv for the llama.cpp
# tests; both quick once done, the venv's first build ~6 min on 2 cores), then
# `cargo test --release --workspace` (laya, its engine crate and mlx-sys) with
# LAYA_TEST_REAL_MODELS=1, the switch that runs the tests of the real models and of
# llama.cpp (a plain `cargo test --workspace` skips them and needs neither; see
# crates/laya-engine/src/testing.rs), the benchmark scorer's checks (bench/quality/test_score.py) and the
# cross-file case set's (bench/quality/test_make_repo_cases.py), then
# the editor integrations in real clients (scripts/test-editors.sh; each editor skips with
# its reason where its client cannot be installed). Extra arguments go to cargo test. The
# code's formatting is checked first (`cargo fmt --check`, where rustfmt is installed), and
# before it that no link or repository path in the docs points at nothing
# (scripts/check_links.py, well under a second).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/check_links.py
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all --check || { echo "test.sh: run \`cargo fmt\` (the diff is above)" >&2; exit 1; }
fi
# The tests run on the CPU build unless LAYA_MLX_BACKEND names another.
scripts/setup.sh --no-run --backend "${LAYA_MLX_BACKEND:-cpu}" --models qwen2.5-coder-0.5b,qwen2.5-coder-1.5b
LAYA_PEER_PYTHON=$(scripts/peer-setup.sh | tail -n 1)
export LAYA_PEER_PYTHON
export LAYA_TEST_REAL_MODELS=1
cargo test --release --locked --workspace "$@"
python3 bench/quality/test_score.py
python3 bench/quality/test_make_repo_cases.py
LAYA_BIN=target/release/laya scripts/test-editors.sh
