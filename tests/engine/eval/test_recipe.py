"""The eval recipe (scores into the tracker and a results file, config errors as one line) and LoRA
checkpoints: a PEFT adapter folder scores exactly like the merged model `save_pretrained` writes."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lm_eval")

from engine.config import ConfigError  # noqa: E402
from engine.eval import EvalError, TunebenchLM, evaluate  # noqa: E402
from engine.recipes.eval import EvalRecipe, recipe_main  # noqa: E402


def _ll_requests(n=6):
    from lm_eval.api.instance import Instance

    pairs = [("Question: what is 3 plus 4?\nAnswer:", f" {i}") for i in range(n)]
    return [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]


def test_lora_adapter_folder_scores_like_merged_model(tiny_llama_dir, tmp_path):
    from engine.checkpoint import save_pretrained
    from engine.checkpoint.peft import save_adapters
    from engine.models import from_pretrained
    from engine.models._decoder_builder import LoRASettings

    lora = LoRASettings(
        lora_attn_modules=("q_proj", "v_proj"), apply_lora_to_mlp=True, lora_rank=4, lora_alpha=8.0
    )
    model = from_pretrained(tiny_llama_dir, dtype=torch.float32, lora=lora)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.3)  # adapters that change the scores
    save_adapters(model, tmp_path / "adapters", base_model_dir=tiny_llama_dir)
    save_pretrained(model, tmp_path / "merged", like=tiny_llama_dir)
    requests = _ll_requests()
    via_adapters = TunebenchLM(pretrained=tmp_path / "adapters").loglikelihood(requests, disable_tqdm=True)
    via_merged = TunebenchLM(pretrained=tmp_path / "merged").loglikelihood(requests, disable_tqdm=True)
    base = TunebenchLM(pretrained=tiny_llama_dir).loglikelihood(requests, disable_tqdm=True)
    torch.testing.assert_close(
        torch.tensor([s for s, _ in via_adapters]),
        torch.tensor([s for s, _ in via_merged]),
        rtol=0,
        atol=1e-4,
    )
    assert max(abs(a - b) for (a, _), (b, _) in zip(via_adapters, base)) > 0.1  # the adapters matter


def test_recipe_stores_scores_with_run_and_writes_results(tiny_llama_dir, tunebench_home, tmp_path):
    from engine.tracking.db import open_db
    from engine.tracking.readers import eval_results, events_since
    from engine.tracking.run_rows import create_run

    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="evalme")
    cfg = {
        "model_dir": tiny_llama_dir,
        "tasks": ["arith_mc"],
        "limit": 5,
        "batch_size": 4,
        "run": "evalme",
        "step": 7,
        "output_dir": str(tmp_path / "out"),
    }
    report = EvalRecipe(cfg).run()
    with open_db(create=False) as db:
        rows = eval_results(rec.id, db=db)
        events = events_since(rec.id, db=db)
    got = {(r.step, r.task, r.metric): r.value for r in rows}
    want = {(7, s.task, s.metric): s.value for s in report.scores}
    assert got == want and (7, "arith_mc", "acc") in got
    assert {r.checkpoint for r in rows} == {tiny_llama_dir}
    assert events[-1].kind == "eval" and "arith_mc acc" in events[-1].text
    saved = json.loads((tmp_path / "out" / "eval" / "step_7.json").read_text())
    assert saved["results"]["arith_mc"]["acc,none"] == got[(7, "arith_mc", "acc")]


@pytest.mark.parametrize(
    "change, field",
    [
        ({"taks": ["arith_mc"]}, "taks"),
        ({"tasks": []}, "tasks"),
        ({"batch_size": 0}, "batch_size"),
        ({"limit": -1}, "limit"),
        ({"dtype": "int8"}, "dtype"),
    ],
)
def test_bad_config_names_the_field(change, field, tiny_llama_dir):
    cfg = {"model_dir": tiny_llama_dir, "tasks": ["arith_mc"], **change}
    if "taks" in change:
        del cfg["tasks"]
    with pytest.raises(ConfigError) as err:
        EvalRecipe(cfg)
    assert err.value.field == field and "\n" not in str(err.value)


@pytest.mark.slow  # indexing lm-eval's ~15k task files takes ~30 s
def test_unknown_task_is_one_line(tiny_llama_dir):
    with pytest.raises(EvalError, match="unknown task 'no_such_task_xyz'"):
        evaluate(TunebenchLM(pretrained=tiny_llama_dir), "no_such_task_xyz")


def test_missing_data_and_bad_model_args_are_one_line(tiny_llama_dir, tmp_path):
    lm = TunebenchLM(pretrained=tiny_llama_dir)
    task = tmp_path / "mine.yaml"
    task.write_text("task: mine\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: gone.jsonl\n")
    with pytest.raises(EvalError, match="gone.jsonl does not exist"):
        evaluate(lm, str(task))
    with pytest.raises(EvalError, match="model_args: unknown argument"):
        TunebenchLM(pretrained=tiny_llama_dir, temprature=0.5)


def test_recipe_main_exit_codes(tiny_llama_dir, tmp_path, capsys, tunebench_home):
    config = tmp_path / "eval.yaml"
    config.write_text(f"model_dir: {tiny_llama_dir}\ntasks: [arith_mc]\nlimit: 2\nbatch_size: 4\n")
    assert recipe_main(["--config", str(config)]) == 0
    assert "arith_mc\tacc\t" in capsys.readouterr().out
    assert recipe_main(["--config", str(config), f"model_dir={tmp_path / 'nothing'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eval: ") and "not a model folder" in err[0]


def test_registered_for_lm_eval_model_args(tiny_llama_dir):
    """`--model tunebench --model_args pretrained=DIR,...` builds our model (lm-eval passes text)."""
    from lm_eval.api.registry import get_model

    lm = get_model("tunebench").create_from_arg_string(
        f"pretrained={tiny_llama_dir},max_gen_toks=16,add_bos_token=false",
        {"batch_size": "4", "max_batch_size": None, "device": None},
    )
    assert isinstance(lm, TunebenchLM)
    assert (lm.batch_size, lm.max_gen_toks, lm.add_bos_token) == (4, 16, False)
    assert lm.tok_encode("hi") == lm.tok.encode("hi", add_bos=False, add_eos=False)


def test_qlora_adapters_evaluate_on_nf4_base(tiny_llama_dir, tmp_path):
    """`quantize_base=True` scores adapters on the NF4 base they were trained on: equal to the QLoRA
    model itself, and not the same as on the full-precision base."""
    from engine.checkpoint.peft import save_adapters
    from engine.models import from_pretrained
    from engine.models._decoder_builder import LoRASettings

    lora = LoRASettings(
        lora_attn_modules=("q_proj", "v_proj"), lora_rank=4, lora_alpha=8.0, quantize_base=True
    )
    qlora = from_pretrained(tiny_llama_dir, dtype=torch.float32, lora=lora)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in qlora.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.3)
    save_adapters(qlora, tmp_path / "adapters", base_model_dir=tiny_llama_dir)
    requests = _ll_requests(4)
    from engine.data.tokenizers import load_tokenizer

    reference = TunebenchLM(model=qlora, tokenizer=load_tokenizer(tiny_llama_dir)).loglikelihood(
        requests, disable_tqdm=True
    )
    on_nf4 = TunebenchLM(pretrained=tmp_path / "adapters", quantize_base=True).loglikelihood(
        requests, disable_tqdm=True
    )
    on_fp32 = TunebenchLM(pretrained=tmp_path / "adapters").loglikelihood(requests, disable_tqdm=True)
    torch.testing.assert_close(
        torch.tensor([s for s, _ in on_nf4]), torch.tensor([s for s, _ in reference]), rtol=0, atol=1e-4
    )
    assert max(abs(a - b) for (a, _), (b, _) in zip(on_nf4, on_fp32)) > 1e-3


def test_run_config_tells_qlora():
    from workbench.commands.evaluate import trained_with_nf4_base

    assert trained_with_nf4_base(
        "model:\n  _component_: engine.models.qwen3.lora_qwen3\n  quantize_base: true\n"
    )
    assert trained_with_nf4_base("model:\n  _component_: engine.models.smollm2.qlora_smollm2_135m\n")
    assert not trained_with_nf4_base(
        "model:\n  _component_: engine.models.qwen3.lora_qwen3\n  lora_rank: 8\n"
    )
    assert not trained_with_nf4_base("not: [valid")
