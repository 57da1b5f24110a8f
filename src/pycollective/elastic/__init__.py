"""In-job recovery for data-parallel training: a Manager that owns the group, forms a new
one without a restart when a member is lost or joins, and keeps every member at the same
committed step, bit for bit (docs/elastic.md).

    from pycollective import elastic
    manager = elastic.Manager(state_dict=get_state, load_state_dict=set_state)
    sampler = elastic.ElasticSampler(manager, len(dataset), global_batch=256)
    for step in manager.steps(total_steps):
        batch = dataset[sampler.indices()]
        ...compute gradients...
        manager.average(grads)                # or DataParallel + Optimizer (.ddp)
        if manager.should_commit():
            ...apply the update...
    manager.close()

torch's DataParallel and Optimizer wrappers are in pycollective.elastic.ddp (it imports
torch, so this package does not import it).
"""

from __future__ import annotations

from ._errors import ElasticError, JobFinished
from ._manager import Event, Manager
from ._quorum import Decision, Registration, decide
from ._sampler import ElasticSampler

__all__ = [
    "Decision",
    "ElasticError",
    "ElasticSampler",
    "Event",
    "JobFinished",
    "Manager",
    "Registration",
    "decide",
]
