#!/usr/bin/env python3
"""Compiles the CUDA kernel sources laya's primitives carry as raw strings (csrc/*.cpp) with
NVRTC for an architecture, without a GPU: a kernel that does not compile fails here rather than
at its first use on a GPU machine. Prints each source's compile time and, with -v, ptxas's
register and spill report.

    scripts/gpu/nvrtc_check.py --nvrtc LIBNVRTC [--arch sm_90] [-v] FILE...
"""
import argparse
import ctypes
import os
import re
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvrtc", required=True, help="path of libnvrtc.so")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-v", action="store_true", help="ptxas's report")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.nvrtc)
    failed = 0
    for path in args.files:
        text = open(path).read()
        for i, m in enumerate(re.finditer(r'R"\((.*?)\)"', text, re.S)):
            src = m.group(1)
            # A source written for the plan's float type is compiled for each.
            types = ("float", "bf16", "f16") if "LAYA_T" in src else (None,)
            for t in types:
                opts = [f"--gpu-architecture={args.arch}", "--std=c++17"]
                if t:
                    opts.append(f"-DLAYA_T={t}")
                if args.v:
                    opts.append("--ptxas-options=-v")
                prog = ctypes.c_void_p()
                if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), path.encode(), 0, None, None):
                    sys.exit(f"{path}: nvrtcCreateProgram failed")
                argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
                start = time.time()
                rc = lib.nvrtcCompileProgram(prog, len(opts), argv)
                took = time.time() - start
                n = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
                log = ctypes.create_string_buffer(n.value)
                lib.nvrtcGetProgramLog(prog, log)
                lib.nvrtcDestroyProgram(ctypes.byref(prog))
                label = f"{path} source {i}" + (f" ({t})" if t else "")
                print(f"{label}: {'ok' if rc == 0 else 'FAILED'} in {took:.2f} s")
                text_log = log.value.decode(errors="replace").strip()
                if text_log and (rc or args.v):
                    print(text_log)
                failed |= rc != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
