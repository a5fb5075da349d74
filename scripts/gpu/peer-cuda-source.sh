#!/usr/bin/env bash
# Packs the llama.cpp source that `scripts/gpu/gpu-real-bench.sh` step `llama` builds with CUDA on
# the GPU machine (which reaches no registry): llama.cpp as vendored by llama-cpp-python 0.3.36
# (the same llama.cpp as the CPU peer of scripts/peer-setup.sh), from its PyPI sdist, without
# the parts a CUDA `llama-server` does not build (docs, models, tests, examples, other
# backends, the web UI's sources). Writes .peer/llama.cpp.tar.xz (~4.5 MB; `.peer/` is for
# carried files and stays out of git: add it to .git/info/exclude).
#
#   scripts/gpu/peer-cuda-source.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=0.3.36
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The sdist straight from the package index's simple page (checked against its sha256):
# `pip download --no-binary :all:` would build the sdist's build requirements (cmake, ninja)
# from source just to read its metadata.
python3 - "$VERSION" "$work" <<'PY'
import hashlib, re, sys, urllib.request
version, work = sys.argv[1:]
page = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
url, sha = re.search(rf'href="([^"]*/llama_cpp_python-{re.escape(version)}[.]tar[.]gz)#sha256=([0-9a-f]+)"', page).groups()
data = urllib.request.urlopen(url).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"peer-cuda-source: sha256 mismatch for {url}")
open(f"{work}/llama_cpp_python-{version}.tar.gz", "wb").write(data)
PY
tar -C "$work" -xzf "$work/llama_cpp_python-$VERSION.tar.gz"
src="$work/lc"
mv "$work/llama_cpp_python-$VERSION/vendor/llama.cpp" "$src"
rm -rf "$src"/{docs,models,media,benches,tests,gguf-py,examples,pocs} \
  "$src"/tools/ui/{src,tests,static,package-lock.json}
for b in et metal hexagon sycl vulkan opencl cann musa hip kompute zdnn webgpu openvino zendnn blas rpc; do
  rm -rf "$src/ggml/src/ggml-$b"
done
mkdir -p .peer
tar -C "$work" -cf - lc | xz -6 -T2 >.peer/llama.cpp.tar.xz
ls -la .peer/llama.cpp.tar.xz
