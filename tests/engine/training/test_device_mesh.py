"""The parallel degrees: config keys -> ParallelDims, problems in one line, rank coordinates."""

import pytest

from engine.config import ConfigError
from engine.training.device_mesh import MESH_DIMS, ParallelDims, check_parallel_degrees, parallel_dims


def test_defaults_give_every_rank_to_fsdp_shards():
    assert parallel_dims({}, 4) == ParallelDims(dp_replicate=1, dp_shard=4, cp=1, tp=1)
    dims = parallel_dims(
        {"data_parallel_replicate_dim": 2, "context_parallel_dim": 2, "tensor_parallel_dim": 2}, 16
    )
    assert (dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.dp) == (2, 2, 2, 2, 4)


def test_coordinates_follow_the_mesh_order():
    dims = ParallelDims(dp_replicate=2, dp_shard=3, cp=2, tp=2)
    assert MESH_DIMS == ("dp_replicate", "dp_shard", "cp", "tp")
    seen = set()
    for rank in range(dims.world_size):
        c = dims.coordinates(rank)
        assert rank == ((c["dp_replicate"] * 3 + c["dp_shard"]) * 2 + c["cp"]) * 2 + c["tp"]
        seen.add(tuple(c.values()))
        assert dims.dp_rank(rank) == rank // 4  # cp and tp ranks of a group share its batch
    assert len(seen) == dims.world_size


@pytest.mark.parametrize(
    ("cfg", "world", "line"),
    [
        ({"tensor_parallel_dim": 2}, 3,
         "tensor_parallel_dim: data_parallel_replicate_dim=1 x data_parallel_shard_dim=-1 x context_parallel_dim=1 x "
         "tensor_parallel_dim=2 needs a multiple of 2 ranks, but the run has 3 — choose degrees whose product divides "
         "the number of processes"),
        ({"data_parallel_shard_dim": 2, "context_parallel_dim": 2}, 2,
         "context_parallel_dim: data_parallel_replicate_dim=1 x data_parallel_shard_dim=2 x context_parallel_dim=2 x "
         "tensor_parallel_dim=1 = 4 ranks, but the run has 2 — make the product equal the number of processes (or set "
         "data_parallel_shard_dim=-1)"),
        ({"context_parallel_dim": 0}, 2, "context_parallel_dim: must be a positive integer, got 0 — set it to 1 or more"),
        ({"tensor_parallel_dim": -1}, 2,
         "tensor_parallel_dim: -1 (the rest) is only allowed for data_parallel_shard_dim — set it to 1 or more"),
    ],
)  # fmt: skip
def test_problems_are_one_line_naming_the_keys(cfg, world, line):
    problems = check_parallel_degrees(cfg, world)
    assert [str(p) for p in problems] == [line]
    with pytest.raises(ConfigError) as err:
        parallel_dims(cfg, world)
    assert str(err.value) == line and err.value.field == problems[0].field


def test_fitting_degrees_have_no_problems():
    assert check_parallel_degrees({"data_parallel_shard_dim": 1, "data_parallel_replicate_dim": 2}, 2) == []
    assert check_parallel_degrees({"context_parallel_dim": 2, "tensor_parallel_dim": 2}, 8) == []
