"""``python -m clawhub.devtools.profiled OUT.pstats <uvicorn arguments>``: uvicorn (one worker) with its event
loop under cProfile (CPU time of that thread), the stats written to OUT when it stops. For bench_gateway
--profile; never in production (cProfile roughly doubles the cost of every Python call it sees)."""

import cProfile
import signal
import sys
import time


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    import importlib

    cli = importlib.import_module("uvicorn.main").main  # the click command (uvicorn.main is the function)
    # uvicorn re-raises the SIGTERM it stopped on once it has shut down: end this process through Python then,
    # so the stats are written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # CPU time of the event loop's thread, not wall time: on a shared machine, time spent descheduled would
    # otherwise land on whatever system call the process happened to be in.
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    try:
        cli.main(args=args, standalone_mode=False)
    finally:
        profiler.disable()
        profiler.dump_stats(out)


if __name__ == "__main__":
    main()
