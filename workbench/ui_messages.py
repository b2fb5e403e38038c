"""Messages workers post back to the screens and widgets (small dataclasses; posting is thread-safe).

A worker gets its inputs as arguments and answers with one of these; the screen's handler
(`on_<message_name>`) is the only place that changes screen state or widgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


@dataclass
class RunsLoaded(Message):
    """Fresh rows for the runs table (one dict per run, see `workbench.services.run_row`)."""

    rows: list[dict[str, Any]]
    queue: dict[str, Any] | None = None  # `workbench.run_queue.screen_view()`: paused, scheduler, places


@dataclass
class RunDataArrived(Message):
    """New metrics/events/log text of one run since the last poll of a live or compare view."""

    run_id: str
    run: dict[str, Any]
    metrics: dict[str, dict[int, list[tuple[int, float]]]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    log_text: str = ""
    step_times: list[tuple[int, float]] = field(default_factory=list)  # (step, wall time) of rank-0 loss rows
    evals: list[dict[str, Any]] | None = None  # all eval scores (step, task, metric, value); None: unchanged


@dataclass
class WorkFailed(Message):
    """A worker could not do `what` (`load`, `device`, `compare`, `poll`, ...); `text` says why."""

    what: str
    text: str


@dataclass
class RecipeChoicesLoaded(Message):
    """What the Recipe screen starts from: built-in configs `(name, path)`, the first config
    `(text, extra, recipe, name)` or None, the machine (GPU count, device name and memory) and, for a
    clone, the parent's peak memory, entry module and tags."""

    choices: list[tuple[str, str]]
    start: tuple[str, dict, str | None, str | None] | None
    device_count: int
    device: tuple[str, float | None] | None
    parent_peak_gb: float | None = None
    clone_module: str | None = None
    clone_tags: list[str] = field(default_factory=list)


@dataclass
class EstimateReady(Message):
    """The Recipe screen's set-up problems and memory estimate for one edit (`note` instead of an
    estimate when there is none)."""

    problems: list[str]
    estimate: Any = None
    note: str = ""
    mesh: str = ""  # the mesh line (degrees per dimension) shown under the processes


@dataclass
class TimeEstimateReady(Message):
    """The Recipe screen's expected run time for one edit (`note` instead when there is none)."""

    estimate: Any = None  # engine.training.time_estimate.TimeEstimate
    note: str = ""


@dataclass
class ValidationDone(Message):
    """`tunebench validate`'s problems plus the recipe's set-up checks; [] when the config is valid."""

    problems: list[str]


@dataclass
class ConfigExported(Message):
    """The composed YAML was written to `path` (`error` set when it could not be)."""

    path: str
    error: str = ""


@dataclass
class RunLaunched(Message):
    """A run was registered and started (`run_id`), or `error` says why not."""

    run_id: str | None
    error: str = ""


@dataclass
class RunQueued(Message):
    """A run was registered and put in the run queue at `place` (`run_id`), or `error` says why not."""

    run_id: str | None
    place: int = 0
    error: str = ""


@dataclass
class SweepQueued(Message):
    """A sweep's `count` runs were checked, registered and queued (`name`), or `error` (one line) says
    why nothing was."""

    name: str | None
    count: int = 0
    error: str = ""


@dataclass
class RunActionDone(Message):
    """stop / resume / delete / clone of one run finished; `ok` False means `text` is the error."""

    action: str
    text: str
    run_id: str | None
    ok: bool = True


@dataclass
class SamplesLoaded(Message):
    """The GRPO samples of a run (one dict per logged completion), for the Samples screen."""

    rows: list[dict[str, Any]]


@dataclass
class PreviewReady(Message):
    """The Data screen's preview of source `row`: `result` (or `error` when it could not be built)."""

    row: int
    result: Any = None
    error: str = ""


@dataclass
class CompareLoaded(Message):
    """Runs, their metric series and eval scores for the Compare screen."""

    runs: dict[str, dict[str, Any]]  # run id -> run row
    data: dict[str, Any]  # run id -> metric name -> (steps, values) arrays
    evals: dict[str, Any]  # run id -> eval rows
    ranking: dict[str, Any] | None = None  # a sweep's `workbench.sweeps.ranking_rows` (None: not a sweep)


@dataclass
class CardsLoaded(Message):
    """Model cards and the models already downloaded, for the Models screen; `demo` is
    `engine.models.demo_model.demo_status()` (ready, how, path)."""

    cards: Any
    local: Any
    demo: Any = None


@dataclass
class DownloadProgress(Message):
    """Bytes of a download so far (`total` None: unknown)."""

    done: int
    total: int | None


@dataclass
class DownloadDone(Message):
    """A download finished (`ok`) or failed; `text` says which and where."""

    text: str
    ok: bool = True


@dataclass
class FramePrepared(Message):
    """A plot frame built by `MetricPlot`'s worker for curves `series` (cache key `key`); handled by
    the plot itself, which keeps it (it does not bubble to the screen)."""

    bubble = False  # class attribute, not a field: the plot is the only reader

    key: tuple
    series: dict[str, Any]
    frame: Any  # textual.content.Content


@dataclass
class ModelExported(Message):
    """A run's model was written as a GGUF file at `path`, or `error` (one line) says why not."""

    run_id: str
    path: str = ""
    error: str = ""


@dataclass
class ChatModelLoaded(Message):
    """The Playground's column `column` has its model (a `workbench.chat_models.ChatModel`)."""

    column: int
    model: Any


@dataclass
class ChatModelFailed(Message):
    """Column `column`'s model could not be resolved or loaded; `text` is the one line saying why."""

    column: int
    text: str


@dataclass
class ReplyChunk(Message):
    """Text the reply in column `column` grew by (one or a few tokens)."""

    column: int
    text: str


@dataclass
class ReplyDone(Message):
    """Column `column`'s reply ended: its full `text` and a `summary` (tokens, speed, why it ended)."""

    column: int
    text: str
    summary: str


@dataclass
class ReplyFailed(Message):
    """Column `column`'s reply could not be generated; `text` is the one line saying why."""

    column: int
    text: str
