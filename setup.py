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

# Beside src/, not in it: a folder named after the extension inside the package would be
# importable as an empty namespace package wherever the extension is not built.
SRC = Path("csrc")
ARGS = []
if sys.platform != "win32":
    # C11; no FMA contraction, so every instruction set computes the same bits. The
    # sources are clean under these warnings with gcc and clang (`make lint` builds them
    # with -Werror; an install never does).
    ARGS = ["-std=c11", "-O3", "-ffp-contract=off", "-fno-strict-aliasing",
            "-Wall", "-Wextra", "-Wconversion"]  # fmt: skip

native = Extension(
    "pycollective._native",
    sources=sorted(str(p) for p in SRC.glob("*.c")),
    depends=sorted(str(p) for p in SRC.glob("*.h")),
    extra_compile_args=ARGS,
    optional=True,
)

setup(ext_modules=[] if os.environ.get("PYCOLLECTIVE_NATIVE") == "0" else [native])
