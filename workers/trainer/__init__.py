"""The Django-free trainer. Read in this order:

backend.py     the interface every backend implements, and its plain data (TrainSample, TrainConfig, ...)
losses.py      Binary RL / OPD / Combine advantages, the clipped surrogate, the k3 KL term
batching.py    chat template, response alignment with the recorded tokens, masks, padding, the hinted context
hints.py       overlap-guided choice among several hints
forward.py     the model side: device and dtype, loading a base, response log-probs by chunks, sampling
local.py       LocalBackend: torch + peft LoRA updates, checkpoints, export, on-policy sampling
local_update.py  its train() maths: the batch prepared once, then micro-batched optimizer steps
checkpoint.py  crash-safe checkpoints in a run's workdir
bench.py       update-step throughput (python manage.py bench_trainer)
bench_tenants.py  tenant updates per hour, three ways (bench_trainer --tenants)
measure.py     what the benchmarks measure with: a Qwen3-4B-shaped model, model FLOPs, peak memory
remote/        the Tinker and Fireworks backends
"""
