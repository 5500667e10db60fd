"""Hot swap: the tier's serving engine, and the swap of its model for another while it serves.

`EngineSwitch` is the Engine the servicer serves from. It hands each request to the engine that
is current when the request starts and counts the requests in flight on each engine. A swap
validates the new model's folder, loads it into a second engine (its own batch scheduler and KV
pool) while the old one keeps serving, then switches by replacing the current engine: requests
in flight finish on the old engine, new ones start on the new. Once the old engine's last stream
has ended (or the tier's drain_grace_s has passed) it is stopped and dropped, which
frees its weights and KV pool.

Knows nothing of gRPC: a swap's phases are plain `SwapRecord`s; refusals are TiermeshErrors
whose status the servicer relays. The caller of a swap may leave: the swap runs as its own task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

from services.common.config import TierConfig
from services.common.errors import InvalidArgument, TiermeshError
from services.common.genai_conventions import model_id
from services.tier.engine import Engine, EngineLoad, GenerationChunk, GenerationRequest
from services.tier.factory import create_engine

log = logging.getLogger(__name__)
MAX_PATH_CHARS = 4096
MAX_DRAIN_TIMEOUT_S = 3600.0
SWAPPABLE_ENGINES = ("torch", "vllm")


class SwapRefused(TiermeshError):
    """The swap cannot be done on this tier, or its load failed; the old model still serves."""

    status = "FAILED_PRECONDITION"


class SwapInProgress(TiermeshError):
    """Another swap is running; retry once it is done."""

    status = "ABORTED"


@dataclass(frozen=True)
class SwapRecord:
    """One swap as it stands (TierAdminService's ModelSwap): see tier.proto for each field."""

    phase: str  # "loading", "switched", "done" or "failed"
    model_path: str
    old_model_id: str
    new_model_id: str = ""
    load_s: float = 0.0
    switch_s: float = 0.0
    drain_s: float = 0.0
    streams_on_old: int = 0
    streams_cut: int = 0
    freed_bytes: int = 0
    started_unix_s: float = 0.0
    error: str = ""


class _Serving:
    """An engine and the requests in flight on it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


class EngineSwitch:
    """The Engine protocol over a current engine that a swap replaces (see the module's doc).

    Every method runs on the tier's event loop. `config` is the tier's: a swapped-in model runs
    with the same limits, pool sizes and device, in the dtype its folder was imported in (else
    the tier's)."""

    def __init__(self, engine: Engine, config: TierConfig) -> None:
        self._config = config
        self._current = _Serving(engine)
        self._retiring: list[_Serving] = []
        self._task: asyncio.Task[None] | None = None
        self._counted_before = (0, 0)  # completed, rejected by engines swapped out and stopped
        self.last_swap: SwapRecord | None = None
        self.name = engine.name  # a swap keeps the engine kind

    @property
    def current(self) -> Engine:
        """The engine new requests go to."""
        return self._current.engine

    @property
    def startup_s(self) -> dict[str, float]:
        """The current engine's start-up phases (the torch engine's `startup_s`), if it has any."""
        phases: dict[str, float] = getattr(self._current.engine, "startup_s", {})
        return phases

    async def start(self) -> None:
        await self._current.engine.start()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """The current engine's stream, counted as in flight on that engine until it ends."""
        serving = self._current
        serving.enter()
        try:
            stream = serving.engine.generate(request)
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for chunk in stream:
                    yield chunk
        finally:
            serving.leave()

    async def abort(self, request_id: str) -> None:
        for serving in (self._current, *self._retiring):
            await serving.engine.abort(request_id)

    def load(self) -> EngineLoad:
        """The current engine's load, with the requests still finishing on a swapped-out engine
        counted as running or queued, and completions and refusals counted since start."""
        load = self._current.engine.load()
        completed, rejected = self._counted_before
        running, queued, queued_batch = load.running, load.queued, load.queued_batch
        paused = load.paused
        for serving in self._retiring:
            old = serving.engine.load()
            running, queued = running + old.running, queued + old.queued
            queued_batch, paused = queued_batch + old.queued_batch, paused + old.paused
            completed, rejected = completed + old.completed, rejected + old.rejected
        return replace(
            load,
            running=running,
            queued=queued,
            queued_batch=queued_batch,
            paused=paused,
            completed=load.completed + completed,
            rejected=load.rejected + rejected,
        )

    def check_health(self) -> None:
        self._current.engine.check_health()

    async def shutdown(self) -> None:
        """Stops a swap under way (its new engine is stopped), then every engine."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for serving in (*self._retiring, self._current):
            await serving.engine.shutdown()

    def begin_swap(
        self, model_path: str, drain_timeout_s: float = 0.0
    ) -> AsyncIterator[SwapRecord]:
        """Checks the request, starts the swap as its own task and returns its records, one per
        phase ("loading", "switched", "done"); the iterator raises what failed the swap. The old
        model's streams get `drain_timeout_s` to finish (0 = the tier's drain_grace_s). Raises
        InvalidArgument (bad path, naming it; a drain timeout out of range), SwapRefused (an
        engine that cannot swap) or SwapInProgress at once."""
        if self._task is not None and not self._task.done():
            running = self.last_swap.model_path if self.last_swap else "?"
            raise SwapInProgress(
                f"tier {self._config.name}: a swap to {running} is in progress; retry when done"
            )
        if self._config.engine not in SWAPPABLE_ENGINES:
            raise SwapRefused(
                f"tier {self._config.name}: the {self._config.engine} engine cannot swap models "
                f"(only {', '.join(SWAPPABLE_ENGINES)}); restart the tier with the new model"
            )
        if not 0 <= drain_timeout_s <= MAX_DRAIN_TIMEOUT_S:  # NaN fails too
            raise InvalidArgument(
                f"drain_timeout_s: must be in [0, {MAX_DRAIN_TIMEOUT_S:g}], got {drain_timeout_s}"
            )
        path = _checked_folder(model_path)
        old_id = model_id(self._config.name, self.current.load().model)
        self.last_swap = SwapRecord("loading", str(path), old_id, started_unix_s=time.time())
        records: asyncio.Queue[SwapRecord | BaseException | None] = asyncio.Queue(maxsize=8)
        drain_s = drain_timeout_s or self._config.drain_grace_s
        self._task = asyncio.get_running_loop().create_task(self._swap(path, drain_s, records))
        return _drain(records)

    def _note(
        self, records: asyncio.Queue[SwapRecord | BaseException | None], **fields: object
    ) -> SwapRecord:
        assert self.last_swap is not None
        self.last_swap = replace(self.last_swap, **fields)  # type: ignore[arg-type]
        records.put_nowait(self.last_swap)
        return self.last_swap

    async def _swap(
        self, path: Path, drain_s: float, records: asyncio.Queue[SwapRecord | BaseException | None]
    ) -> None:
        """Load, switch, drain and free; each phase's record goes to `records` (then None, or
        the error that failed the swap)."""
        try:
            assert self.last_swap is not None
            records.put_nowait(self.last_swap)
            started = time.perf_counter()
            new = await self._load(path)
            loaded = time.perf_counter()
            old = self._current
            self._retiring.append(old)
            self._current = _Serving(new)
            switched = time.perf_counter()
            record = self._note(
                records,
                phase="switched",
                new_model_id=model_id(self._config.name, new.load().model),
                load_s=loaded - started,
                switch_s=switched - loaded,
                streams_on_old=old.in_flight,
            )
            log.info(
                "tier %s: swapped %s -> %s (load %.2f s, switch %.3f ms); %d streams finish on "
                "the old model",
                self._config.name,
                record.old_model_id,
                record.new_model_id,
                record.load_s,
                record.switch_s * 1000,
                record.streams_on_old,
            )
            retire_error = ""
            try:
                cut, freed = await self._retire(old, drain_s)
            except Exception as e:  # the new model serves all the same: the swap is done
                log.exception("tier %s: stopping the old model failed", self._config.name)
                cut, freed = old.in_flight, 0
                retire_error = (
                    f"{record.new_model_id} serves; stopping the old model {record.old_model_id} "
                    f"failed ({type(e).__name__}: {e}), its memory may not be freed"
                )
            del old
            self._note(
                records,
                phase="done",
                drain_s=time.perf_counter() - switched,
                streams_cut=cut,
                freed_bytes=freed,
                error=retire_error,
            )
            records.put_nowait(None)
        except BaseException as e:
            if self.last_swap is not None:  # a failed load is "failed"; later, the phase stays
                failed = "failed" if self.last_swap.phase == "loading" else self.last_swap.phase
                self.last_swap = replace(self.last_swap, phase=failed, error=str(e))
            records.put_nowait(e)
            if not isinstance(e, Exception):
                raise

    async def _load(self, path: Path) -> Engine:
        """A started engine for the model in `path`; on failure, it is stopped and the error
        says the old model still serves."""
        from services.tier.model_loading import ModelFolderError, import_model_code, imported_dtype

        engine: Engine | None = None
        try:
            dtype = imported_dtype(path) or self._config.dtype  # its import record, if any
            engine = create_engine(replace(self._config, model_path=path, dtype=dtype))
            await asyncio.to_thread(import_model_code, path)
            await engine.start()
        except BaseException as e:
            if engine is not None:
                with contextlib.suppress(Exception):
                    await engine.shutdown()
            if not isinstance(e, Exception):
                raise
            serving = self.last_swap.old_model_id if self.last_swap else self._config.name
            why = f"loading {path} failed ({type(e).__name__}: {e}); {serving} keeps serving"
            if isinstance(e, ModelFolderError):
                raise InvalidArgument(f"model_path: {why}") from e
            raise SwapRefused(f"tier {self._config.name}: {why}") from e
        return engine

    async def _retire(self, old: _Serving, drain_s: float) -> tuple[int, int]:
        """Waits for the swapped-out engine `old`'s streams (at most `drain_s`), stops it
        (streams still running end with Unavailable) and frees its memory. Returns the streams
        cut at the limit and the bytes freed. It leaves the retiring list even if its shutdown
        raises, so a later swap never takes it for its own."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                await old.idle.wait()
        cut = old.in_flight
        load = old.engine.load()
        freed = load.weights_bytes + load.kv_pool_bytes
        try:
            await old.engine.shutdown()
        finally:
            self._retiring.remove(old)
            done, refused = self._counted_before
            self._counted_before = (done + load.completed, refused + load.rejected)
        del old, load
        # Reference counting frees the engine, its weights and KV pool here; a full gc.collect()
        # would hold the interpreter for most of a second (a heap of torch and transformers),
        # stalling every stream. On CUDA the freed blocks go back to the device.
        if self._config.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        return cut, freed


async def _drain(
    records: asyncio.Queue[SwapRecord | BaseException | None],
) -> AsyncGenerator[SwapRecord, None]:
    while (item := await records.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        yield item


def _checked_folder(model_path: str) -> Path:
    """`model_path` resolved, once it is a complete model folder; InvalidArgument naming it
    otherwise."""
    from services.tier.model_loading import ModelFolderError, check_model_folder

    if not model_path:
        raise InvalidArgument("model_path: required")
    if len(model_path) > MAX_PATH_CHARS or "\x00" in model_path:
        raise InvalidArgument(
            f"model_path: at most {MAX_PATH_CHARS} characters and no NUL, got {len(model_path)}"
        )
    path = Path(model_path).expanduser().resolve()
    try:
        check_model_folder(path)
    except ModelFolderError as e:
        raise InvalidArgument(f"model_path: {e}") from None
    return path
