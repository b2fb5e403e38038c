"""The one device mesh of a run: its degrees from the config, checked against the world size.

Dimensions, outermost first (a rank's coordinates are `rank = ((r * S + s) * C + c) * T + t`):

    dp_replicate  HSDP replicas (across nodes): parameters replicated, gradients all-reduced
    dp_shard      FSDP2 sharding (within a node): parameters, gradients, optimizer state sharded
    cp            context parallel: each rank holds a slice of every sequence (ring attention)
    tp            tensor parallel (+ sequence and loss parallel): innermost, the fastest links

Config keys: `data_parallel_replicate_dim` (default 1), `data_parallel_shard_dim` (default -1: the
ranks left over), `context_parallel_dim` (default 1), `tensor_parallel_dim` (default 1). Their product
is the world size. Batches are split over the `dp_replicate * dp_shard` data-parallel ranks; the cp
ranks of one data-parallel group share a batch and take one sequence slice each; tp ranks share
their batch and slice. FSDP2 shards over `dp_shard` and `cp` flattened ("dp_shard_cp": cp ranks hold
the same parameters and see different tokens, so their gradients are reduced like data parallel
ones), replicated over `dp_replicate`. Expert parallelism (MoE) borrows ranks of these dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from engine.config import ConfigError, ConfigProblem

MESH_DIMS = ("dp_replicate", "dp_shard", "cp", "tp")
DEGREE_KEYS = {
    "dp_replicate": "data_parallel_replicate_dim",
    "dp_shard": "data_parallel_shard_dim",
    "cp": "context_parallel_dim",
    "tp": "tensor_parallel_dim",
}
# FSDP2's mesh: the replicate dimension and the shard dimension (dp_shard x cp flattened).
FSDP_SHARD_DIM = "dp_shard_cp"


@dataclass(frozen=True)
class ParallelDims:
    """The degree of each mesh dimension (all >= 1; their product is `world_size`)."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: how many different batches one step sees."""
        return self.dp_replicate * self.dp_shard

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each dimension (the mesh is row-major in `MESH_DIMS` order)."""
        out = {}
        for name in reversed(MESH_DIMS):
            size = getattr(self, name)
            out[name] = rank % size
            rank //= size
        return {name: out[name] for name in MESH_DIMS}

    def dp_rank(self, rank: int) -> int:
        """Which data-parallel group (which batch) `rank` belongs to, in `0..dp-1`."""
        c = self.coordinates(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def describe(self) -> str:
        """`dp_replicate=1 x dp_shard=2 x cp=1 x tp=2` (for logs and error lines)."""
        return " x ".join(f"{name}={getattr(self, name)}" for name in MESH_DIMS)


def _degree_problems(cfg: dict, world_size: int) -> tuple[dict[str, int], list[ConfigProblem]]:
    degrees, problems = {}, []
    for name, key in DEGREE_KEYS.items():
        value = cfg.get(key)
        default = -1 if name == "dp_shard" else 1
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
            problems.append(
                ConfigProblem(key, f"must be a positive integer, got {value!r}", "set it to 1 or more")
            )
        elif value == -1 and name != "dp_shard":
            problems.append(
                ConfigProblem(
                    key, "-1 (the rest) is only allowed for data_parallel_shard_dim", "set it to 1 or more"
                )
            )
        else:
            degrees[name] = value
    return degrees, problems


def check_parallel_degrees(cfg: dict, world_size: int) -> list[ConfigProblem]:
    """Problems with the parallel degrees of `cfg` for `world_size` ranks (empty when they fit).

    Pure (no process group): the launcher calls it before a run starts, the recipe when it builds the
    mesh. A product that does not match is one problem naming all four keys (its field is the first
    degree set away from its default, tensor parallel first).
    """
    degrees, problems = _degree_problems(cfg, world_size)
    if problems:
        return problems
    fixed = 1
    for value in degrees.values():
        if value != -1:
            fixed *= value
    named = " x ".join(f"{DEGREE_KEYS[n]}={v}" for n, v in degrees.items())
    set_away = [DEGREE_KEYS[n] for n in ("tp", "cp", "dp_replicate", "dp_shard") if degrees[n] not in (1, -1)]
    field = set_away[0] if set_away else "data_parallel_shard_dim"
    if degrees["dp_shard"] == -1 and world_size % fixed:
        problems.append(
            ConfigProblem(
                field,
                f"{named} needs a multiple of {fixed} ranks, but the run has {world_size}",
                "choose degrees whose product divides the number of processes",
            )
        )
    elif degrees["dp_shard"] != -1 and fixed != world_size:
        problems.append(
            ConfigProblem(
                field,
                f"{named} = {fixed} ranks, but the run has {world_size}",
                "make the product equal the number of processes (or set data_parallel_shard_dim=-1)",
            )
        )
    return problems


def parallel_dims(cfg: dict, world_size: int) -> ParallelDims:
    """The degrees of `cfg` for `world_size` ranks (`data_parallel_shard_dim=-1` resolved).

    Raises:
        ConfigError: the first problem of `check_parallel_degrees`.
    """
    problems = check_parallel_degrees(cfg, world_size)
    if problems:
        raise ConfigError.from_problem(problems[0])
    degrees, _ = _degree_problems(cfg, world_size)
    if degrees["dp_shard"] == -1:
        rest = degrees["dp_replicate"] * degrees["cp"] * degrees["tp"]
        degrees["dp_shard"] = world_size // rest
    return ParallelDims(**degrees)


def build_device_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """The 4-D mesh `MESH_DIMS` (every dimension present, size 1 when unused) for a started process group.

    Sub-meshes: `mesh["tp"]`, `mesh["cp"]`, `fsdp_mesh(mesh)`.
    """
    shape = tuple(getattr(dims, name) for name in MESH_DIMS)
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


def mesh_dims(mesh: DeviceMesh) -> ParallelDims:
    """The degrees of a mesh from `build_device_mesh` (a missing dimension counts as 1)."""
    names = mesh.mesh_dim_names or ()
    return ParallelDims(**{name: mesh.size(names.index(name)) if name in names else 1 for name in MESH_DIMS})


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """FSDP2's mesh: `("dp_replicate", "dp_shard_cp")`, 2-D (HSDP) when dp_replicate > 1, else 1-D.

    With cp > 1 the shard dimension is dp_shard and cp flattened (DeviceMesh's `_flatten`, probed
    lazily: without it a cp > 1 run is refused in one line).
    """
    dims = mesh_dims(mesh)
    if dims.cp == 1:
        shard = mesh["dp_shard"]
        if dims.dp_replicate == 1:
            return shard
        return mesh["dp_replicate", "dp_shard"]
    flatten = getattr(mesh["dp_shard", "cp"], "_flatten", None)
    if flatten is None:
        raise ConfigError(
            "this torch cannot flatten mesh dimensions (FSDP over dp_shard x cp)",
            hint="set context_parallel_dim=1",
            field="context_parallel_dim",
        )
    flatten(FSDP_SHARD_DIM)
    if dims.dp_replicate == 1:
        return mesh[FSDP_SHARD_DIM]
    return mesh["dp_replicate", FSDP_SHARD_DIM]
