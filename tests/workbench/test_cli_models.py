"""`tunebench generate`, `tunebench models` and `tunebench download` through `workbench.cli.main`."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from workbench.cli import main

transformers = pytest.importorskip("transformers")

TEXT = "the cat sat on the mat. the dog sat on the log. a cat and a dog sat.\n"
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A HF folder: a tiny random Llama (transformers) and a real byte-level BPE trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("tiny_model")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 10, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": TEMPLATE})
    )
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    return folder, model, tok


def _reference(model, tok, ids, n):
    x = torch.tensor([ids])
    out = model.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, eos_token_id=2
    )
    completion = out[0, len(ids) :].tolist()
    return tok.decode(completion, skip_special_tokens=True)


def test_generate_plain_prompt_equals_transformers(tiny_dir, capsys, tunebench_home):
    folder, model, tok = tiny_dir
    assert main(["generate", str(folder), "the cat", "--max-new-tokens", "12"]) == 0
    captured = capsys.readouterr()
    assert captured.out.rstrip("\n") == _reference(model, tok, tok.encode("the cat").ids, 12)
    assert "prompt +" in captured.err and "tok/s" in captured.err


def test_generate_chat_uses_the_template(tiny_dir, capsys, tunebench_home):
    folder, model, tok = tiny_dir
    rc = main(["generate", str(folder), "a dog", "--chat", "--system", "be short", "--max-new-tokens", "8"])
    assert rc == 0
    rendered = (
        "<|im_start|>system\nbe short<|im_end|>\n<|im_start|>user\na dog<|im_end|>\n<|im_start|>assistant\n"
    )
    assert capsys.readouterr().out.rstrip("\n") == _reference(model, tok, tok.encode(rendered).ids, 8)


def test_generate_in_bf16_on_cpu_takes_the_fp32_matmul_path_with_the_native_result(
    tiny_dir, capsys, tunebench_home, monkeypatch
):
    """On a CPU without bf16 instructions bf16 matmuls run in fp32 and round to bf16; greedy decoding
    gives the native bf16 kernels' tokens (TUNEBENCH_CPU_BF16_MATMUL=native), and the stats line says so."""
    folder, _, _ = tiny_dir
    argv = ["generate", str(folder), "the cat", "--max-new-tokens", "12", "--dtype", "bfloat16"]
    outputs = {}
    for choice in ("fp32", "native"):
        monkeypatch.setenv("TUNEBENCH_CPU_BF16_MATMUL", choice)
        assert main(argv) == 0
        captured = capsys.readouterr()
        assert ("bf16 matmuls in fp32 on this CPU" in captured.err) == (choice == "fp32"), captured.err
        outputs[choice] = captured.out
    assert outputs["fp32"] == outputs["native"] and outputs["fp32"].strip()


def test_generate_sampling_is_seeded(tiny_dir, capsys, tunebench_home):
    folder, _, _ = tiny_dir
    argv = [
        "generate",
        str(folder),
        "the",
        "--temperature",
        "1.0",
        "--top-p",
        "0.9",
        "--seed",
        "3",
        "--max-new-tokens",
        "10",
    ]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first


