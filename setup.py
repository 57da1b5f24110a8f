"""The compiled part of the build: pycollective._native (C11, no dependency beyond the
Python headers). Everything else is declared in pyproject.toml.

The extension is optional: where it cannot be compiled the install still succeeds, and
pycollective warns once at its first arena and runs the pure-Python arena instead.
PYCOLLECTIVE_NATIVE=0 at build time leaves it out on purpose (as it turns it off at run
time): the packaging tests build a wheel that way in seconds."""

import os
import sys
from pathlib import Path

from setuptools import Extension, setup

SRC = Path("src/pycollective/_native")
ARGS = []
if sys.platform != "win32":
    # C11; no FMA contraction, so every instruction set computes the same bits.
    ARGS = ["-std=c11", "-O3", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall"]

native = Extension(
    "pycollective._native",
    sources=[
        str(SRC / name)
        for name in ("module.c", "kernels_generic.c", "kernels_avx2.c", "kernels_avx512.c")
    ],
    depends=[str(SRC / name) for name in ("kernels.h", "kernels_impl.h")],
    extra_compile_args=ARGS,
    optional=True,
)

setup(ext_modules=[] if os.environ.get("PYCOLLECTIVE_NATIVE") == "0" else [native])
