"""The runner's heartbeat: renews its lease on the cascade from a thread, every `heartbeat_s`,
whatever the step is doing. A renewal that finds the lease taken over (the runner was
presumed dead) sets `lost`: the loop stops at its next step boundary without writing another
row. A database that does not answer is retried; the lease simply ages meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cascade.runner.run_store import RunStore


class LeaseKeeper:
    def __init__(
        self, store: RunStore, token: str, *, heartbeat_s: float, expiry_s: float, log: Callable[[str], None]
    ) -> None:
        self.store, self.token = store, token
        self.heartbeat_s, self.expiry_s = heartbeat_s, expiry_s
        self.log = log
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _beat(self) -> None:
        failing = False
        while not self._stop.wait(self.heartbeat_s):
            try:
                held = self.store.renew_lease(self.token, self.expiry_s)
            except Exception as err:  # the database restarting: try again next beat
                if not failing:
                    self.log(
                        f"lease heartbeat failed ({type(err).__name__}); retrying every {self.heartbeat_s:g}s"
                    )
                failing = True
                continue
            if failing:
                self.log("lease heartbeat back")
                failing = False
            if not held:
                self.log("lease lost: another runner took this cascade over; stopping at the step boundary")
                self.lost.set()
                return

    def stop(self, *, release: bool) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if release and not self.lost.is_set():
            try:
                self.store.release_lease(self.token)
            except Exception as err:  # it will expire on its own
                self.log(f"could not release the lease ({type(err).__name__}); it expires by itself")
