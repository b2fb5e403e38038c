"""Run under torchrun by test_preference_ranks.py: the DPO recipe on each config of a JSON list, one after
the other in one process group, then KTO's global mismatched rows on rows of different widths.

Rank 0 prints `OK <json>`: `{"histories": [each run's step metrics], "kl_rows": [[tokens, labels] of every
rank's share, in rank order]}`. Any error ends the ranks with code 1.
"""

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist


def _kl_rows(rank: int, world: int) -> list:
    """Every rank's share of `global_mismatched_pairs` on 3 rows per rank of different widths."""
    from engine.modules.loss.kto_loss import global_mismatched_pairs
    from tests.engine.recipes.test_preference_ranks import ragged_rows

    tokens, labels = ragged_rows()  # the global batch, [3W, S]; rank r holds rows r, r+W, ...
    mine_t, mine_l = tokens[rank::world], labels[rank::world]
    width = int((mine_l != -100).nonzero()[:, 1].max()) + 2  # this rank's own (narrower) width
    kl_t, kl_l = global_mismatched_pairs([(mine_t[:, :width], mine_l[:, :width])], pad_id=0)
    shares = [None] * world
    dist.all_gather_object(shares, [kl_t.tolist(), kl_l.tolist()])
    return shares


def main(path: str) -> None:
    from engine.recipes.dpo import DPORecipe, check_config
    from engine.training import init_distributed, shutdown

    torch.set_num_threads(1)
    info = init_distributed()
    code = 0
    try:
        histories = []
        for cfg in json.loads(Path(path).read_text()):
            check_config(cfg)
            recipe = DPORecipe(cfg, dist_info=info)
            try:
                recipe.setup()
                recipe.train()
            finally:
                recipe.cleanup()
            histories.append(recipe.history)
        kl_rows = _kl_rows(info.rank, info.world_size)
        if info.rank == 0:
            print("OK " + json.dumps({"histories": histories, "kl_rows": kl_rows}), flush=True)
    except Exception:
        traceback.print_exc()
        code = 1
    shutdown(code)


if __name__ == "__main__":
    main(sys.argv[1])
