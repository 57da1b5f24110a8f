"""Fuzz targets for every parser that reads bytes from a peer (docs/security.md).

One module per target in `targets/`, each with `check(data: bytes) -> None`: it feeds
`data` to the parser as a peer would and asserts the parser's contract (a well-formed
result within its bounds, or the library's own documented error; never another
exception, an allocation past the bound, or a hang). `python -m fuzz TARGET` runs one
under atheris (libFuzzer); `python -m fuzz.run` runs them all for a bounded time;
`python -m fuzz.make_corpus` writes the seeds in `corpus/` from real frames.
"""

TARGETS = (
    "transport_frames",
    "store_server",
    "store_client",
    "handshake",
    "serialize",
    "arena_words",
)
