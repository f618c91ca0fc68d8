"""Run ``speculators train`` on a CPU-only host (a script run in the speculators venv).

speculators 0.9.0 assumes an accelerator: its trainer moves the model and every batch to the
integer local rank, autocasts on ``cuda`` and calls ``torch.accelerator.synchronize()``. With
no CUDA device this script points the trainer at the CPU device, makes ``synchronize`` a no-op,
and adds the flags the CPU needs (``--draft-attn-impl sdpa``: FlexAttention has no CPU
backward; ``--loss-implementation eager``: the fused loss needs Triton;
``--hidden-states-dtype float32``: no bf16 autocast on CPU) unless given. With CUDA it changes
nothing. Then it calls speculators' own CLI entry point with the remaining arguments:

    python cpu_train.py train --verifier-name-or-path DIR --data-path DIR ...

(see ../shared/notes/eagle3.md). The gateway never imports this file.
"""

from __future__ import annotations

import sys
from typing import Any

#: Flags added on CPU, each unless the caller gave it.
CPU_FLAGS: tuple[tuple[str, str], ...] = (
    ("--draft-attn-impl", "sdpa"),
    ("--loss-implementation", "eager"),
    ("--hidden-states-dtype", "float32"),
)


def cpu_argv(argv: list[str]) -> list[str]:
    """``argv`` plus each of :data:`CPU_FLAGS` it does not set (``--flag v`` or ``--flag=v``)."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    extra = [x for flag, value in CPU_FLAGS if flag not in given for x in (flag, value)]
    return [*argv, *extra]


def patch_for_cpu() -> None:
    """Point speculators' trainer at the CPU and neutralise accelerator synchronisation."""
    import torch
    from speculators.train import trainer

    cpu = torch.device("cpu")
    torch.accelerator.synchronize = lambda *args, **kwargs: None
    # Trainer.__init__ reads get_local_rank() and moves the model there (setup_model), and
    # every batch later: the CPU device instead of the integer rank.
    trainer.get_local_rank = lambda: cpu
    original_init = trainer.Trainer.__init__

    def init_on_cpu(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"  # torch.autocast(self.device_type, ...) while training

    trainer.Trainer.__init__ = init_on_cpu


def main(argv: list[str] | None = None) -> int:
    """Patch when there is no CUDA device, then run ``speculators`` with ``argv``."""
    import torch

    args = list(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        patch_for_cpu()
        if args[:1] == ["train"]:
            args = cpu_argv(args)
        print(f"cpu_train: no CUDA device; speculators {' '.join(args)}", file=sys.stderr)
    from speculators.cli import app

    app(args=args, prog_name="speculators", standalone_mode=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
