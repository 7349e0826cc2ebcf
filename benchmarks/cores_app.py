"""The handlers of benchmarks/cores.py: CPU-bound `def` handlers doing a fixed amount of
pure-Python work (the job's payload says how many loop turns), so that two processes or two
threads doing the same jobs do the same work whatever the clocks say."""

import sepp

router = sepp.Router()


@router.handler("burn")
def burn(payload: dict[str, int], ctx: sepp.JobContext) -> None:
    total = 0
    for i in range(payload["turns"]):
        total += i * i % 7
