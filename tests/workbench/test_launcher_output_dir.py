"""A run's config may refer to `${output_dir}`: the launcher sets it before validating."""

from pathlib import Path

from engine.config import load_config
from workbench import launcher


def test_output_dir_interpolation_validates_and_points_into_the_run_folder(tunebench_home):
    text = "steps: 2\nsamples_path: ${output_dir}/samples.jsonl\n"
    rec = launcher.create_run("lsq", config_text=text, module="lsq_recipe", validate=True)
    written = Path(rec.output_dir) / "config.yaml"
    cfg = load_config(written)
    assert cfg["output_dir"] == rec.output_dir
    assert cfg["samples_path"] == f"{rec.output_dir}/samples.jsonl"
