import os

# One torch thread per test process, and per process a test starts (Celery workers, servers): each xdist
# worker has a core, and on a machine shared by more threads than cores torch's spinning threads make a CPU
# training step several times slower (one step of the real model: 58 s with two threads, 16 s with one, while
# other tests ran). torch reads this when it is first imported, which is after this package is.
os.environ.setdefault("OMP_NUM_THREADS", "1")
