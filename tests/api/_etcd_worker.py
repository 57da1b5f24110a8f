"""A rank that joins through etcd (tests/api/test_etcd_rendezvous.py): with ET_URL set it
passes init_method=ET_URL, else it relies on PYCOLLECTIVE_STORE; one all_reduce, printed."""

import os

import numpy as np

import pycollective as dist

url = os.environ.get("ET_URL")
dist.init_process_group(init_method=url) if url else dist.init_process_group()
x = np.array([dist.get_rank() + 1.0])
dist.all_reduce(x)
print(f"SUM {x[0]:g}", flush=True)
dist.destroy_process_group()
