"""What the benchmarks' orchestrators share about the processes they start."""

from __future__ import annotations

import asyncio


async def stop_process(process: asyncio.subprocess.Process, *, grace: float, kill: bool = False) -> None:
    """End ``process``: SIGTERM (SIGKILL with ``kill``), then SIGKILL if it has not exited within ``grace`` s."""
    if process.returncode is None:
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
    await process.wait()
