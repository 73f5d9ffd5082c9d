"""bert_core tests run tiny models: one intra-op thread avoids OpenMP barrier stalls when the 2 CPUs are shared
(tiny ops are dominated by thread hand-offs, and a descheduled worker stalls every parallel region)."""
import torch

torch.set_num_threads(1)
