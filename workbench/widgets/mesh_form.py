"""The Recipe screen's multi-node part: nodes, each parallel degree, and (several nodes) where the
nodes meet and the folder they share; shows the DeviceMesh the run would build.

The degrees are config keys (`engine.training.device_mesh.DEGREE_KEYS`: data_parallel_replicate_dim,
context_parallel_dim, tensor_parallel_dim; data_parallel_shard_dim stays -1, the ranks left over), so
the form turns them into overrides; nodes, rendezvous and shared folder are launch options
(`workbench.launcher.create_run(nnodes=, rdzv_endpoint=, output_dir=)`). Posts `MeshForm.Changed`.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Label, Static

# (config key, label, what it does) of the degrees the form offers, in the mesh's order
DEGREES = (
    ("data_parallel_replicate_dim", "replicas (HSDP)", "full copies of the FSDP shards, e.g. one per node"),
    ("context_parallel_dim", "context parallel", "ranks that split each sequence (long contexts)"),
    ("tensor_parallel_dim", "tensor parallel", "ranks that split every linear weight (within a node)"),
)


class MeshForm(Vertical):
    """Nodes / parallel degrees / rendezvous / shared folder, and the mesh line."""

    DEFAULT_CSS = """
    MeshForm { height: auto; }
    MeshForm #mesh-line { color: $text-muted; }
    """

    class Changed(Message):
        """A field of the form changed."""

        def __init__(self, form: MeshForm) -> None:
            super().__init__()
            self.form = form

    def compose(self) -> ComposeResult:
        with Horizontal(classes="knob"):
            yield Label("nodes")
            yield Input(
                "1", id="mesh-nnodes", type="integer", compact=True, tooltip="machines; processes is per node"
            )
        for key, label, effect in DEGREES:
            with Horizontal(classes="knob"):
                yield Label(label)
                yield Input("1", id=f"mesh-{key}", type="integer", compact=True, tooltip=f"{key}: {effect}")
        with Horizontal(classes="knob"):
            yield Label("rendezvous")
            yield Input(placeholder="HOST:PORT of node 0 (several nodes)", id="mesh-rdzv", compact=True)
        with Horizontal(classes="knob"):
            yield Label("shared folder")
            yield Input(
                placeholder="run folder every node mounts (several nodes)", id="mesh-shared", compact=True
            )
        yield Static("", id="mesh-line")

    def load(self, cfg: dict) -> None:
        """Show the config's degrees (without posting `Changed`)."""
        with self.prevent(Input.Changed):
            for key, _, _ in DEGREES:
                value = cfg.get(key, 1)
                self.query_one(f"#mesh-{key}", Input).value = str(value if isinstance(value, int) else 1)

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(self))

    def _int(self, wid: str) -> int | None:
        text = self.query_one(f"#{wid}", Input).value.strip()
        return int(text) if text.isdigit() and int(text) >= 1 else None

    @property
    def nnodes(self) -> int:
        return self._int("mesh-nnodes") or 1

    def overrides(self, cfg: dict) -> list[str]:
        """`key=value` for each degree the form sets away from the config's value."""
        out = []
        for key, _, _ in DEGREES:
            value = self._int(f"mesh-{key}")
            if value is not None and value != cfg.get(key, 1):
                out.append(f"{key}={value}")
        return out

    def launch_options(self) -> dict:
        """`nnodes`, `rdzv_endpoint`, `output_dir` for `workbench.launcher.create_run`."""
        if self.nnodes == 1:
            return {"nnodes": 1}
        return {
            "nnodes": self.nnodes,
            "rdzv_endpoint": self.query_one("#mesh-rdzv", Input).value.strip() or None,
            "output_dir": self.query_one("#mesh-shared", Input).value.strip() or None,
        }

    def problems(self) -> list[str]:
        """What blocks a launch: a field that is not a positive integer, a multi-node run without its
        rendezvous or shared folder (the launcher's own lines)."""
        from workbench.errors import UserError
        from workbench.multinode_launch import check_launch

        out = []
        for wid, label in [("mesh-nnodes", "nodes")] + [(f"mesh-{k}", label) for k, label, _ in DEGREES]:
            if self._int(wid) is None:
                out.append(f"{label}: {self.query_one(f'#{wid}', Input).value or 'empty'} — use 1 or more")
        if not out and self.nnodes > 1:
            try:
                check_launch(
                    node_rank=0, **{"rdzv_endpoint": None, "output_dir": None, **self.launch_options()}
                )
            except UserError as exc:
                out.append(str(exc))
        return out

    def show_mesh(self, line: str) -> None:
        for box in self.query("#mesh-line"):  # none once the screen has closed (a late worker)
            box.update(line)


def mesh_line(cfg: dict, nproc: int, nnodes: int) -> str:
    """`mesh dp_replicate=2 x dp_shard=4 x cp=1 x tp=1 (2 nodes x 4 processes = 8 ranks)`, or the
    config's problem with its degrees for that world size (one line naming the keys)."""
    from engine.config import ConfigError
    from engine.training.device_mesh import parallel_dims

    world = nproc * nnodes
    where = f"{nnodes} node(s) x {nproc} process(es) = {world} rank(s)"
    try:
        dims = parallel_dims(cfg, world)
    except ConfigError as exc:
        return f"mesh: {exc} ({where})"
    return f"mesh {dims.describe()} ({where})"
