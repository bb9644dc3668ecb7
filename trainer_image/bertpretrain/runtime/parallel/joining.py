"""Joining the job's process group: the data parallelism that the job and its launcher call for.

Apart from the interface (:mod:`bertpretrain.runtime.parallel`), which the three ways of running
import, so that the package's ``__init__`` imports none of them and importing one loads only it.
"""

from __future__ import annotations

from bertjob_api.spec import Accelerator, DistributedSpec
from bertpretrain.runtime.devices import open_device
from bertpretrain.runtime.parallel import Alone, DataParallel
from bertpretrain.runtime.world import detect_world


def join(accelerator: Accelerator, tf32: bool = True, spec: DistributedSpec | None = None) -> DataParallel:
    """Set up this rank's device for ``spec.accelerator`` and join the job's process group in the
    way the job and its launcher call for: DeepSpeed (over ``torch.distributed``) under torchrun or
    mpirun when ``spec.deepspeed`` is set and more than one process trains, else Horovod under mpirun
    or horovodrun, ``torch.distributed`` otherwise, nothing for one process (also with DeepSpeed:
    one rank has nothing to shard). ``spec``: ``spec.distributed`` (default: its defaults).

    Raises:
        RuntimeError: see :func:`bertpretrain.runtime.devices.open_device`; mpirun/horovodrun without
            Horovod installed; a rendezvous that failed within ``spec.timeout_seconds``; DeepSpeed
            under mpirun without ``MASTER_ADDR``/``MASTER_PORT``, or not installed.
        ValueError: bad launcher variables (:func:`bertpretrain.runtime.world.detect_world`), or bf16
            gradient compression under Horovod, which has no bf16 compressor.
    """
    spec = spec or DistributedSpec()
    world = detect_world()
    device = open_device(accelerator, world, tf32)
    if spec.deepspeed is not None and world.distributed:
        from bertpretrain.runtime.parallel.deepspeed import DeepSpeedParallel

        return DeepSpeedParallel(world, device, spec)
    if world.uses_horovod:
        from bertpretrain.runtime.parallel.hvd import HorovodParallel

        return HorovodParallel(world, device, spec)
    if world.distributed:
        from bertpretrain.runtime.parallel.ddp import TorchDistributed

        return TorchDistributed(world, device, spec)
    return Alone(world, device)
