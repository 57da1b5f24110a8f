"""A rank that joins a job (which may calibrate at init) and prints the parameters it
prices `auto` with, and the algorithm auto picks for a small all_reduce."""

from __future__ import annotations

import json

import numpy as np

import pycollective as dist

dist.init_process_group()
params = dist.group.WORLD.world.tuning.group_params("tcp", dist.get_world_size())
buf = np.ones(256, np.float32)
dist.all_reduce(buf)
assert np.all(buf == dist.get_world_size())
print("PARAMS " + json.dumps(params.__repr__()), flush=True)
dist.destroy_process_group()
