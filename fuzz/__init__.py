"""Fuzz targets for every parser that reads bytes from a peer (docs/security.md).

One module per target in `targets/`, each with `check(data: bytes) -> None`: it feeds
`data` to the parser as a peer would and asserts the parser's contract (a well-formed
result within its bounds, or the library's own documented error; never another
exception, an allocation past the bound, or a hang). `python -m fuzz TARGET` runs one
under atheris (libFuzzer); `python -m fuzz.run` runs them all for a bounded time;
`python -m fuzz.make_corpus` writes the seeds in `corpus/` from real frames.
"""

# target -> the modules whose branches guide it: only these are instrumented (atheris
# rewrites the bytecode of each module it instruments, seconds for the whole package).
INSTRUMENT: dict[str, tuple[str, ...]] = {
    "transport_frames": ("pycollective.transport",),
    "store_server": ("pycollective.store",),
    "store_client": ("pycollective.store",),
    "handshake": ("pycollective._auth", "pycollective.transport.tcp.mesh"),
    "serialize": ("pycollective._serialize",),
    "arena_words": (
        "pycollective.shm",
        "pycollective.runners.arena",
        "pycollective.transport._calls",
    ),
}
TARGETS = tuple(INSTRUMENT)
