"""What a pretraining run needs before its ranks start, read from the config as the run reads it (its YAML with
the command line's key=value overrides), not from the file's text: `launch/pretrain.sh` runs each step printed.

    python -m pretrain.prepare --config launch/configs/demo.yaml [key=value ...]     # one step per line

Steps, in the order they must run:
- `demo`: the embedded demo corpus (`python -m shards.demo`: built when missing), when any path the config
  names lies under data/demo/.
- `warmup <detector config>`: the detector warm-up (`python -m pretrain.detector`) whose output is
  `model.fast_rcnn.weights`, when that file is missing; the warm-ups are the `launch/configs/detector_*.yaml`.
- `features <caption shards> <out>`: the demo's precomputed region features (`python -m pretrain.features`),
  when `data.caption_shards` reads them and they are missing or older than the caption shards they come from.
The launcher's own flags (--resume, --overwrite, --skip-batches) are accepted and change nothing here.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from model.config import ConfigError, load_config
from train.engine import entry_point, run_overrides
from train.run import command_line

from .config import PretrainConfig
from .detector import DetectorConfig
from .run import PretrainTask

DEMO = "data/demo/"
FEATURES = Path("data/demo/shards/features-train")
CAPTIONS = Path("data/demo/shards/captions-train")
WARMUPS = "launch/configs/detector_*.yaml"


def strings(value) -> list[str]:
    """Every string in a nested config (dicts and lists as `asdict` gives them)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings(v)]
    return []


def warmup_for(weights: str, configs: list[Path]) -> Path | None:
    """The detector warm-up config whose output (`<engine.run_dir>/fast_rcnn.pt`) is `weights`."""
    target = Path(weights).resolve()
    for path in configs:
        cfg = load_config(DetectorConfig, str(path), [])
        if (Path(cfg.engine.run_dir) / "fast_rcnn.pt").resolve() == target:
            return path
    return None


def steps(cfg: PretrainConfig, warmups: list[Path]) -> list[str]:
    out = []
    if any(s.startswith(DEMO) for s in strings(asdict(cfg))):
        out.append("demo")
    weights = (cfg.model.get("fast_rcnn") or {}).get("weights")
    if weights and not Path(weights).is_file():
        warmup = warmup_for(weights, warmups)
        if warmup is None:
            raise ConfigError(f"model.fast_rcnn.weights: {weights} not found, and no warm-up config ({WARMUPS}) "
                              f"writes it")
        out.append(f"warmup {warmup}")
    if str(FEATURES) in cfg.data.caption_shards:
        manifest, source = FEATURES / "manifest.json", CAPTIONS / "manifest.json"
        if not manifest.is_file() or not source.is_file() or source.stat().st_mtime > manifest.stat().st_mtime:
            out.append(f"features {CAPTIONS}/*.tar {FEATURES}")
    return out


def main(argv: list[str] | None = None) -> int:
    task = PretrainTask()
    parser = command_line(task)  # pretraining's own: whatever the run accepts, this accepts
    parser.description, parser.epilog = __doc__.split("\n\n")[0], __doc__
    args = parser.parse_intermixed_args(argv)
    cfg = load_config(task.config_cls, args.config, run_overrides(args))
    for step in steps(cfg, sorted(Path().glob(WARMUPS))):
        print(step)
    return 0


if __name__ == "__main__":
    sys.exit(entry_point(main))