def test_generate_from_a_run_picks_latest_checkpoint(tiny_dir, capsys, tunebench_home):
    folder, model, tok = tiny_dir
    run = tunebench_home / "runs" / "run-7"
    shutil.copytree(folder, run / "checkpoints" / "step_10")
    (run / "checkpoints" / "step_2").mkdir()  # no config.json: not a loadable checkpoint
    assert main(["generate", "run-7", "the dog", "--max-new-tokens", "5"]) == 0
    captured = capsys.readouterr()
    assert "step_10" in captured.err
    assert captured.out.rstrip("\n") == _reference(model, tok, tok.encode("the dog").ids, 5)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["generate", "/no/such/model", "hi"], "MODEL '/no/such/model'"),
        (["generate", "MODEL_DIR", "hi", "--top-p", "1.5"], "--top-p 1.5"),
        (["generate", "MODEL_DIR", "hi", "--max-new-tokens", "0"], "--max-new-tokens 0"),
        (["generate", "MODEL_DIR", "hi", "--system", "x"], "--system"),
        (["generate", "MODEL_DIR", "hi", "--max-new-tokens", "1000"], "exceeds the model's context of 256"),
        (["generate", "EMPTY_DIR", "hi"], "no config.json"),
        (["download", "not a repo"], "ORG/NAME"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny_dir, capsys, tunebench_home, tmp_path, argv, needle):
    (tmp_path / "empty").mkdir()
    argv = [
        str(tiny_dir[0]) if a == "MODEL_DIR" else str(tmp_path / "empty") if a == "EMPTY_DIR" else a
        for a in argv
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_download_offline_is_one_line(capsys, tunebench_home, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: connection refused
    assert (
        main(["download", "HuggingFaceTB/SmolLM2-135M-Instruct", "--output-dir", str(tunebench_home / "dl")])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach the Hugging Face Hub" in err[0]


def test_models_lists_presets_and_local_folders(tiny_dir, capsys, tunebench_home, tmp_path, monkeypatch):
    folder, _, _ = tiny_dir
    shutil.copytree(folder, tunebench_home / "models" / "my-tiny")
    (tunebench_home / "models" / "not-a-model").mkdir()
    cache = tmp_path / "hfcache"
    snapshot = cache / "models--Org--Cached-1B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert main(["models", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {c["name"] for c in data["presets"]}
    assert {"smollm2_135m", "llama3_2_1b", "qwen3_0_6b"} <= names and "llama3_tiny" not in names
    local = {m["name"]: m for m in data["local"]}
    assert (
        local["my-tiny"]["source"] == "tunebench" and local["my-tiny"]["architecture"] == "LlamaForCausalLM"
    )
    assert local["my-tiny"]["size_bytes"] == (folder / "model.safetensors").stat().st_size
    assert local["Org/Cached-1B"]["source"] == "hf-cache" and local["Org/Cached-1B"]["has_tokenizer"] is False
    assert "not-a-model" not in local
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    assert "smollm2_135m" in table and "my-tiny" in table and "Org/Cached-1B" in table
    # A local model name works as MODEL for generate.
    assert main(["generate", "my-tiny", "the", "--max-new-tokens", "3"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("model", ["demo", "GGUF_FILE"])
def test_generate_demo_answers_paris(capsys, tunebench_home, model):
    from engine.config import ConfigError
    from engine.models.demo_model import demo_gguf_path

    try:
        gguf = demo_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    model = str(gguf) if model == "GGUF_FILE" else model  # a .gguf path is converted once, like the demo
    assert (
        main(["generate", model, "What is the capital of France?", "--chat", "--max-new-tokens", "24"]) == 0
    )
    assert "Paris" in capsys.readouterr().out


def test_stream_writes_the_completion_once(tiny_dir, capsys):
    from engine.data.tokenizers import load_tokenizer
    from engine.generation import generate
    from engine.models import from_pretrained
    from workbench.commands.generate import _Stream

    folder, _, _ = tiny_dir
    tok = load_tokenizer(folder)
    stream = _Stream(tok)
    out = generate(
        from_pretrained(folder), [tok.encode("the cat", add_eos=False)], max_new_tokens=12, on_step=stream
    )
    text = tok.decode(out.completions[0])
    stream.finish(text)
    assert capsys.readouterr().out == text + "\n"


def test_download_writes_into_the_registry(capsys, tunebench_home, monkeypatch, tiny_dir):
    """The Hub is unreachable here, so `snapshot_download` is replaced by a stand-in that copies a model
    folder where it is asked to; the test checks what the command asks for and where the model lands."""
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, *, local_dir, allow_patterns, revision=None, endpoint=None):
        calls.append((repo_id, revision, allow_patterns))
        shutil.copytree(tiny_dir[0], local_dir, dirs_exist_ok=True)  # a resumed download adds to the folder
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert main(["download", "Org/Tiny-Model", "--revision", "v1"]) == 0
    target = tunebench_home / "models" / "Org--Tiny-Model"
    assert (target / "config.json").is_file()
    repo_id, revision, patterns = calls[0]
    assert (repo_id, revision) == ("Org/Tiny-Model", "v1")
    assert "*.safetensors" in patterns and "*.bin" not in patterns  # no duplicate pickle weights
    capsys.readouterr()
    assert main(["models", "--local", "--json"]) == 0
    local = {m["name"]: m for m in json.loads(capsys.readouterr().out)["local"]}
    assert local["Org--Tiny-Model"]["path"] == str(target)
    assert main(["generate", "Org--Tiny-Model", "the", "--max-new-tokens", "2"]) == 0


@pytest.mark.parametrize(
    ("error", "needle"), [("GatedRepoError", "gated repository"), ("RepositoryNotFoundError", "not found")]
)
def test_download_hub_refusals_are_one_line(capsys, tunebench_home, monkeypatch, error, needle):
    import importlib

    import huggingface_hub
    from huggingface_hub import errors

    http = importlib.import_module(errors.Response.__module__.split(".")[0])  # the HTTP library the Hub uses

    def refuse(repo_id, **kwargs):
        request = http.Request("GET", f"https://huggingface.co/api/models/{repo_id}")
        raise getattr(errors, error)("refused", response=errors.Response(401, request=request))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    assert main(["download", "Org/Private"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "HF_TOKEN" in err[0]
