"""The messages of a parameter-server job, all over pycollective point-to-point.

Setup (a collective over the whole world): worker 0 broadcasts the job's spec (parameter
count, optimizer, mode) and then the initial flat parameters, so every server starts from
its slice and every worker from the same bits.

Each step, worker -> server s: PUSH, a float32 vector [command, gradient slice of s];
server s -> worker: PULL, the server's current parameter slice. The command rides in the
same message as the gradient so a step costs one message each way per server. STEP
pushes a gradient; STOP (its gradient ignored) asks for the final parameters and says
this worker is done.
"""

from __future__ import annotations

PUSH_TAG = 0x5053_0001
PULL_TAG = 0x5053_0002

STEP = 0.0
STOP = 1.0

MODES = ("sync", "async")
