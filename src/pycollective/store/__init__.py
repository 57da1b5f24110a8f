"""Rendezvous key-value stores, modeled on torch.distributed's Store API.

- `TCPStoreServer` hosts a store; `TCPStore` is its client (or hosts one with is_master=True).
- `FileStore` shares a store through a file (init_method="file://...").
- `EtcdStore` keeps it in an etcd cluster (init_method="etcd://h1:2379,h2:2379/job"), so
  no host of the job is its single point of failure; values are signed with the secret.
- `PrefixStore` namespaces another store; `HashStore` lives in one process (tests, threads).

Every connection to a TCP store proves the job's shared secret first (pycollective._auth);
every failure and timeout raises pycollective.StoreError.
"""

from .. import _lazy
from .._errors import StoreError
from ._base import MAX_KEY_BYTES, MAX_VALUE_BYTES, Store
from ._memory import HashStore
from .file import FileStore
from .prefix import PrefixStore
from .tcp import TCPStore, TCPStoreServer

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_VALUE_BYTES",
    "EtcdStore",
    "FileStore",
    "HashStore",
    "PrefixStore",
    "Store",
    "StoreError",
    "TCPStore",
    "TCPStoreServer",
]

# The etcd client (and http.client, email under it) is imported when a job first uses etcd:
# most jobs meet in a TCP store or a file (pycollective._lazy).
_LAZY = {
    "EtcdStore": "pycollective.store.etcd:EtcdStore",
    "parse_etcd_url": "pycollective.store.etcd:parse_url",
}
__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
