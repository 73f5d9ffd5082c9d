"""The torch.distributed rendezvous of Ray Train's workers, kept off the network when they share a node.

Ray Train's `TorchConfig` (Ray 2.60, `ray/train/torch/config.py`) sets MASTER_ADDR to rank 0's node address and has
every rank `init_process_group("env://")`: rank 0 then serves a TCPStore, which binds every interface (0.0.0.0)
whatever MASTER_ADDR says, takes no authentication, and lets whoever reaches the port join or poison the group; gloo's
and NCCL's own sockets bind the address the host name resolves to. For a group whose workers all run on one node
(one machine, or a `ray.cluster_utils.Cluster` on loopback) `LocalRendezvous` instead:

- rendezvous through a `FileStore` in a fresh private folder (`tempfile.mkdtemp`: mode 0700) on that node, so no
  store listens at all (a new folder per group start: a FileStore file is not reusable across groups);
- sets GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the loopback interface (unless the operator set them), so the
  collectives' sockets listen on 127.0.0.1 only.

A group spread over several nodes keeps Ray's TCPStore on rank 0's node: there MASTER_PORT (a free port Ray picks
on rank 0's node) must be reachable from the other training nodes, and nothing else should reach it (docs/security.md).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

import ray
from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup
from ray.train.torch.config import (
    TorchConfig,
    _set_torch_distributed_env_vars,
    _setup_torch_process_group,
    _TorchBackend,
)

log = logging.getLogger(__name__)

LOOPBACK_INTERFACE = "lo"


def _node_ip() -> str:
    return ray.util.get_node_ip_address()


def _new_store_folder() -> str:
    return tempfile.mkdtemp(prefix="bert-rendezvous-")


def _transport_on_loopback() -> None:
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        os.environ.setdefault(name, LOOPBACK_INTERFACE)


def _remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


class _LocalRendezvousBackend(_TorchBackend):
    """Ray's torch backend, with a file store and loopback transports when every worker is on one node."""

    store_folder: str | None = None

    def on_start(self, worker_group, backend_config: TorchConfig) -> None:
        nodes = set(worker_group.execute(_node_ip))
        if len(nodes) > 1:
            log.info("training group spans %d nodes: torch rendezvous through Ray's TCPStore", len(nodes))
            return super().on_start(worker_group, backend_config)
        backend = backend_config.backend
        if backend is None:  # Ray's own default
            backend = "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo"
        worker_group.execute(_transport_on_loopback)
        self.store_folder = worker_group.execute_single(0, _new_store_folder)
        if not isinstance(worker_group, V1WorkerGroup):  # LOCAL_RANK and friends, as Ray's backend sets them
            worker_group.execute(_set_torch_distributed_env_vars)
        init_method = f"file://{self.store_folder}/store"
        ray.get([worker_group.execute_single_async(rank, _setup_torch_process_group, backend=backend, world_rank=rank,
                                                   world_size=len(worker_group), init_method=init_method,
                                                   timeout_s=backend_config.timeout_s)
                 for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config: TorchConfig) -> None:
        super().on_shutdown(worker_group, backend_config)
        if self.store_folder is not None:
            try:
                worker_group.execute_single(0, _remove, self.store_folder)
            except Exception as e:  # noqa: BLE001 (a dead worker: its node's /tmp keeps an empty folder)
                log.debug("could not remove the rendezvous folder %s: %s", self.store_folder, e)
            self.store_folder = None


@dataclass
class LocalRendezvous(TorchConfig):
    """`TorchConfig` whose single-node groups rendezvous through a private file store, collectives on loopback."""

    @property
    def backend_cls(self):
        return _LocalRendezvousBackend
