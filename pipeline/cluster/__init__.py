"""Ray, up: what the dataset build and the trainers share to join a cluster or start a local Ray on loopback
(``ray_start.py``). Neither imports the other for it: the trainer reaches no module of the build."""
