"""Ray, up, and the process settings of its workers: what the dataset build and the trainer's launcher share to
join a cluster or start a local Ray on loopback (``ray_start.py``) and how a worker process allocates (Arrow's pool,
glibc's mmap threshold: ``allocators.py``). Neither the build nor the trainer imports the other for it."""
